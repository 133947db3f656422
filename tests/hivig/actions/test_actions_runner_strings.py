"""What the paper's runners emit, through the front door and through the gateway.

Each string class is written as the upstream agent loop writes it: AndroidWorld M3A/T3A answers
(Python-dict style after ``Action:``), pyautogui key slips and lone key events, AndroidLab's
``<action>`` calls with free-text ``terminate`` statuses, and the WebArenaLiteV2 ``code`` list
that the environment executes (screen pixels).
"""

from __future__ import annotations

import json

import pytest

from hivig.actions import (
    ActionError,
    Answer,
    Click,
    DoubleClick,
    ElementAction,
    Key,
    LeftClick,
    LeftClickDrag,
    LongPress,
    MouseMove,
    Open,
    RightClick,
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    Type,
    Wait,
    detect_format,
    is_androidworld_text,
    parse_agent_output,
)
from hivig.actions.agent import NEUTRAL_STATUS
from serve.actions import CoordinateSpace, resolve
from serve.actions import detect_format as gateway_detect_format
from serve.adapters import action_payload
from tests.fakes.gateway import ScriptedBackend, b64, gateway_client, screen, start_session

W, H = 1920, 1080
PHONE = {"platform": "android", "width": 1080, "height": 2400}


# ---------------------------------------------------------------------------------------------
# AndroidWorld M3A / T3A answers


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("Action: {'action_type': 'click', 'x': 540, 'y': 1200}", [Click((500, 500))]),
        ("Action: {'action_type': 'status', 'goal_status': 'complete'}", [Terminate("success")]),
        ("Action: {'action_type': 'status', 'goal_status': 'infeasible'}", [Terminate("failure")]),
        ("Action: {'action_type': 'answer', 'text': 'It is 5'}", [Answer("It is 5")]),
        (
            "Action: {'action_type': 'scroll', 'direction': 'down'}",
            [Swipe((500, 750), (500, 250), synthetic=True)],
        ),
        ("Action: {'action_type': 'open_app', 'app_name': 'Clock'}", [Open("Clock")]),
        ("Action: {'action_type': 'navigate_back'}", [SystemButton("Back")]),
        ("Action: {'action_type': 'navigate_home'}", [SystemButton("Home")]),
        ("Action: {'action_type': 'wait'}", [Wait(3)]),
        ("Action: {'action_type': 'keyboard_enter'}", [SystemButton("Enter")]),
    ],
)
def test_m3a_python_dict_answers(text, want):
    answer = f"Reason: the screen shows what I need.\n{text}"
    assert detect_format(answer) == "androidworld"
    assert parse_agent_output(answer, "androidworld", **PHONE) == want


def test_index_actions_carry_the_index_and_no_point():
    click = "Reason: the Save button is element 3.\nAction: {'action_type': 'click', 'index': 3}"
    assert parse_agent_output(click, "auto", **PHONE) == [ElementAction("click", 3)]
    typed = 'Action: {"action_type": "input_text", "text": "hello", "index": 5}'
    got = parse_agent_output(typed, "androidworld", **PHONE)
    assert got == [ElementAction("click", 5), Type("hello")]
    long = parse_agent_output({"action_type": "long_press", "index": 2}, "androidworld", **PHONE)
    assert long == [ElementAction("long_press", 2)]
    # The point comes from the element list only, never from the parser.
    assert long[0].at((10, 20)) == [LongPress((10, 20), 1)]
    assert ElementAction("double_tap", 1).at((1, 2)) == [Click((1, 2)), Click((1, 2))]
    with pytest.raises(ActionError):
        got[0].to_arguments()
    bad = parse_agent_output("Action: {'action_type': 'click', 'index': -1}", "auto", **PHONE)
    assert isinstance(bad, ActionError) and bad.reason == "bad_argument"


def test_unreadable_python_dict_stays_an_error():
    got = parse_agent_output("Action: {'action_type': 'click', 'x': }", "androidworld", **PHONE)
    assert isinstance(got, ActionError) and got.reason == "bad_syntax"


@pytest.mark.parametrize(
    "text",
    [
        "{'action_type': 'wait'}",
        '  {"action_type": "wait"}',
        "Reason: nothing to do yet.\nAction: {'action_type': 'wait'}",
        'Reason: wait.\nACTION:\n```json\n{"action_type": "wait"}\n```',
    ],
)
def test_androidworld_text_is_detected_by_its_object(text):
    assert is_androidworld_text(text)
    assert detect_format(text) == gateway_detect_format(text) == "androidworld"
    assert parse_agent_output(text, "auto", **PHONE) == [Wait(3)]


@pytest.mark.parametrize(
    ("text", "fmt", "typed"),
    [
        ("pyautogui.typewrite('set action_type to 3')", "osworld", "set action_type to 3"),
        ('write(message="action_type field")', "scalecua", "action_type field"),
        ("Action: type the action_type", "scalecua", None),
    ],
)
def test_text_that_only_mentions_action_type_keeps_its_format(text, fmt, typed):
    assert not is_androidworld_text(text)
    assert detect_format(text) == gateway_detect_format(text) == fmt
    if typed is not None:
        assert parse_agent_output(text, "auto", width=W, height=H) == [Type(typed)]
        got = resolve(
            {"raw": text, "format": "auto"}, "ubuntu", CoordinateSpace("screen_px", W, H), "auto"
        )
        assert got.error is None and got.actions == (Type(typed),)


# ---------------------------------------------------------------------------------------------
# Key slips and lone key events


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("press(keys='ctrl++')", [Key(("ctrl", "+"))]),
        ("pyautogui.press('ctrl+shift++')", [Key(("ctrl", "shift", "+"))]),
        ("hotkey(['cmd','a'])", [Key(("cmd", "a"))]),
        ("hotkey('cmd','a')", [Key(("cmd", "a"))]),
        ("pyautogui.hotkey(['ctrl', 'a'])", [Key(("ctrl", "a"))]),
        ("keyDown('shift')", [Key(("shift",))]),
        ("keyUp('shift')", [Key(("shift",))]),
        ("pyautogui.keyDown('ctrl')\npyautogui.press('c')", [Key(("ctrl", "c"))]),
        ("press('+')", [Key(("+",))]),
    ],
)
def test_key_strings_in_scalecua_text(text, want):
    # ScaleCUA ``<action>`` text is model text read by a tolerant parser: its key slips are
    # repaired (the adapters still send such text verbatim: see test_adapters_harness_contracts).
    assert parse_agent_output(text, "scalecua", width=W, height=H) == want


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        # pyautogui treats "ctrl+s" as one unknown key: nothing is pressed.
        ("pyautogui.press('ctrl+s')", "bad_key"),
        ("pyautogui.hotkey('ctrl+s')", "bad_key"),
        ("pyautogui.press('ctrl++')", "bad_key"),
        ("pyautogui.press('ctrl+shift++')", "bad_key"),
        # hotkey(*args) joins its arguments as strings: a list raises before any key.
        ("pyautogui.hotkey(['ctrl', 'a'])", "bad_key"),
        # A lone keyDown holds the key past the step; a lone keyUp presses nothing.
        ("pyautogui.keyDown('shift')", "unsupported_action"),
        ("pyautogui.keyUp('shift')", "unsupported_action"),
        ("pyautogui.keyDown('ctrl')\npyautogui.press('c')", "unsupported_action"),
    ],
)
def test_osworld_code_keys_are_read_as_pyautogui_presses_them(code, reason):
    for fmt in ("osworld", "auto"):
        got = parse_agent_output(code, fmt, width=W, height=H)
        assert isinstance(got, ActionError) and got.reason == reason, (fmt, got)


def test_osworld_code_keys_that_run_are_read():
    ok = {
        "pyautogui.hotkey('ctrl', 's')": [Key(("ctrl", "s"))],
        "pyautogui.hotkey('ctrl', '+')": [Key(("ctrl", "+"))],
        "pyautogui.press('enter')": [Key(("enter",))],
        "pyautogui.keyDown('ctrl')\npyautogui.press('c')\npyautogui.keyUp('ctrl')": [
            Key(("ctrl", "c"))
        ],
    }
    for code, want in ok.items():
        assert parse_agent_output(code, "osworld", width=W, height=H) == want, code


def test_a_key_held_across_a_click_is_not_invented_into_a_combo():
    got = parse_agent_output("keyDown('shift')\nclick(x=10, y=10)", "scalecua", width=W, height=H)
    assert isinstance(got, ActionError) and got.reason == "unsupported_action"
    prose = parse_agent_output("press(keys='open + menu')", "scalecua", width=W, height=H)
    assert isinstance(prose, ActionError) and prose.reason == "bad_key"


# ---------------------------------------------------------------------------------------------
# terminate with a free-text status


def _status(text: str, info: str | None = None) -> object:
    call = (
        f'terminate(status="{text}")'
        if info is None
        else f'terminate(status="{text}", info="{info}")'
    )
    return parse_agent_output(call, "scalecua", **PHONE)


@pytest.mark.parametrize(
    ("word", "status"),
    [
        ("Success", "success"),
        ("success!", "success"),
        ("Completed.", "success"),
        ("DONE", "success"),
        ("FAILURE", "failure"),
        ("failed.", "failure"),
        ("Infeasible", "failure"),
    ],
)
def test_one_word_status_any_case_or_punctuation(word, status):
    assert _status(word) == [Terminate(status)]


@pytest.mark.parametrize(
    ("sentence", "status"),
    [
        # A leading status word set off as a label decides.
        ("Done. The file was not found in Downloads, so I created it.", "success"),
        ("Failed: the contact does not exist", "failure"),
        ("Success - 5 items were deleted", "success"),
        # Anything else is never guessed at: failure words in a finished task's report, success
        # words next to a give-up, an imperative.
        ("The alarm is set; nothing failed", "success"),
        ("the task has been successfully done, cannot do more", "success"),
        ("The task is impossible because the contact does not exist", "success"),
        ("Complete the form first", "success"),
        ("The total is 42 dollars", "success"),
    ],
)
def test_sentence_status_is_neutral_unless_it_opens_with_a_status_word(sentence, status):
    # The harnesses end the task the same way whatever the text (AndroidLab: every terminate is
    # its finish; ScaleCUA's default status is success); the sentence is kept as the info.
    assert NEUTRAL_STATUS == "success"
    assert _status(sentence) == [Terminate(status, sentence)]


def test_sentence_status_keeps_the_info_and_adds_no_answer():
    got = _status("Task finished for now", info="3 alarms")
    assert got == [Terminate("success", "Task finished for now 3 alarms")]
    assert not any(isinstance(a, Answer) for a in got)
    word = parse_agent_output('terminate(status="maybe")', "scalecua", width=W, height=H)
    assert isinstance(word, ActionError) and word.reason == "bad_argument"


# ---------------------------------------------------------------------------------------------
# AndroidLab <action> calls (coordinates in the smart-resized frame the policy saw)

LAB = {"platform": "android", "width": 1440, "height": 3120}
LAB_FRAME = {"coord_space": "resized_px", "frame": (980, 2128)}


@pytest.mark.parametrize(
    ("call", "want"),
    [
        ("click(x=490, y=1064)", [Click((500, 500))]),
        ("long_press(x=490, y=1064, duration=1)", [LongPress((500, 500), 1)]),
        ("swipe(from_coord=[490, 1596], to_coord=[490, 532])", [Swipe((500, 750), (500, 250))]),
        ('swipe(direction="up", amount=0.5)', [Swipe((500, 750), (500, 250), synthetic=True)]),
        ('write(message="hello")', [Type("hello")]),
        ('open_app(app_name="Clock")', [Open("Clock")]),
        ("navigate_home()", [SystemButton("Home")]),
        ("navigate_back()", [SystemButton("Back")]),
        ("enter()", [SystemButton("Enter")]),
        ("wait(seconds=2)", [Wait(2)]),
        ('terminate(status="success", info="5 items")', [Terminate("success", "5 items")]),
        ('terminate(status="failure")', [Terminate("failure")]),
    ],
)
def test_androidlab_calls(call, want):
    text = f"<think>Look.</think>\n<operation>Do it</operation>\n<action>{call}</action>"
    assert parse_agent_output(text, "auto", **LAB, **LAB_FRAME) == want


# ---------------------------------------------------------------------------------------------
# WebArenaLiteV2 executed code

CODE = [
    {"name": "click", "parameters": {"x": 640, "y": 360, "clicks": 1, "button": "left"}},
    {"name": "write", "parameters": {"message": "laptop"}},
    {"name": "hotkey", "parameters": {"args": ["ctrl", "a"]}},
    {"name": "press", "parameters": {"keys": ["tab", "enter"]}},
    {"name": "click", "parameters": {"x": 64, "y": 72, "clicks": 2, "button": "left"}},
    {"name": "click", "parameters": {"x": 64, "y": 72, "clicks": 1, "button": "right"}},
    {"name": "moveTo", "parameters": {"x": 128, "y": 144}},
    {"name": "dragTo", "parameters": {"x": 640, "y": 360, "button": "left"}},
    {"name": "wait", "parameters": {"seconds": 2}},
    {"name": "response", "parameters": {"answer": "42"}},
    {"name": "terminate", "parameters": {"status": "failure", "info": ""}},
]
WANT = [
    LeftClick((500, 500)),
    Type("laptop"),
    Key(("ctrl", "a")),
    Key(("tab",)),
    Key(("enter",)),
    DoubleClick((50, 100)),
    RightClick((50, 100)),
    MouseMove((100, 200)),
    LeftClickDrag((500, 500), start=(100, 200)),
    Wait(2),
    Answer("42"),
    Terminate("failure", ""),
]
WEB = {"platform": "web", "width": 1280, "height": 720}


def test_webarena_code_list_and_its_json_text():
    assert detect_format(CODE) == "webarena_code"
    assert detect_format(json.dumps(CODE)) == "webarena_code"
    assert parse_agent_output(CODE, "webarena_code", **WEB) == WANT
    assert parse_agent_output(json.dumps(CODE), "auto", **WEB) == WANT


def test_webarena_swipe_turns_the_wheel():
    # from - to = +300 px on a 720 px page: the wheel scrolls down by 300/720 of a screen.
    by_points = {"from_coord": [640, 500], "to_coord": [640, 200], "direction": "up"}
    got = parse_agent_output([{"name": "swipe", "parameters": by_points}], "auto", **WEB)
    assert got == [MouseMove((500, 694)), Scroll(-417)]
    # The agent writes (None, None) for missing points; the direction decides then.
    by_dir = {"from_coord": [None, None], "to_coord": [None, None], "direction": "down"}
    got = parse_agent_output([{"name": "swipe", "parameters": by_dir}], "auto", **WEB)
    assert got == [Scroll(500)]


@pytest.mark.parametrize(
    "params",
    [
        # web_env presses a key only when its name is in its key table exactly; it skips any
        # other, so none of these presses anything.
        {"name": "hotkey", "parameters": {"args": [["ctrl", "a"]]}},
        {"name": "hotkey", "parameters": {"args": ["ctrl+a"]}},
        {"name": "hotkey", "parameters": {"args": ["cmd", "a"]}},
        {"name": "hotkey", "parameters": {"args": []}},
        {"name": "press", "parameters": {"keys": "ctrl+s"}},
        {"name": "press", "parameters": {"keys": "ctrl++"}},
        {"name": "press", "parameters": {"keys": "Enter"}},
        {"name": "press", "parameters": {"keys": ["tab", "ctrl+s"]}},
        # Only ``keydown``/``keyup`` have a handler; a lone keydown holds the key.
        {"name": "keyDown", "parameters": {"key": "shift"}},
        {"name": "keydown", "parameters": {"key": "shift"}},
    ],
)
def test_webarena_keys_the_environment_skips_are_errors(params):
    got = parse_agent_output([params], "webarena_code", **WEB)
    assert isinstance(got, ActionError), got
    assert got.reason in ("bad_key", "bad_argument", "unsupported_action")
    payload = action_payload([params], "webarena_code", platform="web", screen=(1280, 720))
    assert payload["format"] == "webarena_code" and json.loads(payload["raw"]) == [params]


def test_webarena_keys_that_run_are_read():
    code = [
        {"name": "hotkey", "parameters": {"args": ["ctrl", "+"]}},
        {"name": "press", "parameters": {"keys": "+"}},
        {"name": "keydown", "parameters": {"key": "shift"}},
        {"name": "keyup", "parameters": {"key": "shift"}},
    ]
    assert parse_agent_output(code, "webarena_code", **WEB) == [
        Key(("ctrl", "+")),
        Key(("+",)),
        Key(("shift",)),
    ]


def test_webarena_unknown_or_broken_code_is_an_error():
    for code in ([{"name": "teleport", "parameters": {}}], [{"parameters": {}}], "[]", "[{"):
        got = parse_agent_output(code, "webarena_code", **WEB)
        assert isinstance(got, ActionError), code


# ---------------------------------------------------------------------------------------------
# Through the gateway: what the critique prompt shows


def _critique_text(tmp_path, raw, fmt, extra=None, **session):
    backend = ScriptedBackend()
    with gateway_client(tmp_path, backend) as c:
        sid = start_session(c, **session)
        size = session.get("screen", {"w": 320, "h": 200})
        shot = b64(screen(size["w"], size["h"]))
        r = c.post(f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": shot})
        assert r.status_code == 200, r.text
        body = {"step_idx": 0, "action": {"raw": raw, "format": fmt, **(extra or {})}}
        r = c.post(f"/v1/sessions/{sid}/critique", json=body)
        v = r.json() if r.status_code == 200 else r
        if r.status_code != 200:
            return v, None
    prompt = [m for kind, m in backend.calls if kind == "critique"][-1][-1].text()
    return v, prompt


PHONE_SESSION = {"platform": "android", "screen": {"w": 200, "h": 400}}


def test_gateway_m3a_answers(tmp_path):
    raw = "Reason: open it.\nAction: {'action_type': 'open_app', 'app_name': 'Clock'}"
    v, prompt = _critique_text(tmp_path / "a", raw, "androidworld", **PHONE_SESSION)
    assert v["parse_error"] is None
    assert '"action": "open", "text": "Clock"' in prompt
    # An index action is judged as written, without a marker and without a made-up point.
    raw = "Reason: element 3.\nAction: {'action_type': 'click', 'index': 3}"
    v, prompt = _critique_text(tmp_path / "b", raw, "auto", **PHONE_SESSION)
    assert v["marker"] is None and v["parse_error"].startswith("missing_coordinate")
    assert "{'action_type': 'click', 'index': 3}" in prompt
    assert '"coordinate"' not in prompt.split("Current Proposed Step")[-1]


def test_gateway_key_and_terminate_strings(tmp_path):
    v, prompt = _critique_text(tmp_path / "a", "press(keys='ctrl++')", "scalecua")
    assert v["parse_error"] is None and '"keys": ["ctrl", "+"]' in prompt
    # Executed pyautogui code: a combo pyautogui would not press is judged as written.
    for i, code in enumerate(("pyautogui.keyUp('shift')", "pyautogui.press('ctrl+s')")):
        v, prompt = _critique_text(tmp_path / f"b{i}", code, "osworld")
        assert v["parse_error"] and v["marker"] is None, code
        assert code in prompt and '"keys": ["ctrl", "s"]' not in prompt
    report = "The total is 42 dollars"
    v, prompt = _critique_text(tmp_path / "c", f'terminate(status="{report}")', "scalecua")
    assert v["parse_error"] is None
    assert '"action": "answer"' not in prompt
    assert '"action": "terminate", "status": "success"' in prompt


def test_gateway_androidlab_and_webarena_code(tmp_path):
    lab = "<operation>Press enter</operation>\n<action>enter()</action>"
    v, prompt = _critique_text(tmp_path / "a", lab, "scalecua", **PHONE_SESSION)
    assert v["parse_error"] is None and '"action": "system_button", "button": "Enter"' in prompt
    code = json.dumps([{"name": "click", "parameters": {"x": 160, "y": 100}}])
    v, prompt = _critique_text(tmp_path / "b", code, "webarena_code", platform="web")
    assert v["parse_error"] is None and v["marker"]["x_1000"] == 500
    assert '"action": "left_click", "coordinate": [500, 500]' in prompt
    v, prompt = _critique_text(tmp_path / "c", code, "auto", platform="web")
    assert v["marker"]["y_1000"] == 500


def test_gateway_verbatim_text_is_read_strictly(tmp_path):
    # The runner executes the text as written: a call that reads only after a repair (a
    # ``pyautogui.`` prefix on a ScaleCUA call) is judged as written, without a marker.
    raw = "pyautogui.click(x=160, y=100)"
    v, prompt = _critique_text(tmp_path / "a", raw, "scalecua")
    assert v["parse_error"] is None and v["marker"] is not None  # the tolerant reading
    v, prompt = _critique_text(tmp_path / "b", raw, "scalecua", {"verbatim": True})
    assert v["marker"] is None and v["parse_error"]
    assert raw in prompt
    r, _ = _critique_text(tmp_path / "c", raw, "scalecua", {"verbatim": "yes"})
    assert r.status_code == 422 and "verbatim" in r.text
