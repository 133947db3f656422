"""ScaleCUA action grammar -> typed actions: every form of the format, scale and mapping."""

from __future__ import annotations

from collections import Counter

import pytest

from hivig.actions import (
    MAX_SECONDS,
    ActionError,
    Answer,
    CallUser,
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
    RawCall,
    RightClick,
    ScaleCUAParse,
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    TripleClick,
    Type,
    Wait,
    coordinate_values,
    detect_scale,
    marks_for_actions,
    normalise_calls,
    parse_scalecua,
    parse_scalecua_calls,
    parse_tool_calls,
    render_tool_calls,
    resolve_scale,
)
from hivig.messages import ArrowMark, PointMark

W, H = 1920, 1080


def ok(text: str, platform: str = "windows", w: int = W, h: int = H, **kw) -> ScaleCUAParse:
    out = parse_scalecua(text, platform, w, h, **kw)
    assert isinstance(out, ScaleCUAParse), out
    assert_marks_survive_rendering(out.actions, platform)
    return out


def assert_marks_survive_rendering(actions: tuple, platform: str) -> None:
    """data_gen draws marks from parsed actions, serving from rendered text: they must agree."""
    if not actions or any(isinstance(a, CallUser) for a in actions):
        return  # nothing to render (call_user has no Qwen3-VL form)
    space = "mobile_use" if platform == "android" else "computer_use"
    again = parse_tool_calls(render_tool_calls(actions, space))
    assert marks_for_actions(again) == marks_for_actions(actions)


def err(text: str, platform: str = "windows", w: int = W, h: int = H, **kw) -> ActionError:
    out = parse_scalecua(text, platform, w, h, **kw)
    assert isinstance(out, ActionError), out
    return out


# --- worked examples -------------------------------------------------------


def test_example_a_android_click():
    out = ok("click(x=0.5012, y=0.8735)", "android", 1080, 2400)
    assert out.actions == (Click((501, 874)),)
    assert out.scale == "unit"
    assert render_tool_calls(out.actions, "mobile_use") == (
        '<tool_call>\n{"name": "mobile_use", "arguments": {"action": "click", '
        '"coordinate": [501, 874]}}\n</tool_call>'
    )


def test_example_b_windows_multiline_then_terminate():
    out = ok("write(message='Budget')\npress(keys='enter')")
    assert out.actions == (Type("Budget"), Key(("enter",)))
    assert out.scale is None  # no coordinates, nothing to convert
    rendered = render_tool_calls(out.actions, "computer_use")
    assert rendered.count("<tool_call>") == 2
    assert rendered.index('"type"') < rendered.index('"key"')
    final = ok("terminate(status='success', info=None)")
    assert final.actions == (Terminate("success"),)
    assert final.actions[0].to_arguments() == {"action": "terminate", "status": "success"}


def test_action_tag_wrapper_is_accepted():
    assert ok("<action>\nclick(x=0.5, y=0.5)\n</action>").actions == (LeftClick((500, 500)),)


# --- clicks --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("click(x=0.1, y=0.2)", LeftClick((100, 200))),
        ("click(0.1, 0.2)", LeftClick((100, 200))),
        ("left_click(x=0.1, y=0.2)", LeftClick((100, 200))),
        ("click(x=0.1, y=0.2, clicks=2)", DoubleClick((100, 200))),
        ("doubleClick(x=0.1, y=0.2)", DoubleClick((100, 200))),
        ("click(x=0.1, y=0.2, clicks=3)", TripleClick((100, 200))),
        ("tripleClick(x=0.1, y=0.2)", TripleClick((100, 200))),
        ("click(x=0.1, y=0.2, button='right')", RightClick((100, 200))),
        ("rightClick(x=0.1, y=0.2)", RightClick((100, 200))),
        ("click(x=0.1, y=0.2, button='middle')", MiddleClick((100, 200))),
        ("click(x=0.1, y=0.2, clicks=2, button='right')", DoubleClick((100, 200))),
        ("moveTo(x=0.1, y=0.2)", MouseMove((100, 200))),
    ],
)
def test_desktop_click_family(text, expected):
    assert ok(text).actions == (expected,)


def test_alias_positional_and_flag_counters():
    out = ok("left_click(0.1, 0.2)\ntripleClick(x=0.3, y=0.3)\nclick(0.5, 0.5, clicks=40)")
    assert out.aliases == {"left_click": 1, "tripleClick": 1}
    assert out.positional == {"click": 2}
    assert out.flags["outlier_clicks"] == 1
    assert out.actions[-1] == TripleClick((500, 500))
    assert ok("click(x=0.1, y=0.2, clicks=2, button='right')").flags["clicks_and_button"] == 1


def test_mobile_clicks():
    assert ok("click(x=0.5, y=0.5)", "android").actions == (Click((500, 500)),)
    double = ok("click(x=0.5, y=0.5, clicks=2)", "android")
    assert double.actions == (Click((500, 500)), Click((500, 500)))
    assert double.flags["mobile_double_click"] == 1
    for text in ("rightClick(x=0.5, y=0.5)", "click(x=0.5, y=0.5, clicks=3)"):
        assert err(text, "android").reason == "unsupported_action"


def test_x_none_uses_pointer_of_a_preceding_move():
    out = ok("moveTo(x=0.2, y=0.4)\nclick(x=None, y=None)")
    assert out.actions == (MouseMove((200, 400)), LeftClick((200, 400)))
    assert out.flags["x_none"] == 1
    assert err("click(x=None, y=None)").reason == "missing_coordinate"
    assert err("click()", "android").reason == "missing_coordinate"


def test_bad_click_arguments():
    assert err("click(x=0.1, y=0.1, button='side')").reason == "bad_argument"
    assert err("click(x=0.1, y=0.1, clicks=0)").reason == "bad_argument"
    assert err("click(x='a', y=0.1)").reason == "bad_argument"
    assert err("click(0.1, 0.2, 1, 'left', 5)").reason == "bad_argument"
    assert err("click(x=0.1, x=0.2)").reason in ("bad_syntax", "bad_argument")
    assert err("click(x=0.1, y=0.2, z=1)").reason == "bad_argument"


# --- drag, scroll, swipe -------------------------------------------------------------------------


def test_move_then_drag_keeps_start():
    out = ok("moveTo(x=0.1, y=0.2)\ndragTo(x=0.5, y=0.6)")
    assert out.actions == (MouseMove((100, 200)), LeftClickDrag((500, 600), start=(100, 200)))
    assert out.actions[1].to_arguments() == {"action": "left_click_drag", "coordinate": [500, 600]}


@pytest.mark.parametrize(
    ("text", "start"),
    [
        ("click(x=0.2, y=0.3)\ndragTo(x=0.5, y=0.6)", (200, 300)),
        ("moveTo(x=0.1, y=0.1)\nclick(x=0.2, y=0.3)\ndragTo(x=0.5, y=0.6)", (200, 300)),
        ("rightClick(x=0.2, y=0.3)\ndragTo(x=0.5, y=0.6)", (200, 300)),
        ("moveTo(x=0.1, y=0.1)\nscroll(clicks=1, x=0.2, y=0.3)\ndragTo(x=0.5, y=0.6)", (200, 300)),
    ],
)
def test_drag_starts_at_the_pointer_of_any_preceding_point_action(text, start):
    # ok() also checks that the marks are unchanged after rendering to <tool_call> text and back.
    out = ok(text)
    assert out.actions[-1] == LeftClickDrag((500, 600), start=start)
    assert marks_for_actions(out.actions)[-1] == ArrowMark(*start, 500, 600)


def test_consecutive_drags_chain_from_the_previous_end():
    out = ok("moveTo(x=0.1, y=0.1)\ndragTo(x=0.2, y=0.2)\ndragTo(x=0.3, y=0.3)")
    assert marks_for_actions(out.actions) == [
        PointMark(100, 100),
        ArrowMark(100, 100, 200, 200),
        ArrowMark(200, 200, 300, 300),
    ]


def test_drag_without_move_has_unknown_start():
    assert ok("dragTo(x=0.5, y=0.6)").actions == (LeftClickDrag((500, 600)),)
    flags: Counter[str] = Counter()
    calls = parse_scalecua_calls("dragTo(x=0.5, y=0.6)")
    with_prev = normalise_calls(calls, "ubuntu", W, H, pointer=(7, 8), flags=flags)
    assert with_prev == [LeftClickDrag((500, 600), start=(7, 8))]
    # The renderer's marks take the same pointer the parser was given.
    again = parse_tool_calls(render_tool_calls(with_prev, "computer_use"))
    assert marks_for_actions(again, pointer=(7, 8)) == [ArrowMark(7, 8, 500, 600)]
    assert marks_for_actions(again) == []


def test_mobile_move_drag_is_a_swipe():
    out = ok("moveTo(x=0.5, y=0.8)\ndragTo(x=0.5, y=0.2)", "android")
    assert out.actions == (Swipe((500, 800), (500, 200)),)
    assert err("dragTo(x=0.5, y=0.2)", "android").reason == "unsupported_action"
    assert err("moveTo(x=0.5, y=0.2)", "android").reason == "unsupported_action"


def test_scroll_with_position_and_sign():
    out = ok("scroll(clicks=-3, x=0.5, y=0.25)")
    assert out.actions == (MouseMove((500, 250)), Scroll(-300))
    assert ok("scroll(-3)").actions == (Scroll(-300),)
    assert "x_none" not in ok("scroll(-3)").flags  # no position is normal for a wheel scroll
    assert ok("scroll(5)").actions == (Scroll(500),)
    assert ok("scroll(-3)", scroll_sign=-1).actions == (Scroll(300),)
    assert ok("scroll(40)").flags["outlier_clicks"] == 1
    assert err("scroll(clicks=1.5)").reason == "bad_argument"
    assert err("scroll()").reason == "missing_argument"
    assert err("scroll(3)", "android").reason == "unsupported_action"


@pytest.mark.parametrize(
    ("direction", "expected"),
    [
        ("up", Scroll(-500)),  # finger up reveals content below: the view scrolls down
        ("down", Scroll(500)),
        ("left", HScroll(500)),
        ("right", HScroll(-500)),
    ],
)
def test_web_direction_swipe_signs(direction, expected):
    assert ok(f"swipe(direction='{direction}', amount=0.5)", "web").actions == (expected,)


def test_web_swipe_defaults_and_reference_hswipe():
    assert ok("swipe()", "web").actions == (Scroll(-500),)  # direction 'up', amount 0.5
    assert ok("swipe(direction='up', amount=0.3)", "web").actions == (Scroll(-300),)
    ref = ok("swipe(direction='left', amount=0.5)", "web", hswipe="reference")
    assert ref.actions == (HScroll(-500),)
    assert err("swipe(direction='sideways')", "web").reason == "bad_argument"
    assert err("swipe(direction='up', amount=3)", "web").reason == "bad_argument"


def test_mobile_from_to_swipe():
    out = ok("swipe(from_coord=[0.5, 0.8], to_coord=[0.5, 0.3])", "android", 1080, 2400)
    assert out.actions == (Swipe((500, 800), (500, 300)),)
    assert not out.actions[0].synthetic
    assert err("swipe(from_coord=[0.5, 0.8])", "android").reason == "missing_argument"
    assert err("swipe(from_coord=[0.5], to_coord=[0.1, 0.2])", "android").reason == "bad_argument"


def test_web_coordinate_swipe_becomes_drag():
    out = ok("swipe(from_coord=[0.1, 0.2], to_coord=[0.3, 0.4])", "web")
    assert out.actions == (MouseMove((100, 200)), LeftClickDrag((300, 400), start=(100, 200)))


def test_mobile_direction_swipe_synthesises_points():
    out = ok("swipe(direction='up', amount=0.5)", "android")
    assert out.actions == (Swipe((500, 750), (500, 250), synthetic=True),)
    assert out.flags["synthetic_swipe"] == 1
    assert "synthetic" not in out.actions[0].to_arguments()
    left = ok("swipe(direction='left', amount=0.2)", "android").actions[0]
    assert (left.coordinate, left.coordinate2) == ((600, 500), (400, 500))


# --- keys ----------------------------------------------------------------------------------------


def test_press_and_hotkey_forms():
    assert ok("press(keys='enter')").actions == (Key(("enter",)),)
    assert ok("press('enter')").actions == (Key(("enter",)),)
    assert ok("press(keys='up', presses=3)").actions == (Key(("up",)),) * 3
    assert ok("press(keys=['ctrl', 'a'])").actions == (Key(("ctrl", "a")),)
    assert ok("hotkey('ctrl', 'c')").actions == (Key(("ctrl", "c")),)
    assert ok("key(keys='tab')").aliases == {"key": 1}
    assert ok("hotkey('Ctrl', 'A')").actions == (Key(("ctrl", "A")),)


@pytest.mark.parametrize(
    "text",
    [
        "hotkey('ctrl', keys=['c'])",  # keys both ways: 'ctrl' used to be dropped silently
        "hotkey('ctrl', 'c', keys=['v'])",
        "hotkey('ctrl', 'c', interval=0.1)",
        "type('a', text='b')",
        "write(message='a', text='b')",
        "key(key='a', keys='b')",
        "answer(answer='a', text='b')",
        "click(0.1, 0.2, x=0.3)",
        "tripleClick(x=0.1, y=0.2, clicks=2)",
    ],
)
def test_a_parameter_bound_twice_is_an_error(text):
    assert err(text).reason == "bad_argument"


def test_hotkey_keys_keyword_alone_still_works():
    assert ok("hotkey(keys=['ctrl', 'c'])").actions == (Key(("ctrl", "c")),)
    assert ok("type(text='b')").actions == (Type("b"),)
    assert err("hotkey()").reason == "missing_argument"


def test_prose_in_keys_is_rejected():
    assert err("press(keys='press the enter key')").reason == "bad_key"
    assert err("hotkey('ctrl', 'banana')").reason == "bad_key"
    assert err("press(keys=[])").reason == "bad_argument"
    assert err("press(keys='enter', presses=0)").reason == "bad_argument"
    # Each press is one action: an absurd count is refused instead of allocating it.
    assert err("press(keys='enter', presses=10**12)").reason == "bad_argument"
    assert err("press(keys='enter', presses=1000000000000)").reason == "bad_argument"
    assert len(ok("press(keys='a', presses=100)").actions) == 100


def test_key_down_press_up_folds_into_one_hotkey():
    out = ok("keyDown('shift')\npress('tab')\nkeyUp('shift')")
    assert out.actions == (Key(("shift", "tab")),)
    chord = ok("keyDown('ctrl')\nkeyDown('shift')\npress('t')\nkeyUp('shift')\nkeyUp('ctrl')")
    assert chord.actions == (Key(("ctrl", "shift", "t")),)
    assert ok("keyDown('ctrl')\nkeyUp('ctrl')").actions == (Key(("ctrl",)),)


def test_lone_key_events_are_unsupported():
    assert err("keyDown('shift')").reason == "unsupported_action"
    assert err("keyUp('shift')").reason == "unsupported_action"
    held = "keyDown('shift')\nclick(x=0.1, y=0.1)\nkeyUp('shift')"
    assert err(held).reason == "unsupported_action"


def test_mobile_keys():
    assert ok("press(keys='enter')", "android").actions == (SystemButton("Enter"),)
    assert ok("press(keys='volume_up')", "android").actions == (MobileKey("volume_up"),)
    assert err("hotkey('ctrl', 'c')", "android").reason == "unsupported_action"


# --- the rest of the catalogue -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "platform", "expected"),
    [
        ("write(message='héllo 世界')", "windows", Type("héllo 世界")),
        ("type(text='abc')", "web", Type("abc")),
        ("write('x')", "android", Type("x")),
        ("wait()", "windows", Wait(3)),
        ("wait(seconds=2)", "android", Wait(2)),
        ("response(answer='42')", "web", Answer("42")),
        ("answer(answer='42')", "web", Answer("42")),
        ("terminate()", "windows", Terminate("success")),
        ("terminate(status='failure', info='blocked')", "web", Terminate("failure", "blocked")),
        ("long_press(x=0.5, y=0.5)", "android", LongPress((500, 500), 1)),
        ("long_press(x=0.5, y=0.5, duration=3)", "android", LongPress((500, 500), 3)),
        ("open_app(app_name='Clock')", "android", Open("Clock")),
        ("navigate_home()", "android", SystemButton("Home")),
        ("navigate_back()", "android", SystemButton("Back")),
        ("call_user()", "windows", CallUser()),
    ],
)
def test_catalogue(text, platform, expected):
    assert ok(text, platform).actions == (expected,)


@pytest.mark.parametrize(
    ("text", "platform"),
    [
        ("wait(seconds=1e14)", "windows"),
        ("wait(seconds=3600.5)", "web"),
        ("wait(-1)", "windows"),
        ("long_press(x=0.5, y=0.5, duration=1e14)", "android"),
        ("long_press(x=0.5, y=0.5, duration=3601)", "android"),
    ],
)
def test_durations_are_bounded(text, platform):
    assert err(text, platform).reason == "bad_argument"


def test_durations_up_to_the_bound_are_kept():
    assert ok(f"wait(seconds={MAX_SECONDS})").actions == (Wait(MAX_SECONDS),)
    long = ok(f"long_press(x=0.5, y=0.5, duration={MAX_SECONDS})", "android")
    assert long.actions == (LongPress((500, 500), MAX_SECONDS),)


def test_terminate_fail_is_failure_and_counted():
    out = ok("terminate(status='fail', info=None)")
    assert out.actions == (Terminate("failure"),)
    assert out.flags["status_fail"] == 1
    assert err("terminate(status='maybe')").reason == "bad_argument"


def test_call_user_has_no_qwen_rendering():
    with pytest.raises(ActionError) as info:
        render_tool_calls([CallUser()], "computer_use")
    assert info.value.reason == "unsupported_action"


@pytest.mark.parametrize(
    ("text", "platform"),
    [
        ("open_url(url='https://example.org')", "web"),
        ("go_back()", "web"),  # not in the grammar at all
        ("go_forward()", "web"),
        ("go_backward()", "web"),
        ("select_option(x=0.1, y=0.1, value='a')", "web"),
        ("open_app(app_name='Clock')", "windows"),
        ("navigate_home()", "web"),
        ("long_press(x=0.5, y=0.5)", "mac"),
    ],
)
def test_unmapped_calls_are_typed_errors(text, platform):
    expected = "unknown_action" if text.startswith("go_back(") else "unsupported_action"
    assert err(text, platform).reason == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("click(x=0.1,", "bad_syntax"),
        ("x = 3", "bad_syntax"),
        ("pyautogui.click(1, 2)", "bad_syntax"),
        ("fly(x=0.1)", "unknown_action"),
        ("click(x=__import__('os'))", "bad_argument"),
        ("click(*[1, 2])", "bad_syntax"),
    ],
)
def test_garbage_is_a_typed_error(text, reason):
    assert err(text).reason == reason


def test_unknown_platform_and_bad_frame():
    assert err("click(x=0.1, y=0.1)", "amiga").reason == "unknown_platform"
    assert err("click(x=0.1, y=0.1)", "windows", 0, 10).reason == "bad_argument"


# --- scale ---------------------------------------------------------------------------------------


def test_detect_scale_rules():
    assert detect_scale([0.2, 0.9]) == "unit"
    assert detect_scale([1.0, 0.0]) == "unit"
    assert detect_scale([1.004, 0.5]) == "unit"  # overshoot within the clamp is still unit
    assert detect_scale([1.006, 0.5]) is None  # a fraction beside a larger value: no scale
    assert detect_scale([0.2, 734]) is None
    assert detect_scale([1000, 0.5]) is None
    assert detect_scale([1000, 3]) == "grid"
    assert detect_scale([1000, 0]) == "grid"  # 0 and 1 are not fractions
    assert detect_scale([1.5, 3]) == "grid"
    assert detect_scale([1000.5, 3]) == "pixel"
    assert detect_scale([]) is None


@pytest.mark.parametrize("scale", [None, "unit", "grid", "pixel"])
@pytest.mark.parametrize(
    "text",
    [
        "click(x=1000, y=0.5)",
        "moveTo(0.5, 0.5)\ndragTo(600, 400)",
        "click(x=0.2, y=734)",
        "click(x=1.2, y=0.5)",
        "swipe(from_coord=[0.5, 0.5], to_coord=[600, 400])",
    ],
)
def test_fractions_beside_larger_values_are_ambiguous_in_any_file(text, scale):
    # Read as grid these truncate to the screen edge, read as unit they leave it: never guess.
    assert err(text, scale=scale).reason == "ambiguous_scale"
    assert resolve_scale(coordinate_values(parse_scalecua_calls(text)), scale).reason == (
        "ambiguous_scale"
    )


def test_unit_overshoot_within_the_clamp_is_clamped_not_rescaled():
    clamped = ok("click(x=1.004, y=0.5)")  # no file scale: used to become grid (1, 1)
    assert clamped.scale == "unit" and clamped.actions == (LeftClick((1000, 500)),)
    assert clamped.flags["clamped"] == 1
    assert ok("click(x=1000, y=0)").actions == (LeftClick((1000, 0)),)  # negative control
    assert ok("moveTo(1, 0)\ndragTo(600, 400)").scale == "grid"


def test_pixel_size_values_in_a_grid_file_are_ambiguous():
    assert err("click(x=1500, y=10)", scale="grid").reason == "ambiguous_scale"
    assert ok("click(x=1500, y=10)", scale="pixel").actions == (LeftClick((781, 9)),)
    assert ok("click(x=1500, y=10)").scale == "pixel"


def test_coordinate_values_covers_all_forms():
    calls = parse_scalecua_calls(
        "click(0.1, 0.2)\nswipe(from_coord=[0.3, 0.4], to_coord=[0.5, 0.6])\nclick(x=None)"
    )
    assert coordinate_values(calls) == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]


def test_grid_and_pixel_records():
    grid = ok("click(x=367, y=919)")
    assert grid.scale == "grid" and grid.actions == (LeftClick((367, 919)),)
    pixel = ok("click(x=1440, y=540)")
    assert pixel.scale == "pixel" and pixel.actions == (LeftClick((750, 500)),)


def test_resolve_scale_is_exposed_for_file_tallies():
    assert resolve_scale([0.0, 1.0], "grid") == "grid"
    assert resolve_scale([960.0, 540.0], "pixel") == "pixel"
    assert resolve_scale([0.42, 0.5], "grid") == ActionError(
        "ambiguous_scale", "fractional coordinates [0.42, 0.5] in a grid file"
    )
    assert resolve_scale([], "unit") == "unit"
    assert resolve_scale([0.3], None) == "unit"


def test_file_scale_breaks_ties():
    # A grid record with only 0/1 values looks like unit scale on its own.
    assert ok("click(x=1, y=0)").actions == (LeftClick((1000, 0)),)
    assert ok("click(x=1, y=0)", scale="grid").actions == (LeftClick((1, 0)),)
    # A pixel record below 1000 looks like grid on its own.
    assert ok("click(x=960, y=540)").actions == (LeftClick((960, 540)),)
    assert ok("click(x=960, y=540)", scale="pixel").actions == (LeftClick((500, 500)),)


@pytest.mark.parametrize(
    ("text", "scale"),
    [
        ("click(x=0.42, y=0.5)", "grid"),
        ("click(x=0.42, y=0.3)", "pixel"),
        ("click(734, 2)", "unit"),
    ],
)
def test_contradictions_are_ambiguous(text, scale):
    assert err(text, scale=scale).reason == "ambiguous_scale"


def test_clamping_and_out_of_range():
    clamped = ok("click(x=1.004, y=0.5)", scale="unit")
    assert clamped.actions == (LeftClick((1000, 500)),)
    assert clamped.flags["clamped"] == 1
    assert ok("click(x=1004, y=5)", scale="grid").actions == (LeftClick((1000, 5)),)
    assert ok("click(x=1925, y=540)").actions == (LeftClick((1000, 500)),)  # 0.26 % over
    assert err("click(x=1010, y=5)", scale="grid").reason == "ambiguous_scale"  # beyond the clamp
    assert err("click(x=-10, y=5)", scale="grid").reason == "coordinate_out_of_range"
    assert err("click(x=2100, y=540)").reason == "coordinate_out_of_range"
    assert err("click(x=-0.2, y=0.5)").reason == "coordinate_out_of_range"
    assert err("click(x=0.5, y=0.5)", scale="inches").reason == "bad_argument"


def test_rounding_is_half_up():
    # 0.8735 * 1000 = 873.5 exactly in binary floating point; half-up gives 874, and 0.0125
    # -> 12.5 -> 13 where round-half-even would give 12.
    assert ok("click(x=0.0125, y=0.8735)").actions == (LeftClick((13, 874)),)


def test_normalise_calls_rejects_unknown_raw_calls():
    out = normalise_calls([RawCall("fly", {})], "windows", W, H)
    assert isinstance(out, ActionError) and out.reason == "unknown_action"
    bad = RawCall("swipe", {"from_coord": [1, 2, 3], "to_coord": [1, 2]})
    assert normalise_calls([bad], "android", W, H).reason == "bad_argument"
    assert normalise_calls([RawCall("terminate", {})], "web", W, H) == [Terminate("success")]


def test_pointer_after_matches_the_parsers_pointer_across_steps():
    from hivig.actions import (
        LeftClickDrag,
        Scroll,
        Terminate,
        normalise_calls,
        parse_scalecua_calls,
        pointer_after,
    )

    def step(text, pointer=None):
        calls = parse_scalecua_calls(text)
        return normalise_calls(calls, "windows", 1000, 1000, "unit", pointer=pointer)

    first = step("click(x=0.2, y=0.3)\nscroll(clicks=-2)")
    assert pointer_after(first) == (200, 300)  # a scroll without a position keeps it
    second = step("dragTo(x=0.5, y=0.6)", pointer=pointer_after(first))
    (drag,) = second
    assert isinstance(drag, LeftClickDrag) and drag.start == (200, 300)
    assert pointer_after(second) == (500, 600)
    assert pointer_after([Terminate("success")], (1, 2)) == (1, 2)
    assert pointer_after([Scroll(-100, coordinate=(7, 8))]) == (7, 8)
