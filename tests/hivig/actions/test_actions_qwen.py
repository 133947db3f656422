"""Action model JSON form, Qwen3-VL tool calls, OSWorld code, rendering, marks and tool specs."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hivig.actions import (
    ACTION_NAMES,
    MAX_SECONDS,
    UNMARKED_DRAG,
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
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    TripleClick,
    Type,
    Wait,
    action_from_arguments,
    action_space,
    marks_for_actions,
    parse_androidworld,
    parse_osworld,
    parse_tool_calls,
    render_tool_calls,
    space_for_platform,
)
from hivig.messages import ArrowMark, PointMark

COMPUTER_ACTIONS = [
    Key(("ctrl", "c")),
    Type('héllo 世界 "q" \\ n'),
    MouseMove((1, 2)),
    LeftClick((0, 1000)),
    RightClick((3, 4)),
    MiddleClick((5, 6)),
    DoubleClick((7, 8)),
    TripleClick((9, 10)),
    LeftClickDrag((11, 12)),
    Scroll(-300),
    Scroll(200, coordinate=(500, 500)),
    HScroll(500),
    Wait(2),
    Wait(0.5),
    Terminate("success"),
    Terminate("failure"),
    Answer("42"),
]
MOBILE_ACTIONS = [
    MobileKey("volume_up"),
    Click((447, 81)),
    LongPress((1, 2), 3),
    Swipe((500, 750), (500, 250)),
    Type("abc"),
    SystemButton("Back"),
    SystemButton("Home"),
    SystemButton("Menu"),
    SystemButton("Enter"),
    Open("Clock"),
    Wait(1),
    Answer("done"),
    Terminate("failure"),
]


def test_every_qwen_action_is_covered():
    assert {a.action for a in COMPUTER_ACTIONS} == set(ACTION_NAMES["computer_use"])
    assert {a.action for a in MOBILE_ACTIONS} == set(ACTION_NAMES["mobile_use"])
    assert len(ACTION_NAMES["computer_use"]) == 14 and len(ACTION_NAMES["mobile_use"]) == 10


def test_to_arguments_is_exactly_the_qwen_object():
    assert LeftClick((447, 81)).to_arguments() == {"action": "left_click", "coordinate": [447, 81]}
    assert Key(("enter",)).to_arguments() == {"action": "key", "keys": ["enter"]}
    assert MobileKey("home").to_arguments() == {"action": "key", "text": "home"}
    assert Swipe((1, 2), (3, 4), synthetic=True).to_arguments() == {
        "action": "swipe",
        "coordinate": [1, 2],
        "coordinate2": [3, 4],
    }
    drag = LeftClickDrag((5, 6), start=(1, 1))
    assert drag.to_arguments() == {"action": "left_click_drag", "coordinate": [5, 6]}
    assert Terminate("failure", "info").to_arguments() == {
        "action": "terminate",
        "status": "failure",
    }
    assert LongPress((1, 2), 3).to_arguments() == {
        "action": "long_press",
        "coordinate": [1, 2],
        "time": 3,
    }


@pytest.mark.parametrize("action", COMPUTER_ACTIONS + MOBILE_ACTIONS, ids=repr)
def test_from_arguments_inverts_to_arguments(action):
    space = "computer_use" if action in COMPUTER_ACTIONS else "mobile_use"
    assert action_from_arguments(action.to_arguments(), space) == action
    # The union (space=None) resolves too, including the two forms of "key".
    assert action_from_arguments(action.to_arguments()) == action


@pytest.mark.parametrize(
    ("obj", "space", "reason"),
    [
        ({"action": "fly"}, None, "unknown_action"),
        ({"action": "click", "coordinate": [1, 2]}, "computer_use", "unknown_action"),
        ({"action": "left_click", "coordinate": [1, 2]}, "mobile_use", "unknown_action"),
        ({"action": "left_click"}, None, "missing_argument"),
        ({"action": "left_click", "coordinate": [1]}, None, "bad_argument"),
        ({"action": "left_click", "coordinate": ["1", 2]}, None, "bad_argument"),
        ({"action": "left_click", "coordinate": [True, 2]}, None, "bad_argument"),
        ({"action": "left_click", "coordinate": [1001, 2]}, None, "coordinate_out_of_range"),
        ({"action": "left_click", "coordinate": [-1, 2]}, None, "coordinate_out_of_range"),
        ({"action": "left_click", "coordinate": [1, 2], "x": 3}, None, "bad_argument"),
        ({"action": "terminate", "status": "fail"}, None, "bad_argument"),
        ({"action": "system_button", "button": "back"}, None, "bad_argument"),
        ({"action": "key", "keys": []}, "computer_use", "bad_argument"),
        ({"action": "key", "keys": "enter"}, "computer_use", "bad_argument"),
        ({"action": "scroll", "pixels": 1.5}, None, "bad_argument"),
        ({"action": "wait", "time": -1}, None, "bad_argument"),
        ({"action": "type", "text": None}, None, "bad_argument"),
        (["left_click"], None, "bad_argument"),
        ({"action": "click", "coordinate": [1, 2]}, "desktop_use", "unknown_action"),
    ],
)
def test_from_arguments_errors(obj, space, reason):
    out = action_from_arguments(obj, space)
    assert isinstance(out, ActionError) and out.reason == reason, out


def test_space_for_platform():
    assert [space_for_platform(p) for p in ("windows", "mac", "ubuntu", "web")] == [
        "computer_use"
    ] * 4
    assert space_for_platform("android") == "mobile_use"
    with pytest.raises(ActionError):
        space_for_platform("ios")


# --- Qwen tool calls -----------------------------------------------------------------------------


def test_parse_tool_calls_with_surrounding_text_and_order():
    text = (
        "<think>the search bar is at the top</think>\nThought: tap it.\n"
        'Action: "Tap the search bar"\n'
        '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "click", '
        '"coordinate": [447, 81]}}\n</tool_call>\n'
        '<TOOL_CALL>{"name": "mobile_use", "arguments": {"action": "type", "text": "Musk"}}'
        "</Tool_Call> trailing prose"
    )
    assert parse_tool_calls(text) == [Click((447, 81)), Type("Musk")]


def test_parse_tool_calls_accepts_string_arguments():
    inner = json.dumps({"action": "wait", "time": 1})
    text = "<tool_call>" + json.dumps({"name": "computer_use", "arguments": inner}) + "</tool_call>"
    assert parse_tool_calls(text) == [Wait(1)]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("no call here", "no_tool_call"),
        ("<tool_call>{'name': 'computer_use', 'arguments': {}}</tool_call>", "bad_syntax"),
        (
            '<tool_call>{"name": "computer_use", "arguments": {"action": "terminate", '
            '"status": True}}</tool_call>',
            "bad_syntax",
        ),
        (
            '<tool_call>{"name": "computer_use", "arguments": {"action": "scroll", '
            '"pixels": NaN}}</tool_call>',
            "bad_syntax",
        ),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "wait"', "bad_syntax"),
        (
            '<tool_call>{"name": "browser", "arguments": {"action": "wait"}}</tool_call>',
            "unknown_action",
        ),
        ('<tool_call>{"arguments": {"action": "wait"}}</tool_call>', "bad_syntax"),
        ("<tool_call>[1, 2]</tool_call>", "bad_syntax"),
        # One parameter bound twice: json.loads would keep the last silently.
        (
            '<tool_call>{"name": "computer_use", "arguments": {"action": "left_click", '
            '"coordinate": [1, 2], "coordinate": [3, 4]}}</tool_call>',
            "bad_argument",
        ),
        (
            '<tool_call>{"name": "computer_use", "name": "mobile_use", "arguments": '
            '{"action": "wait", "time": 1}}</tool_call>',
            "bad_argument",
        ),
        (
            '<tool_call>{"name": "computer_use", "arguments": {"action": "wait", '
            '"time": 1e14}}</tool_call>',
            "bad_argument",
        ),
        (
            '<tool_call>{"name": "mobile_use", "arguments": {"action": "long_press", '
            '"coordinate": [1, 2], "time": 3600.5}}</tool_call>',
            "bad_argument",
        ),
        ("<tool_call>" * 3, "bad_syntax"),
        ("</tool_call><tool_call>", "bad_syntax"),
        (
            '<tool_call>{"name": "computer_use", "arguments": {"action": "wait", "time": 1}}'
            "<tool_call></tool_call>",
            "bad_syntax",
        ),
        (
            '<tool_call>{"name": "mobile_use", "arguments": {"action": "left_click", '
            '"coordinate": [1, 2]}}</tool_call>',
            "unknown_action",
        ),
    ],
)
def test_parse_tool_calls_errors(text, reason):
    out = parse_tool_calls(text)
    assert isinstance(out, ActionError) and out.reason == reason, out


def test_stray_close_tags_are_ignored_and_durations_up_to_the_bound_kept():
    call = (
        '<tool_call>{"name": "computer_use", "arguments": {"action": "wait", '
        f'"time": {MAX_SECONDS}}}}}</tool_call>'
    )
    assert parse_tool_calls("</tool_call>" + call + "</TOOL_CALL>") == [Wait(MAX_SECONDS)]
    assert action_from_arguments({"action": "wait", "time": MAX_SECONDS + 1}).reason == (
        "bad_argument"
    )


def test_strict_json_negative_control():
    # The same call with JSON literals parses: the rejection above is about Python syntax only.
    good = (
        '<tool_call>{"name": "computer_use", "arguments": {"action": "terminate", '
        '"status": "success"}}</tool_call>'
    )
    assert parse_tool_calls(good) == [Terminate("success")]


def test_render_format_and_utf8():
    text = render_tool_calls([Type("héllo 世界"), Key(("enter",))], "computer_use")
    assert text == (
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "type", '
        '"text": "héllo 世界"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "key", '
        '"keys": ["enter"]}}\n</tool_call>'
    )
    assert "\\u" not in text
    assert render_tool_calls([], "computer_use") == ""


def test_render_rejects_actions_outside_the_space():
    with pytest.raises(ActionError):
        render_tool_calls([Swipe((1, 2), (3, 4))], "computer_use")
    with pytest.raises(ActionError):
        render_tool_calls([LeftClick((1, 2))], "mobile_use")


@pytest.mark.parametrize(
    ("actions", "space"),
    [(COMPUTER_ACTIONS, "computer_use"), (MOBILE_ACTIONS, "mobile_use")],
)
def test_round_trip_render_parse(actions, space):
    assert parse_tool_calls(render_tool_calls(actions, space)) == actions


# --- OSWorld -------------------------------------------------------------------------------------


def test_osworld_calls():
    code = (
        "import pyautogui\nimport time\n"
        "pyautogui.click(960, 540)\n"
        "pyautogui.moveTo(x=192, y=108); pyautogui.dragTo(1728, 972, duration=0.5)\n"
        "pyautogui.doubleClick(x=0, y=0)\n"
        "pyautogui.rightClick((1920, 1080))\n"
        "pyautogui.typewrite('hello', interval=0.05)\n"
        "pyautogui.write('Grüße')\n"
        "pyautogui.press('enter')\n"
        "pyautogui.hotkey('ctrl', 'shift', 't')\n"
        "pyautogui.scroll(-5)\n"
        "pyautogui.hscroll(3, x=960, y=540)\n"
        "time.sleep(1.5)\n"
    )
    assert parse_osworld(code, 1920, 1080) == [
        LeftClick((500, 500)),
        MouseMove((100, 100)),
        LeftClickDrag((900, 900), start=(100, 100)),
        DoubleClick((0, 0)),
        RightClick((1000, 1000)),
        Type("hello"),
        Type("Grüße"),
        Key(("enter",)),
        Key(("ctrl", "shift", "t")),
        Scroll(-5),
        MouseMove((500, 500)),
        HScroll(3),
        Wait(1.5),
    ]


def test_osworld_special_strings_and_key_folding():
    assert parse_osworld("WAIT", 1920, 1080) == [Wait(3)]
    assert parse_osworld(" DONE\n", 1920, 1080) == [Terminate("success")]
    assert parse_osworld("FAIL", 1920, 1080) == [Terminate("failure")]
    code = "pyautogui.keyDown('ctrl')\npyautogui.press('a')\npyautogui.keyUp('ctrl')"
    assert parse_osworld(code, 1920, 1080) == [Key(("ctrl", "a"))]
    assert parse_osworld("pyautogui.scroll(-5)", 10, 10, pixels_per_click=100) == [Scroll(-500)]
    assert parse_osworld("pyautogui.tripleClick(10, 10)", 1000, 1000) == [TripleClick((10, 10))]
    assert parse_osworld("pyautogui.middleClick(10, 10)", 1000, 1000) == [MiddleClick((10, 10))]
    assert parse_osworld("pyautogui.typewrite(['a', 'enter'])", 10, 10) == [
        Key(("a",)),
        Key(("enter",)),
    ]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("", "empty"),
        ("import pyautogui", "empty"),
        ("pyautogui.click(", "bad_syntax"),
        ("os.system('rm -rf /')", "unsupported_action"),
        ("x = pyautogui.position()", "unsupported_action"),
        ("for i in range(3): pyautogui.press('a')", "unsupported_action"),
        ("pyautogui.screenshot()", "unsupported_action"),
        ("pyautogui.click(2500, 10)", "coordinate_out_of_range"),
        ("pyautogui.press('open the menu')", "bad_key"),
        ("pyautogui.click(x=1, y=2, bogus=3)", "bad_argument"),
        ("pyautogui.hotkey('ctrl', keys=['c'])", "bad_argument"),
        ("pyautogui.hotkey('ctrl', 'c', bogus=1)", "bad_argument"),
        ("pyautogui.hotkey()", "missing_argument"),
        ("pyautogui.click((1, 2), x=3)", "bad_argument"),
        ("time.sleep(1, seconds=2)", "bad_argument"),
        ("time.sleep(1e14)", "bad_argument"),
        ("time.sleep(3601)", "bad_argument"),
        ("pyautogui.click(x=open('f'), y=2)", "bad_argument"),
        ("done", "unsupported_action"),
    ],
)
def test_osworld_errors(code, reason):
    out = parse_osworld(code, 1920, 1080)
    assert isinstance(out, ActionError) and out.reason == reason, out


def test_osworld_hotkey_forms():
    assert parse_osworld("pyautogui.hotkey('ctrl', 'c', interval=0.1)", 10, 10) == [
        Key(("ctrl", "c"))
    ]
    assert parse_osworld("pyautogui.hotkey(keys=['ctrl', 'c'])", 10, 10) == [Key(("ctrl", "c"))]
    assert parse_osworld(f"time.sleep({MAX_SECONDS})", 10, 10) == [Wait(MAX_SECONDS)]


@pytest.mark.parametrize(
    ("code", "quoted"),
    [
        ("pyautogui.write('é'); pyautogui.fly(1)", "pyautogui.fly(1)"),
        ("import os\r\npyautogui.click(1, 2)\r\npyautogui.fly(\n  2)", "pyautogui.fly(\n  2)"),
        ("pyautogui.write('日本'); x = 1", "x = 1"),
        ("pyautogui.fly(\n'é',\n3)", "pyautogui.fly(\n'é',\n3)"),
        ("pass\rpyautogui.fly(\r\n'é',\r3)", "pyautogui.fly(\r\n'é',\r3)"),
    ],
)
def test_osworld_errors_quote_the_exact_statement(code, quoted):
    out = parse_osworld(code, 1920, 1080)
    assert isinstance(out, ActionError), out
    assert repr(quoted) in out.message, out.message


# --- marks and tool spec -------------------------------------------------------------------------


def test_marks_for_points_drags_and_swipes():
    actions = [
        MouseMove((100, 200)),
        LeftClickDrag((500, 600)),
        LeftClick((7, 8)),
        Swipe((500, 750), (500, 250)),
        LongPress((3, 4), 1),
        Type("x"),
        Scroll(-300),
    ]
    assert marks_for_actions(actions) == [
        PointMark(100, 200),
        ArrowMark(100, 200, 500, 600),
        PointMark(7, 8),
        ArrowMark(500, 750, 500, 250),
        PointMark(3, 4),
    ]


def test_drag_marks_prefer_start_and_skip_unknown_start():
    assert marks_for_actions([LeftClickDrag((5, 6), start=(1, 2))]) == [ArrowMark(1, 2, 5, 6)]
    assert marks_for_actions([LeftClickDrag((5, 6))]) == []  # no start known: no arrow
    assert marks_for_actions([Type("x"), Key(("a",))]) == []
    # Explicit start metadata wins over the tracked pointer.
    moved = [MouseMove((1, 1)), LeftClickDrag((5, 6), start=(3, 3))]
    assert marks_for_actions(moved)[-1] == ArrowMark(3, 3, 5, 6)


@pytest.mark.parametrize(
    ("actions", "start"),
    [
        ([LeftClick((200, 300))], (200, 300)),
        ([MouseMove((100, 100)), LeftClick((200, 300))], (200, 300)),
        ([DoubleClick((200, 300))], (200, 300)),
        ([RightClick((1, 1)), MiddleClick((200, 300))], (200, 300)),
        ([TripleClick((200, 300)), Key(("a",)), Type("x")], (200, 300)),
        ([MouseMove((1, 1)), LeftClickDrag((200, 300))], (200, 300)),
        ([MouseMove((1, 1)), Scroll(-3, coordinate=(200, 300))], (200, 300)),
        ([HScroll(3, coordinate=(200, 300))], (200, 300)),
    ],
)
def test_drag_arrow_starts_at_the_tracked_pointer(actions, start):
    marks = marks_for_actions([*actions, LeftClickDrag((500, 600))])
    assert marks[-1] == ArrowMark(*start, 500, 600)


def test_drag_arrow_uses_the_pointer_from_before_the_step():
    drag = [LeftClickDrag((500, 600))]
    assert marks_for_actions(drag, pointer=(7, 8)) == [ArrowMark(7, 8, 500, 600)]
    # Pointer-less actions (a scroll without position) leave the previous pointer in place.
    assert marks_for_actions([Scroll(-3), *drag], pointer=(7, 8)) == [ArrowMark(7, 8, 500, 600)]


def test_unmarkable_drags_are_counted():
    stats: Counter[str] = Counter()
    actions = [LeftClickDrag((5, 6)), LeftClickDrag((7, 8)), LeftClick((1, 1))]
    marks = marks_for_actions(actions, stats=stats)
    # The first drag has no start; the second starts where the first ended.
    assert marks == [ArrowMark(5, 6, 7, 8), PointMark(1, 1)]
    assert stats == {UNMARKED_DRAG: 1}
    plain: dict[str, int] = {}
    marks_for_actions([LeftClickDrag((5, 6))], stats=plain)
    assert plain == {UNMARKED_DRAG: 1}
    none: dict[str, int] = {}
    marks_for_actions([MouseMove((1, 1)), LeftClickDrag((5, 6))], stats=none)
    assert none == {}  # negative control: a marked drag is not counted


def test_action_space_definitions():
    for space in ("computer_use", "mobile_use"):
        spec = action_space(space)
        fn = spec["function"]
        assert spec["type"] == "function" and fn["name"] == space
        assert "1000x1000" in fn["description"]
        assert fn["parameters"]["required"] == ["action"]
        enum = fn["parameters"]["properties"]["action"]["enum"]
        assert enum == list(ACTION_NAMES[space])
        assert "interact" not in enum
        json.dumps(spec)  # serialisable for prompts
    assert "coordinate2" in action_space("mobile_use")["function"]["parameters"]["properties"]
    assert "keys" in action_space("computer_use")["function"]["parameters"]["properties"]
    with pytest.raises(ActionError):
        action_space("browser_use")


# --- AndroidWorld ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ({"action_type": "click", "x": 540, "y": 1200}, [Click((500, 500))]),
        ({"action_type": "double_tap", "x": 0, "y": 0}, [Click((0, 0)), Click((0, 0))]),
        ({"action_type": "long_press", "x": 1080, "y": 2400}, [LongPress((1000, 1000), 1)]),
        (
            {"action_type": "input_text", "text": "Gym", "x": 108, "y": 240},
            [Click((100, 100)), Type("Gym")],
        ),
        ({"action_type": "input_text", "text": "Gym"}, [Type("Gym")]),
        ({"action_type": "keyboard_enter"}, [SystemButton("Enter")]),
        ({"action_type": "navigate_home"}, [SystemButton("Home")]),
        ({"action_type": "navigate_back"}, [SystemButton("Back")]),
        ({"action_type": "open_app", "app_name": "Clock"}, [Open("Clock")]),
        ({"action_type": "wait"}, [Wait(3)]),
        ({"action_type": "answer", "text": "7:30"}, [Answer("7:30")]),
        ({"action_type": "status", "goal_status": "complete"}, [Terminate("success")]),
        ({"action_type": "status", "goal_status": "infeasible"}, [Terminate("failure")]),
        # scroll names the view motion: scrolling down is a finger moving up.
        (
            {"action_type": "scroll", "direction": "down"},
            [Swipe((500, 750), (500, 250), synthetic=True)],
        ),
        (
            {"action_type": "swipe", "direction": "down"},
            [Swipe((500, 250), (500, 750), synthetic=True)],
        ),
        ('{"action_type": "click", "x": 540, "y": 1200}', [Click((500, 500))]),
    ],
)
def test_androidworld_actions(action, expected):
    assert parse_androidworld(action, 1080, 2400) == expected


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ({"action_type": "click", "index": 3}, "missing_coordinate"),
        ({"action_type": "click", "x": 5000, "y": 10}, "coordinate_out_of_range"),
        ({"action_type": "scroll", "direction": "north"}, "bad_argument"),
        ({"action_type": "status", "goal_status": "done"}, "bad_argument"),
        ({"action_type": "input_text"}, "bad_argument"),
        ({"action_type": "unknown"}, "unsupported_action"),
        ({"x": 1}, "bad_argument"),
        ("{'action_type': 'click'}", "bad_syntax"),
        ("[1]", "bad_syntax"),
        ('{"action_type": "click", "x": 1, "y": 2, "x": 900}', "bad_argument"),
    ],
)
def test_androidworld_errors(action, reason):
    out = parse_androidworld(action, 1080, 2400)
    assert isinstance(out, ActionError) and out.reason == reason, out


def test_marks_for_tool_calls_skips_only_the_broken_block():
    from hivig.actions import marks_for_tool_calls
    from hivig.messages import PointMark

    good = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [10, 20]}}\n</tool_call>'  # noqa: E501
    broken = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [30, 40]}\n</tool_call>'  # noqa: E501
    assert marks_for_tool_calls(good) == [PointMark(10, 20)]
    assert marks_for_tool_calls(broken) == []
    assert marks_for_tool_calls(broken + "\n" + good) == [PointMark(10, 20)]
    assert marks_for_tool_calls("no calls at all") == []
