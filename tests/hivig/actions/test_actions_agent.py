"""Tolerant reading of live agent output (parse_agent_output) on real-looking outputs."""

from __future__ import annotations

import pytest

from hivig.actions import (
    ActionError,
    Click,
    ElementAction,
    Key,
    LeftClick,
    LongPress,
    Scroll,
    Swipe,
    Terminate,
    Type,
    Wait,
    detect_format,
    parse_agent_output,
    parse_osworld,
    parse_scalecua,
    parse_tool_calls,
)

W, H = 1920, 1080


def osw(text, **kw):
    return parse_agent_output(text, "osworld", width=W, height=H, **kw)


# ---------------------------------------------------------------------------------------------
# OSWorld pyautogui code


def test_osworld_fenced_code_with_imports_comments_thought_block_and_sleep():
    text = (
        "```python\n"
        "import pyautogui\nimport time\n"
        '"""\nThought: the OK button is in the centre.\n"""\n'
        "pyautogui.click(960, 540)  # press OK\n"
        "time.sleep(0.5)\n"
        "```"
    )
    assert osw(text) == [LeftClick((500, 500)), Wait(0.5)]
    # The strict parser refuses the same code (fence, thought string).
    assert isinstance(parse_osworld(text, W, H), ActionError)


def test_osworld_semicolons_specials_and_pyautogui_sleep():
    assert osw("pyautogui.hotkey('ctrl', 's'); pyautogui.sleep(1); DONE") == [
        Key(("ctrl", "s")),
        Wait(1),
        Terminate("success"),
    ]
    assert osw("  WAIT \n") == [Wait(3)]
    assert osw("FAIL") == [Terminate("failure")]


def test_osworld_unescaped_typewrite_quote_is_repaired():
    assert osw("pyautogui.typewrite('it's done', interval=0.05)") == [Type("it's done")]
    assert osw('pyautogui.write("say "hi" now")') == [Type('say "hi" now')]


def test_osworld_quote_repair_stays_within_one_statement():
    # The following statement stays a statement; it never becomes typed text.
    assert osw("pyautogui.typewrite('Don't stop'); pyautogui.press('enter')") == [
        Type("Don't stop"),
        Key(("enter",)),
    ]
    assert osw("pyautogui.typewrite('a', interval=0.05); pyautogui.typewrite('it's')") == [
        Type("a"),
        Type("it's"),
    ]


def test_osworld_quote_repair_gives_up_on_text_holding_code():
    got = osw("pyautogui.typewrite('it's'); pyautogui.click(1, 2) x')")
    assert isinstance(got, ActionError)


def test_wheel_scroll_counts_clicks_the_same_in_osworld_and_scalecua():
    want = [Scroll(-500)]
    assert osw("pyautogui.scroll(-5)") == want
    assert (
        parse_agent_output("<action>\nscroll(clicks=-5)\n</action>", "scalecua", width=W, height=H)
        == want
    )
    assert parse_agent_output("pyautogui.scroll(clicks=-5)", "scalecua", width=W, height=H) == want


def test_osworld_other_coordinate_spaces():
    assert osw("pyautogui.click(0.5, 0.25)", coord_space="norm01") == [LeftClick((500, 250))]
    assert osw("pyautogui.click(999, 0)", coord_space="norm999") == [LeftClick((1000, 0))]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("subprocess.run(['rm', '-rf', '/'])", "unsupported_action"),
        ("pyautogui.click(5000, 10)", "coordinate_out_of_range"),
        ("click the OK button", "bad_syntax"),
        ("import pyautogui", "empty"),
        ("   ", "empty"),
    ],
)
def test_osworld_unreadable_stays_an_error(code, reason):
    got = osw(code)
    assert isinstance(got, ActionError) and got.reason == reason


# ---------------------------------------------------------------------------------------------
# ScaleCUA agents


def test_scalecua_prefixes_combos_and_status_synonyms():
    text = (
        "<think>Save the file.</think>\n<operation>Press save</operation>\n<action>\n"
        "pyautogui.click(x=100, y=200)\n"
        'key("ctrl+s")\n'
        'terminate(status="completed")\n'
        "</action>"
    )
    got = parse_agent_output(
        text, "scalecua", width=W, height=H, coord_space="resized_px", frame=(1000, 500)
    )
    assert got == [LeftClick((100, 400)), Key(("ctrl", "s")), Terminate("success")]
    assert isinstance(parse_scalecua(text, "ubuntu", 1000, 500, "pixel"), ActionError)


def test_scalecua_positional_hotkey_combo_is_split():
    for text in ("pyautogui.hotkey('ctrl+s')", "hotkey('ctrl+s')", "hotkey('ctrl', 's')"):
        assert parse_agent_output(text, "scalecua", width=W, height=H) == [Key(("ctrl", "s"))]


def test_scalecua_mobile_prefix_on_android():
    text = (
        "mobile.swipe(from_coord=[0.5, 0.8], to_coord=[0.5, 0.2])\nmobile.long_press(x=0.3, y=0.4)"
    )
    got = parse_agent_output(text, "scalecua", platform="android", width=1080, height=2400)
    assert got == [Swipe((500, 800), (500, 200)), LongPress((300, 400), 1)]


def test_scalecua_prose_in_press_stays_a_bad_key():
    got = parse_agent_output('press(keys="open the + menu")', "scalecua", width=W, height=H)
    assert isinstance(got, ActionError) and got.reason == "bad_key"


def test_scalecua_unknown_status_stays_an_error():
    got = parse_agent_output('terminate(status="maybe")', "scalecua", width=W, height=H)
    assert isinstance(got, ActionError) and got.reason == "bad_argument"


# ---------------------------------------------------------------------------------------------
# Qwen3-VL tool calls


CALL = '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 300]}}'


@pytest.mark.parametrize(
    "text",
    [
        f"Thought: click it.\nAction: <tool_call>\n{CALL}\n</tool_call>",
        f"<tool_call>\n{{{CALL}\n</tool_call>",  # doubled opening brace
        f"<tool_call>\n{{{CALL}}}\n</tool_call>",  # doubled braces both sides
        f"Thought: x\n<tool_call>\n</tool_call>\n{CALL}",  # JSON after the closing tag
        f"I will click the button. {CALL}",  # no tags at all
        f"<tool_call>\n{CALL}",  # never closed
    ],
)
def test_qwen_common_slips(text):
    assert parse_agent_output(text, "qwen", width=W, height=H) == [LeftClick((500, 300))]


@pytest.mark.parametrize(
    "thought",
    [
        'I previously did {"action": "type", "text": "hello"}. Now click.',
        'The schema is {"name": "computer_use", "arguments": {"action": "key", "keys": ["a"]}}.',
    ],
)
def test_qwen_json_in_the_thought_is_not_a_call_when_blocks_exist(thought):
    for block in (f"{{{CALL}", f"{{{CALL}}}", CALL):  # doubled brace, both sides, clean
        text = f"Thought: {thought}\n<tool_call>\n{block}\n</tool_call>"
        assert parse_agent_output(text, "qwen", width=W, height=H) == [LeftClick((500, 300))]


def test_qwen_unreadable_block_is_not_replaced_by_json_from_the_thought():
    text = (
        'Thought: {"action": "type", "text": "hello"}\n<tool_call>\n{{{"name": broken\n</tool_call>'
    )
    got = parse_agent_output(text, "qwen", width=W, height=H)
    assert isinstance(got, ActionError)


def test_qwen_strict_parser_still_rejects_slips():
    assert isinstance(parse_tool_calls(f"<tool_call>\n{{{CALL}\n</tool_call>"), ActionError)


def test_qwen_pixel_coordinates_are_converted_in_their_space():
    text = CALL.replace("[500, 300]", "[1440, 540]")
    assert parse_agent_output(text, "qwen", width=W, height=H, coord_space="screen_px") == [
        LeftClick((750, 500))
    ]
    # On the 0-1000 grid the same numbers are off screen: an error, never silently clamped.
    got = parse_agent_output(text, "qwen", width=W, height=H)
    assert isinstance(got, ActionError) and got.reason == "coordinate_out_of_range"


def test_qwen_several_calls_and_arguments_as_string():
    text = (
        '<tool_call>{"name": "computer_use", "arguments": "{\\"action\\": \\"scroll\\", '
        '\\"pixels\\": -300}"}</tool_call>\n<tool_call>{"name": "computer_use", "arguments": '
        '{"action": "terminate", "status": "success"}}</tool_call>'
    )
    assert parse_agent_output(text, "qwen", width=W, height=H) == [
        Scroll(-300),
        Terminate("success"),
    ]


def test_qwen_no_call_is_an_error():
    got = parse_agent_output("I am not sure what to do.", "qwen", width=W, height=H)
    assert isinstance(got, ActionError) and got.reason == "no_tool_call"


# ---------------------------------------------------------------------------------------------
# AndroidWorld


def test_androidworld_reason_action_text_and_dataclass_dicts():
    text = 'Reason: the app icon is there.\nAction: {"action_type": "click", "x": 540, "y": 1200}'
    kw = {"platform": "android", "width": 1080, "height": 2400}
    assert parse_agent_output(text, "androidworld", **kw) == [Click((500, 500))]
    as_dataclass = {"action_type": "open_app", "app_name": "Clock", "x": None, "index": None}
    assert parse_agent_output(as_dataclass, "androidworld", **kw)[0].text == "Clock"
    by_index = {"action_type": "click", "index": 3}
    got = parse_agent_output(by_index, "androidworld", **kw)
    assert got == [ElementAction("click", 3)]  # the point comes from the element list only


# ---------------------------------------------------------------------------------------------
# Format detection and argument checks


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        (f"<tool_call>{CALL}</tool_call>", "qwen"),
        ('{"action_type": "click", "x": 1, "y": 2}', "androidworld"),
        ("<action>\nclick(x=0.5, y=0.5)\n</action>", "scalecua"),
        ("mobile.long_press(x=0.1, y=0.2)", "scalecua"),
        ("import pyautogui\npyautogui.click(1, 2)", "osworld"),
        ("DONE", "osworld"),
        ("click(x=0.5, y=0.5)", "scalecua"),
    ],
)
def test_detect_format(text, fmt):
    assert detect_format(text) == fmt


def test_auto_format_reads_each_style():
    assert parse_agent_output("pyautogui.click(960, 540)", width=W, height=H) == [
        LeftClick((500, 500))
    ]
    assert parse_agent_output(f"<tool_call>{CALL}</tool_call>", width=W, height=H) == [
        LeftClick((500, 300))
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fmt": "uitars"},
        {"coord_space": "inches"},
        {"coord_space": "resized_px"},  # no frame
        {"platform": "amiga"},
    ],
)
def test_bad_arguments_are_errors_not_exceptions(kwargs):
    fmt = kwargs.pop("fmt", "osworld")
    got = parse_agent_output("pyautogui.click(1, 2)", fmt, width=W, height=H, **kwargs)
    assert isinstance(got, ActionError)


def test_hostile_inputs_never_raise():
    for text in ["{" * 5000, '{"a": "' * 2000, "<tool_call>" * 3000, "\x00", "(" * 200]:
        for fmt in ("qwen", "osworld", "scalecua", "androidworld", "auto"):
            got = parse_agent_output(text, fmt, width=W, height=H)
            assert isinstance(got, (list, ActionError))
