"""Property tests: parsers are total, and parse -> render -> parse round-trips every action kind."""

from __future__ import annotations

import ast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hivig.actions import (
    ActionError,
    Answer,
    Click,
    DoubleClick,
    HScroll,
    Key,
    LeftClick,
    LeftClickDrag,
    LongPress,
    MiddleClick,
    MobileKey,
    MouseMove,
    Open,
    RightClick,
    ScaleCUAParse,
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    TripleClick,
    Type,
    Wait,
    action_from_arguments,
    marks_for_actions,
    normalise_calls,
    parse_androidworld,
    parse_osworld,
    parse_scalecua,
    parse_scalecua_calls,
    parse_tool_calls,
    render_tool_calls,
)
from hivig.actions.osworld import StatementSource
from hivig.actions.scalecua import SIGNATURES

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SCALECUA_SEEDS = [
    "click(x=0.5012, y=0.8735)",
    "click(x=0.2, y=0.3)\ndragTo(x=0.5, y=0.6)",
    "moveTo(x=0.1, y=0.1)\nclick(x=0.2, y=0.3)\ndragTo(x=0.5, y=0.6)",
    "dragTo(x=0.5, y=0.6)\ndragTo(x=0.7, y=0.8)",
    "write(message='Budget')\npress(keys='enter')",
    "moveTo(x=0.1, y=0.2)\ndragTo(x=0.5, y=0.6)",
    "hotkey('ctrl', 'c')",
    "press(keys='up', presses=3)",
    "scroll(clicks=-3, x=0.5, y=0.25)",
    "swipe(direction='up', amount=0.5)",
    "swipe(from_coord=[0.5, 0.8], to_coord=[0.5, 0.3])",
    "terminate(status='fail', info=None)",
    "keyDown('shift')\npress('tab')\nkeyUp('shift')",
    "long_press(x=0.5, y=0.5, duration=2)",
]
TOOL_CALL_SEEDS = [
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", '
    '"coordinate": [447, 81]}}\n</tool_call>',
    'Action: x\n<tool_call>{"name": "mobile_use", "arguments": {"action": "swipe", '
    '"coordinate": [1, 2], "coordinate2": [3, 4]}}</tool_call>',
    '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", '
    '"coordinate": [200, 300]}}</tool_call>\n<tool_call>{"name": "computer_use", '
    '"arguments": {"action": "left_click_drag", "coordinate": [500, 600]}}</tool_call>',
]
OSWORLD_SEEDS = [
    "import pyautogui\npyautogui.click(960, 540)",
    "pyautogui.moveTo(10, 10); pyautogui.dragTo(100, 100, duration=0.5)",
    "pyautogui.hotkey('ctrl', 'c')\ntime.sleep(1)",
    "pyautogui.click(10, 10)\npyautogui.dragTo(100, 100)",
    "DONE",
]
PLATFORMS = ["windows", "mac", "ubuntu", "web", "android"]
NOISE = st.text(alphabet=st.sampled_from(list("()[]{}'\",=.:_-+*0123456789 \n<>/xyabTN\\\x00é")))


@st.composite
def mutated(draw, seeds: list[str]) -> str:
    """A seed with a few random insertions, deletions or replacements."""
    text = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 4))):
        pos = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = draw(NOISE.filter(lambda s: 0 < len(s) < 4))
        if op == "insert":
            text = text[:pos] + piece + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + len(piece) :]
        else:
            text = text[:pos] + piece + text[pos + len(piece) :]
    return text


# --- totality ------------------------------------------------------------------------------------


@SETTINGS
@given(text=st.text(), platform=st.sampled_from(PLATFORMS))
def test_parse_scalecua_never_raises_on_random_text(text, platform):
    assert isinstance(parse_scalecua(text, platform, 1920, 1080), (ScaleCUAParse, ActionError))


@SETTINGS
@given(text=mutated(SCALECUA_SEEDS), platform=st.sampled_from(PLATFORMS))
def test_parse_scalecua_never_raises_on_mutations(text, platform):
    assert isinstance(parse_scalecua(text, platform, 1080, 2400), (ScaleCUAParse, ActionError))


@SETTINGS
@given(text=st.one_of(st.text(), mutated(TOOL_CALL_SEEDS)))
def test_parse_tool_calls_never_raises(text):
    out = parse_tool_calls(text)
    assert isinstance(out, (list, ActionError))


ANDROIDWORLD_SEEDS = [
    '{"action_type": "click", "x": 540, "y": 1200}',
    '{"action_type": "input_text", "text": "hi", "x": 1, "y": 2}',
    '{"action_type": "scroll", "direction": "down"}',
]


@SETTINGS
@given(
    action=st.one_of(
        st.text(),
        mutated(ANDROIDWORLD_SEEDS),
        st.dictionaries(
            st.sampled_from(["action_type", "x", "y", "text", "direction", "goal_status"]),
            st.one_of(
                st.none(), st.integers(), st.floats(), st.text(max_size=8), st.lists(st.integers())
            ),
        ),
    )
)
def test_parse_androidworld_never_raises(action):
    assert isinstance(parse_androidworld(action, 1080, 2400), (list, ActionError))


@SETTINGS
@given(code=st.one_of(st.text(), mutated(OSWORLD_SEEDS)))
def test_parse_osworld_never_raises(code):
    assert isinstance(parse_osworld(code, 1920, 1080), (list, ActionError))


@SETTINGS
@given(
    obj=st.dictionaries(
        st.sampled_from(
            [
                "action",
                "coordinate",
                "keys",
                "text",
                "pixels",
                "time",
                "status",
                "button",
                "coordinate2",
            ]
        ),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(max_size=5),
            st.lists(st.one_of(st.integers(), st.floats()), max_size=3),
            st.sampled_from(["left_click", "key", "swipe", "click"]),
        ),
    )
)
def test_action_from_arguments_never_raises(obj):
    out = action_from_arguments(obj)
    assert isinstance(out, ActionError) or out.to_arguments()["action"] == obj["action"]


@SETTINGS
@given(code=st.one_of(st.text(), mutated(OSWORLD_SEEDS)))
def test_osworld_statement_text_matches_ast(code):
    # The linear-time segment lookup quotes exactly what ast.get_source_segment would.
    try:
        body = ast.parse(code).body
    except (SyntaxError, ValueError):
        return
    source = StatementSource(code)
    for stmt in body:
        assert source.segment(stmt) == ast.get_source_segment(code, stmt)


def test_pathological_inputs():
    deep = "click(x=" + "[" * 5000 + "]" * 5000 + ")"
    assert isinstance(parse_scalecua(deep, "windows", 10, 10), ActionError)
    assert isinstance(parse_osworld("pyautogui.click(" + "(" * 5000 + ")", 10, 10), ActionError)
    nested = "<tool_call>" + "[" * 100000 + "</tool_call>"
    assert isinstance(parse_tool_calls(nested), ActionError)
    assert isinstance(parse_scalecua(None, "windows", 10, 10), ActionError)  # type: ignore[arg-type]


# --- round trips ---------------------------------------------------------------------------------

POINT = st.tuples(st.integers(0, 1000), st.integers(0, 1000))
TEXT = st.text(max_size=20)
KEYS = st.lists(st.sampled_from(["ctrl", "shift", "a", "enter", "f5", "é"]), min_size=1, max_size=3)
SECONDS = st.one_of(st.integers(0, 60), st.floats(0, 60, allow_nan=False))

COMPUTER = st.one_of(
    KEYS.map(lambda k: Key(tuple(k))),
    TEXT.map(Type),
    *(POINT.map(c) for c in (MouseMove, LeftClick, RightClick, MiddleClick, DoubleClick)),
    POINT.map(TripleClick),
    POINT.map(LeftClickDrag),
    st.integers(-5000, 5000).map(Scroll),
    st.integers(-5000, 5000).map(HScroll),
    SECONDS.map(Wait),
    st.sampled_from(["success", "failure"]).map(Terminate),
    TEXT.map(Answer),
)
MOBILE = st.one_of(
    st.sampled_from(["volume_up", "home"]).map(MobileKey),
    POINT.map(Click),
    st.builds(LongPress, POINT, SECONDS),
    st.builds(Swipe, POINT, POINT),
    TEXT.map(Type),
    st.sampled_from(["Back", "Home", "Menu", "Enter"]).map(SystemButton),
    TEXT.map(Open),
    SECONDS.map(Wait),
    st.sampled_from(["success", "failure"]).map(Terminate),
    TEXT.map(Answer),
)


@SETTINGS
@given(actions=st.lists(COMPUTER, min_size=1, max_size=5))
def test_render_parse_round_trip_computer(actions):
    assert parse_tool_calls(render_tool_calls(actions, "computer_use")) == actions


@SETTINGS
@given(actions=st.lists(MOBILE, min_size=1, max_size=5))
def test_render_parse_round_trip_mobile(actions):
    assert parse_tool_calls(render_tool_calls(actions, "mobile_use")) == actions


UNIT = st.floats(0, 1, allow_nan=False).map(lambda v: round(v, 4))
SCALECUA_CALL = st.one_of(
    st.builds("click(x={}, y={})".format, UNIT, UNIT),
    st.builds("click(x={}, y={}, clicks={})".format, UNIT, UNIT, st.integers(1, 3)),
    st.builds("rightClick({}, {})".format, UNIT, UNIT),
    st.builds("moveTo(x={}, y={})\ndragTo(x={}, y={})".format, UNIT, UNIT, UNIT, UNIT),
    st.builds("scroll(clicks={}, x={}, y={})".format, st.integers(-10, 10), UNIT, UNIT),
    st.builds(
        "swipe(direction={!r}, amount={})".format,
        st.sampled_from(["up", "down", "left", "right"]),
        UNIT,
    ),
    st.builds("write(message={!r})".format, TEXT),
    st.builds(
        "press(keys={!r}, presses={})".format, st.sampled_from(["enter", "tab"]), st.integers(1, 3)
    ),
    st.builds(
        "hotkey({!r}, {!r})".format,
        st.sampled_from(["ctrl", "alt"]),
        st.sampled_from(["c", "v", "f4"]),
    ),
    st.builds("wait(seconds={})".format, st.integers(0, 10)),
    st.builds("response(answer={!r})".format, TEXT),
    st.builds("terminate(status={!r})".format, st.sampled_from(["success", "failure", "fail"])),
)


@SETTINGS
@given(
    lines=st.lists(SCALECUA_CALL, min_size=1, max_size=4),
    platform=st.sampled_from(["windows", "web"]),
)
def test_scalecua_parse_render_parse_round_trip(lines, platform):
    parsed = parse_scalecua("\n".join(lines), platform, 1920, 1080)
    assert isinstance(parsed, ScaleCUAParse), parsed
    again = parse_tool_calls(render_tool_calls(parsed.actions, "computer_use"))
    assert [a.to_arguments() for a in again] == [a.to_arguments() for a in parsed.actions]
    # Every drag in a step that moved first gets an arrow mark.
    if any(isinstance(a, LeftClickDrag) for a in parsed.actions):
        assert any(m.__class__.__name__ == "ArrowMark" for m in marks_for_actions(parsed.actions))
    assert marks_for_actions(again) == marks_for_actions(parsed.actions)


# --- marks are the same whichever side of the render they are drawn on ---------------------------


def _space(platform: str) -> str:
    return "mobile_use" if platform == "android" else "computer_use"


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("text", SCALECUA_SEEDS)
def test_marks_survive_render_for_scalecua_seeds(text, platform):
    parsed = parse_scalecua(text, platform, 1920, 1080)
    if isinstance(parsed, ActionError):
        return  # e.g. a desktop-only call on android
    again = parse_tool_calls(render_tool_calls(parsed.actions, _space(platform)))
    assert marks_for_actions(again) == marks_for_actions(parsed.actions)


@pytest.mark.parametrize("text", TOOL_CALL_SEEDS)
def test_marks_survive_render_for_tool_call_seeds(text):
    parsed = parse_tool_calls(text)
    assert isinstance(parsed, list), parsed
    space = _space("android" if "mobile_use" in text else "windows")
    assert marks_for_actions(parse_tool_calls(render_tool_calls(parsed, space))) == (
        marks_for_actions(parsed)
    )


@pytest.mark.parametrize("code", OSWORLD_SEEDS)
def test_marks_survive_render_for_osworld_seeds(code):
    parsed = parse_osworld(code, 1920, 1080)
    assert isinstance(parsed, list), parsed
    again = parse_tool_calls(render_tool_calls(parsed, "computer_use"))
    assert marks_for_actions(again) == marks_for_actions(parsed)


@SETTINGS
@given(actions=st.lists(COMPUTER, min_size=1, max_size=6))
def test_marks_survive_render_for_any_computer_step(actions):
    again = parse_tool_calls(render_tool_calls(actions, "computer_use"))
    assert marks_for_actions(again) == marks_for_actions(actions)


@SETTINGS
@given(
    lines=st.lists(SCALECUA_CALL, min_size=1, max_size=4),
    platform=st.sampled_from(["windows", "web"]),
    pointer=st.one_of(st.none(), POINT),
)
def test_marks_survive_render_with_a_pointer_from_the_previous_step(lines, platform, pointer):
    calls = parse_scalecua_calls("\n".join(lines))
    actions = normalise_calls(calls, platform, 1920, 1080, pointer=pointer)
    assert isinstance(actions, list), actions
    again = parse_tool_calls(render_tool_calls(actions, "computer_use"))
    assert marks_for_actions(again, pointer=pointer) == marks_for_actions(actions)


@pytest.mark.parametrize(
    "text",
    [
        "click(x=0.5, y=0.5)",
        "long_press(x=0.5, y=0.5, duration=2)",
        "swipe(from_coord=[0.5, 0.8], to_coord=[0.5, 0.3])",
        "swipe(direction='down', amount=0.3)",
        "write(message='x')\npress(keys='enter')",
        "open_app(app_name='Clock')\nnavigate_back()\nnavigate_home()",
        "wait()\nresponse(answer='ok')\nterminate()",
        "press(keys='volume_up')",
    ],
)
def test_scalecua_mobile_round_trip(text):
    parsed = parse_scalecua(text, "android", 1080, 2400)
    assert isinstance(parsed, ScaleCUAParse), parsed
    again = parse_tool_calls(render_tool_calls(parsed.actions, "mobile_use"))
    assert [a.to_arguments() for a in again] == [a.to_arguments() for a in parsed.actions]


BAD_VALUES = ["[1]", "{}", "'x'", "None", "10**400", "1" + "0" * 400, "-1", "(1, 2, 3)", "[[1]]"]


@pytest.mark.parametrize("platform", ["windows", "android"])
def test_every_argument_of_every_call_tolerates_wrong_types(platform):
    # Systematic totality: each parameter of each ScaleCUA call replaced by an ill-typed value.
    for name, signature in SIGNATURES.items():
        for param, _default in signature:
            for bad in BAD_VALUES:
                text = f"{name}({param}={bad})"
                out = parse_scalecua(text, platform, 1920, 1080)
                assert isinstance(out, (ScaleCUAParse, ActionError)), text
                code = f"pyautogui.{name}({param}={bad})"
                assert isinstance(parse_osworld(code, 1920, 1080), (list, ActionError)), code


def test_error_messages_are_bounded():
    out = parse_scalecua("fly(x='" + "a" * 10000 + "')", "windows", 10, 10)
    assert isinstance(out, ActionError) and len(out.message) <= 300
