"""Recurrence detector on generated 1920×1080 screen sequences (hivig.recurrence)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from hivig.actions import Key, LeftClick, LeftClickDrag, Scroll, Type, Wait
from hivig.config import ConfigError
from hivig.recurrence import (
    DetectorConfig,
    DetectorState,
    _cell_slices,
    _cells_of,
    exact_action_key,
    new_state,
    recurrence_note,
    relaxed_action_key,
    update,
)
from hivig.screens import Mask, ScreenThresholds, platform_masks

W, H = 1920, 1080
FONT = ImageFont.load_default(size=18)
DEAD_SPOT = LeftClick((700, 300))  # empty panel background: nothing happens there
CHANGE_KEYS = {"identical", "dhash_dist", "region_changed", "masked_diff_frac", "no_effect"}
RECURRENCE_KEYS = {
    "same_key_no_effect_run",
    "cycle_len",
    "screen_revisits",
    "r3_trigger",
    "action_key",
    "screen_key",
}


@functools.lru_cache(maxsize=64)  # frames are never modified; drawing them is the slow part
def screen(
    view: str = "list",
    clock: str = "12:01",
    dialog: bool = False,
    checked: bool = False,
    focus: bool = False,
    scroll: int = 0,
    spinner: int | None = None,
    page_clock: str | None = None,
    tooltip: bool = False,
    report: int | None = None,
) -> Image.Image:
    """A Windows-like desktop with one app window.

    Args:
        view: ``list``, ``detail`` or ``settings`` (three distinct app screens), or ``doc`` (a
            long document shown from line ``scroll``).
        clock: Taskbar clock text (inside the Windows default mask).
        dialog: Draw a modal dialog.
        checked: Tick the checkbox of the settings row.
        focus: Draw a focus ring around the first toolbar button.
        scroll: First visible document line.
        spinner: Phase (0–7) of a loading spinner in a slow panel; ``None`` for no panel.
        page_clock: Text of a clock inside the page (outside every default mask).
        tooltip: Draw a tooltip next to the dead spot.
        report: Show the slow panel's report table (the spinner's replacement), its total cell
            reading this value; ``None`` for no table.
    """
    img = Image.new("RGB", (W, H), (0, 90, 160))
    d = ImageDraw.Draw(img)
    d.rectangle((0, 1032, W, H), fill=(25, 25, 30))  # taskbar
    for i in range(8):
        d.rectangle((20 + 60 * i, 1038, 60 + 60 * i, 1074), fill=(200, 200, 60 + 20 * i))
    d.text((1810, 1046), clock, fill=(255, 255, 255), font=FONT)
    d.rectangle((100, 60, 1820, 1000), fill=(245, 245, 245), outline=(0, 0, 0))  # window
    d.rectangle((100, 60, 1820, 100), fill=(40, 40, 40))
    d.text((120, 70), f"App - {view}", fill=(255, 255, 255), font=FONT)
    for i in range(4):  # toolbar
        d.rectangle((120 + 110 * i, 110, 210 + 110 * i, 140), fill=(210, 210, 215))
        d.text((130 + 110 * i, 115), ["New", "Open", "Save", "Help"][i], fill=(0, 0, 0), font=FONT)
    if focus:
        d.rectangle((116, 106, 214, 144), outline=(0, 120, 215), width=3)
    if view == "list":
        for i in range(12):
            d.rectangle((120, 160 + 60 * i, 600, 205 + 60 * i), fill=(230, 236, 245))
            d.text((135, 172 + 60 * i), f"Message {i}: quarterly report", fill=(0, 0, 0), font=FONT)
    elif view == "detail":
        d.text((140, 170), "Message 1: quarterly report", fill=(0, 0, 0), font=FONT)
        for i in range(10):
            d.text((140, 230 + 36 * i), f"Paragraph {i} of the report body text.", fill=(60,) * 3)
        d.rectangle((140, 700, 300, 740), fill=(0, 120, 215))
        d.text((160, 710), "Back", fill=(255, 255, 255), font=FONT)
    elif view == "settings":
        for i in range(6):
            d.text((180, 180 + 70 * i), f"Option {i}", fill=(0, 0, 0), font=FONT)
            d.rectangle((140, 180 + 70 * i, 164, 204 + 70 * i), outline=(0, 0, 0), width=2)
        if checked:
            d.line((144, 192, 151, 200), fill=(0, 0, 0), width=3)
            d.line((151, 200, 161, 184), fill=(0, 0, 0), width=3)
    elif view == "doc":
        for row in range(22):
            line = scroll + row
            y = 170 + 38 * row
            d.text((140, y), f"Line {line}: " + "lorem ipsum " * (1 + line % 5), fill=(0,) * 3)
            d.rectangle((1500, y, 1500 + 12 * (line % 17), y + 20), fill=(90, 140, 200))
    if spinner is not None:
        d.rectangle((1100, 300, 1700, 800), fill=(255, 255, 255), outline=(120, 120, 120))
        d.text((1300, 720), "Loading report...", fill=(0, 0, 0), font=FONT)
        start = 45 * spinner
        d.arc((1300, 400, 1500, 600), start, start + 270, fill=(0, 120, 215), width=26)
    if report is not None:
        d.rectangle((1100, 300, 1700, 800), fill=(255, 255, 255), outline=(120, 120, 120))
        d.text((1130, 320), "Quarterly revenue", fill=(0, 0, 0), font=FONT)
        for i, (q, v) in enumerate([("Q1", "3.1"), ("Q2", "3.6"), ("Q3", "4.2"), ("Q4", "3.9")]):
            d.text((1130, 380 + 40 * i), f"{q}    ${v}M", fill=(0, 0, 0), font=FONT)
        d.text((1130, 560), f"Total  ${report}M", fill=(0, 0, 0), font=FONT)
    if page_clock is not None:
        d.text((1650, 120), page_clock, fill=(0, 0, 0), font=FONT)
    if tooltip:
        d.rectangle((1350, 340, 1560, 380), fill=(255, 255, 225), outline=(0, 0, 0))
        d.text((1360, 350), "Nothing to select", fill=(0, 0, 0), font=FONT)
    if dialog:
        d.rectangle((660, 340, 1260, 700), fill=(250, 250, 250), outline=(0, 0, 0), width=2)
        d.rectangle((660, 340, 1260, 380), fill=(60, 60, 60))
        d.text((700, 450), "Delete this message?", fill=(0, 0, 0), font=FONT)
        d.rectangle((1000, 620, 1100, 660), fill=(0, 120, 215))
    return img


def run(frames_and_actions, platform="windows", config=None, state=None):
    """Feed (frame, actions) pairs through ``update``; returns (state, [signals])."""
    state = state or new_state(platform)
    out = []
    for frame, actions in frames_and_actions:
        state, sig = update(state, frame, actions, config)
        out.append(sig)
    return state, out


# --- change signals ---------------------------------------------------------------------------


def test_clock_tick_in_the_status_bar_is_not_a_change():
    before, after = screen(clock="12:01"), screen(clock="12:02")
    _, (_, sig) = run([(before, None), (after, [DEAD_SPOT])])
    assert set(sig.change) == CHANGE_KEYS
    assert sig.change == {
        "identical": True,
        "dhash_dist": 0,
        "region_changed": False,
        "masked_diff_frac": 0.0,
        "no_effect": True,
    }
    # Control: without the platform's clock mask the same pair is not identical.
    _, (_, bare) = run([(before, None), (after, [DEAD_SPOT])], platform=None)
    assert bare.change["identical"] is False
    assert bare.change["masked_diff_frac"] > 0


def test_dialog_opening_is_a_change():
    before, after = screen(), screen(dialog=True, clock="12:02")
    _, (_, sig) = run([(before, None), (after, [LeftClick((80, 130))])])
    ch = sig.change
    assert ch["identical"] is False and ch["no_effect"] is False
    assert ch["dhash_dist"] > 2
    assert ch["masked_diff_frac"] > 0.01  # edges and text (the light fill is within 24 levels)
    assert ch["region_changed"] is False  # the toolbar button clicked did not change itself
    assert sig.recurrence["same_key_no_effect_run"] == 0


def test_small_change_at_the_target_is_caught_by_the_region_check():
    # Ticking a checkbox changes far less than 0.1 % of the screen; the crop around the
    # pointer target still sees it, so the click had an effect.
    before, after = screen("settings"), screen("settings", checked=True)
    tick = LeftClick((79, 177))
    _, (_, sig) = run([(before, None), (after, [tick])])
    assert sig.change["masked_diff_frac"] < 0.001
    assert sig.change["identical"] is False
    assert sig.change["region_changed"] is True
    assert sig.change["no_effect"] is False
    # The same pair after a keyboard action (space on the focused checkbox): no target to crop
    # around, and the change is still far below 0.1 %, yet it is the key's effect.
    _, (_, keyed) = run([(before, None), (after, [Key(("space",))])])
    assert keyed.change["region_changed"] is None
    assert keyed.change["masked_diff_frac"] < 0.001
    assert keyed.change["no_effect"] is False
    # Control: the old rule (any change under 0.1 % is none) called it "no effect".
    lax = DetectorConfig(screen=ScreenThresholds(untargeted_max_px=10_000))
    _, (_, old) = run([(before, None), (after, [Key(("space",))])], config=lax)
    assert old.change["no_effect"] is True


def _text_field(caret: bool) -> Image.Image:
    """The settings screen with a focused text field whose caret is on or off (it blinks)."""
    img = screen("settings").copy()
    d = ImageDraw.Draw(img)
    d.rectangle((700, 600, 1100, 640), fill=(255, 255, 255), outline=(0, 0, 0))
    d.text((710, 610), "hello world and more text", fill=(0, 0, 0), font=FONT)
    if caret:
        d.line((905, 606, 905, 634), fill=(0, 0, 0), width=2)
    return img


def _form(text: str = "", caret: bool = True, focused: bool = True) -> Image.Image:
    """The settings screen with a form field holding ``text``; its caret blinks when focused."""
    img = screen("settings").copy()
    d = ImageDraw.Draw(img)
    d.text((700, 560), "Company name", fill=(0, 0, 0), font=FONT)
    d.rectangle((700, 600, 1100, 640), fill=(255, 255, 255), outline=(0, 0, 0))
    d.text((710, 610), text, fill=(0, 0, 0), font=FONT)
    if focused and caret:
        x = 712 + round(d.textlength(text, font=FONT))
        d.line((x, 606, x, 634), fill=(0, 0, 0), width=2)
    return img


def test_typing_into_a_focused_field_is_an_effect():
    # Typing "Acme Ltd" changes well under 0.1 % of the screen, and a typed action has no
    # pointer target, so no crop sees it: the global share alone called it "no effect".
    frames = [(_form(""), None), (_form("Acme Ltd"), [Type("Acme Ltd")])]
    _, (_, typed) = run(frames)
    assert 0 < typed.change["masked_diff_frac"] < 0.001
    assert typed.change["region_changed"] is None
    assert typed.change["no_effect"] is False
    # One more character, with the caret off in the new frame, is an effect too; so is "i",
    # the narrowest glyph, which changes no more of the thumbnail than a caret line.
    for before, after, text in [("Acme Ltd", "Acme Ltd.", "."), ("Acme", "Acmei", "i")]:
        _, (_, one) = run([(_form(before), None), (_form(after, caret=False), [Type(text)])])
        assert one.change["no_effect"] is False, text
    # Typing on and on into the field is never a no-effect run.
    words = ["Acme", "Acme Ltd", "Acme Ltd and", "Acme Ltd and Sons"]
    steps = [(_form(words[0]), None)]
    steps += [(_form(w, caret=i % 2 == 0), [Type(" x")]) for i, w in enumerate(words[1:])]
    _, sigs = run(steps)
    assert [s.change["no_effect"] for s in sigs[1:]] == [False] * 3
    assert not any(s.recurrence["r3_trigger"] for s in sigs)


def test_dead_keys_and_typing_into_nothing_still_trigger_r3():
    # A shortcut that does nothing while the field's caret blinks: the caret line is not an
    # effect (clock and caret aside, nothing changed), so the second press triggers.
    save = Key(("ctrl", "s"))
    frames = [(_form("Acme", True), None), (_form("Acme", False), [save])]
    frames.append((_form("Acme", True), [save]))
    _, sigs = run(frames)
    assert [s.change["identical"] for s in sigs[1:]] == [False, False]
    assert [s.change["no_effect"] for s in sigs[1:]] == [True, True]
    assert [s.recurrence["r3_trigger"] for s in sigs] == [False, False, True]
    # Typing with no field focused changes nothing: a no-effect repeat like a dead click.
    blank = _form("", focused=False)
    frames = [(blank, None), (blank, [Type("Acme")]), (screen_with_clock(blank), [Type("acme ")])]
    _, sigs = run(frames)
    assert [s.change["no_effect"] for s in sigs[1:]] == [True, True]
    assert [s.recurrence["r3_trigger"] for s in sigs] == [False, False, True]


def screen_with_clock(img: Image.Image, clock: str = "12:07") -> Image.Image:
    """A copy of ``img`` with another taskbar clock (inside the Windows default mask)."""
    out = img.copy()
    d = ImageDraw.Draw(out)
    d.rectangle((1800, 1040, W, H), fill=(25, 25, 30))
    d.text((1810, 1046), clock, fill=(255, 255, 255), font=FONT)
    return out


def test_caret_blink_at_the_target_does_not_hide_a_repeat():
    click = LeftClick((470, 574))  # (902, 620): inside the focused field, next to the caret
    frames = [
        (_text_field(True), None),
        (_text_field(False), [click]),
        (_text_field(True), [click]),
    ]
    _, sigs = run(frames)
    assert [s.change["identical"] for s in sigs[1:]] == [False, False]
    assert [s.change["region_changed"] for s in sigs[1:]] == [False, False]
    assert [s.recurrence["r3_trigger"] for s in sigs] == [False, False, True]
    # Control: with the caret rule off the blink reads as an effect of each click.
    _, ctrl = run(frames, config=DetectorConfig(screen=ScreenThresholds(caret_max_px=0)))
    assert [s.change["region_changed"] for s in ctrl[1:]] == [True, True]
    assert not any(s.recurrence["r3_trigger"] for s in ctrl)


def test_first_frame_has_no_change_object():
    _, (sig,) = run([(screen(), None)])
    assert sig.change is None
    assert set(sig.recurrence) == RECURRENCE_KEYS
    assert sig.recurrence["action_key"] is None
    assert sig.recurrence["same_key_no_effect_run"] == 0
    assert len(sig.recurrence["screen_key"]) == 16


def test_learned_mask_from_no_action_recaptures():
    # A clock inside a web page has no default mask; re-captures without acting teach it once
    # it has changed in learn_min_hits (3) of them.
    frames = [(screen(page_clock="10:00:00"), None)]
    frames += [(screen(page_clock=f"10:00:0{i}"), None) for i in (1, 2, 3)]  # probes
    frames.append((screen(page_clock="10:00:04"), [DEAD_SPOT]))
    _, sigs = run(frames, platform="web")
    assert [s.mask_learned for s in sigs] == [False, False, False, True, False]
    assert sigs[4].change["identical"] is True
    # Control: after one probe the clock is not learned yet, and the click sees it change.
    _, ctrl = run([*frames[:2], frames[4]], platform="web")
    assert not any(s.mask_learned for s in ctrl)
    assert ctrl[2].change["identical"] is False


def test_content_loading_during_a_wait_is_not_learned_as_volatile():
    # A wait during which the whole view changes is content arriving, not noise.
    frames = [(screen("list"), None), (screen("detail"), [Wait(2)])]
    state, sigs = run(frames)
    assert sigs[1].mask_learned is False
    assert sigs[1].change["no_effect"] is False
    # The region stays watched: going back to the list is a change.
    _, (sig,) = run([(screen("list"), [DEAD_SPOT])], state=state)
    assert sig.change["no_effect"] is False


def test_report_arriving_during_a_wait_is_a_change():
    # A spinner turns while the agent waits, then a report table replaces it: about 1 % of the
    # thumbnail, under learn_max_step_frac. The spinner (changing on every tick) is learned;
    # the table (a one-off change) is content arriving and stays watched.
    frames = [(screen("list", spinner=0), None)]
    frames += [(screen("list", spinner=i % 8), [Wait(1)]) for i in range(1, 16)]
    state, sigs = run(frames)
    assert any(s.mask_learned for s in sigs)
    spinner_cells = set(state.learned_cells)
    state, (arrived,) = run([(screen("list", report=14), [Wait(1)])], state=state)
    assert arrived.change["masked_diff_frac"] < DetectorConfig().learn_max_step_frac
    assert arrived.change["no_effect"] is False
    assert arrived.mask_learned is False and set(state.learned_cells) == spinner_cells
    # A later change inside the table is seen: clicking the total updates it.
    total = LeftClick((620, 528))
    _, (edited,) = run([(screen("list", report=15), [total])], state=state)
    assert edited.change["region_changed"] is True and edited.change["no_effect"] is False
    # Control: learning every no-action change at once (one hit) masks the arrival.
    eager = DetectorConfig(learn_min_hits=1)
    state, _ = run(frames, config=eager)
    _, (masked,) = run([(screen("list", report=14), [Wait(1)])], state=state, config=eager)
    assert masked.mask_learned is True and masked.change["no_effect"] is True


def test_one_off_change_during_a_wait_is_not_learned():
    # A page clock seen once during a wait is a change, not yet noise; ticking on, it is.
    frames = [(screen(page_clock="--"), None)]
    frames += [(screen(page_clock=f"0{i}"), [Wait(1)]) for i in range(4)]
    _, sigs = run(frames, platform="web")
    assert [s.mask_learned for s in sigs[1:]] == [False, False, True, False]
    assert [s.change["identical"] for s in sigs[1:]] == [False, False, True, True]


def test_noise_in_repeated_no_effect_steps_is_learned():
    # A blinking element outside any default mask, seen in several no-effect click steps.
    frames = [(screen(page_clock="--"), None)]
    for i in range(4):
        frames.append((screen(page_clock=f"0{i}"), [DEAD_SPOT]))
    _, sigs = run(frames, platform="web")
    assert [s.change["no_effect"] for s in sigs[1:]] == [True] * 4
    assert [s.change["identical"] for s in sigs[1:]] == [False, False, True, True]
    assert [s.mask_learned for s in sigs[1:]] == [False, False, True, False]
    # A key press may act anywhere, so while the element is not learned it reads as the key's
    # effect (a missed repeat rather than a false one); the clicks' lesson carries over.
    keys = [(screen(page_clock=f"1{i}"), [Key(("f5",))]) for i in range(2)]
    _, unlearned = run([frames[0], *keys], platform="web")
    assert [s.change["no_effect"] for s in unlearned[1:]] == [False, False]
    state, _ = run(frames, platform="web")
    _, learned = run(keys, state=state)
    assert [s.recurrence["r3_trigger"] for s in learned] == [False, True]


# --- R3 runs ---------------------------------------------------------------------------------


def test_clicking_a_dead_spot_twice_triggers_r3_at_k2():
    frames = [(screen(), None), (screen(), [DEAD_SPOT]), (screen(clock="12:02"), [DEAD_SPOT])]
    _, sigs = run(frames)
    runs = [s.recurrence["same_key_no_effect_run"] for s in sigs]
    triggers = [s.recurrence["r3_trigger"] for s in sigs]
    assert runs == [0, 1, 2]
    assert triggers == [False, False, True]
    assert recurrence_note(sigs[1]) is None
    note = recurrence_note(sigs[2])
    assert note is not None and "2 times" in note and "left_click" in note
    # With k = 3 the second click is not enough, the third is.
    _, sigs3 = run([*frames, (screen(), [DEAD_SPOT])], config=DetectorConfig(k=3))
    assert [s.recurrence["r3_trigger"] for s in sigs3] == [False, False, False, True]


def test_run_counts_from_the_first_unchanged_transition():
    # A visible side effect of the first click (a tooltip next to the target) is a change;
    # the run counts the later, unchanged repeats only.
    frames = [
        (screen(), None),
        (screen(tooltip=True), [DEAD_SPOT]),
        (screen(tooltip=True), [DEAD_SPOT]),
        (screen(tooltip=True), [DEAD_SPOT]),
    ]
    _, sigs = run(frames)
    assert sigs[1].change["region_changed"] is True
    assert [s.recurrence["same_key_no_effect_run"] for s in sigs] == [0, 0, 1, 2]
    assert [s.recurrence["r3_trigger"] for s in sigs] == [False, False, False, True]


def test_lost_focus_ring_is_below_the_no_effect_threshold():
    # Clicking a disabled control after another one clears that one's focus ring: the frame
    # is not identical, but the change is far below 0.1 % and away from the target, so the
    # first click already counts and the second triggers.
    frames = [(screen(focus=True), None), (screen(), [DEAD_SPOT]), (screen(), [DEAD_SPOT])]
    _, sigs = run(frames)
    assert sigs[1].change["identical"] is False
    assert sigs[1].change["no_effect"] is True
    assert [s.recurrence["r3_trigger"] for s in sigs] == [False, False, True]


def test_relaxed_key_tolerates_small_coordinate_jitter():
    near = LeftClick((702, 301))  # 3.8 px away on 1920×1080: within the 8.8 px tolerance
    far = LeftClick((720, 300))  # 38 px away: another target
    _, sigs = run([(screen(), None), (screen(), [DEAD_SPOT]), (screen(), [near])])
    assert sigs[2].recurrence["same_key_no_effect_run"] == 2
    assert sigs[2].recurrence["r3_trigger"] is True
    assert sigs[2].recurrence["action_key"] == sigs[1].recurrence["action_key"]
    assert sigs[2].action_key_exact != sigs[1].action_key_exact
    _, sigs = run([(screen(), None), (screen(), [DEAD_SPOT]), (screen(), [far])])
    assert sigs[2].recurrence["same_key_no_effect_run"] == 1
    assert sigs[2].recurrence["r3_trigger"] is False


def test_only_single_non_wait_actions_count():
    frames = [
        (screen(), None),
        (screen(), [DEAD_SPOT]),
        (screen(), [Wait(1)]),  # neither extends nor breaks the run
        (screen(), [DEAD_SPOT]),
        (screen(), [DEAD_SPOT, DEAD_SPOT]),  # a multi-action step breaks it
        (screen(), [DEAD_SPOT]),
    ]
    _, sigs = run(frames)
    assert [s.recurrence["same_key_no_effect_run"] for s in sigs] == [0, 1, 1, 2, 0, 1]
    assert [s.recurrence["r3_trigger"] for s in sigs] == [False, False, False, True, False, False]


def test_waiting_alone_never_triggers():
    frames = [(screen(), None)] + [(screen(), [Wait(2)]) for _ in range(5)]
    _, sigs = run(frames)
    assert all(s.recurrence["same_key_no_effect_run"] == 0 for s in sigs)
    assert not any(s.recurrence["r3_trigger"] for s in sigs)
    assert all(recurrence_note(s) is None for s in sigs)


def test_scroll_that_keeps_revealing_new_content_is_not_recurrence():
    down = Scroll(-5, (500, 500))
    frames = [(screen("doc", scroll=0), None)]
    frames += [(screen("doc", scroll=3 * i), [down]) for i in range(1, 9)]
    _, sigs = run(frames)
    for s in sigs[1:]:
        assert s.change["no_effect"] is False
        assert s.recurrence["same_key_no_effect_run"] == 0
        assert s.recurrence["cycle_len"] is None
        assert s.recurrence["screen_revisits"] == 0
        assert s.recurrence["r3_trigger"] is False
        assert recurrence_note(s) is None
    # At the end of the document the same scroll stops changing anything: now it counts.
    end = screen("doc", scroll=24)
    _, tail = run([(end, None), (end, [down]), (end, [Scroll(-10, (500, 500))])])
    assert [s.recurrence["r3_trigger"] for s in tail] == [False, False, True]


# --- cycles ----------------------------------------------------------------------------------


def test_abab_cycle_is_found_after_the_first_traversal():
    a, b = screen("list"), screen("detail")
    open_msg, back = LeftClick((120, 190)), LeftClick((115, 666))
    frames = [(a, None), (b, [open_msg]), (a, [back]), (b, [open_msg]), (a, [back])]
    _, sigs = run(frames)
    cycles = [s.recurrence["cycle_len"] for s in sigs]
    # The first return to A is exploration; repeating the loop is recurrence.
    assert cycles == [None, None, None, 2, 2]
    assert [s.cycle_repeats for s in sigs] == [0, 0, 0, 1, 2]
    assert [s.recurrence["screen_revisits"] for s in sigs] == [0, 0, 1, 1, 2]
    assert sigs[-1].recurrence["screen_key"] == sigs[0].recurrence["screen_key"]
    assert all(s.recurrence["same_key_no_effect_run"] == 0 for s in sigs)
    assert recurrence_note(sigs[2]) is None
    assert "loop" in recurrence_note(sigs[3])


def test_three_screen_cycle():
    a, b, c = screen("list"), screen("detail"), screen("settings")
    x, y, z = LeftClick((120, 190)), LeftClick((300, 120)), LeftClick((80, 130))
    frames = [(a, None), (b, [x]), (c, [y]), (a, [z]), (b, [x]), (c, [y]), (a, [z])]
    _, sigs = run(frames)
    assert [s.recurrence["cycle_len"] for s in sigs] == [None, None, None, None, 3, 3, 3]


def test_returning_with_different_actions_is_a_new_cycle_and_waits_break_cycles():
    a, b = screen("list"), screen("detail")
    open_msg, back, esc = LeftClick((120, 190)), LeftClick((115, 666)), Key(("escape",))
    # A→B→A by "back", then A→B→A by "escape": each loop is traversed once only.
    frames = [(a, None), (b, [open_msg]), (a, [back]), (b, [open_msg]), (a, [esc])]
    _, sigs = run(frames)
    assert sigs[3].recurrence["cycle_len"] == 2  # the rotation (B,back)(A,open) repeats
    assert sigs[4].recurrence["cycle_len"] is None  # (A,open)(B,esc) is new
    # A return through a wait is the screen changing by itself, never a loop of actions.
    frames = [(a, None), (b, [Wait(3)]), (a, [back]), (b, [Wait(3)]), (a, [back])]
    _, sigs = run(frames)
    assert all(s.recurrence["cycle_len"] is None for s in sigs)


def test_spinner_on_a_slow_panel_is_not_a_loop():
    # While a wait runs, a spinner turns through 8 phases and comes back to earlier frames.
    # Three rules keep this from reading as recurrence:
    # 1. wait steps never count toward the R3 run (R3: only single, non-wait actions);
    # 2. a transition made by waiting cannot be part of a cycle: the screen moved by itself,
    #    so a return to an earlier frame is the app's animation, not the agent looping;
    # 3. pixels that change during a wait while covering little of the screen are learned as
    #    volatile, so the spinner frames collapse into one screen and are not "revisits".
    frames = [(screen("list", spinner=0), None)]
    frames += [(screen("list", spinner=i % 8), [Wait(1)]) for i in range(1, 20)]
    _, sigs = run(frames)
    assert any(s.mask_learned for s in sigs)
    for s in sigs:
        assert s.recurrence["r3_trigger"] is False
        assert s.recurrence["same_key_no_effect_run"] == 0
        assert s.recurrence["cycle_len"] is None
        assert s.recurrence["screen_revisits"] == 0
        assert recurrence_note(s) is None
    # While the mask grows the screen is renamed (its key is the hash under the current mask);
    # once every phase is covered it keeps one key.
    last = max(i for i, s in enumerate(sigs) if s.mask_learned)
    assert last < len(sigs) - 4
    assert len({s.recurrence["screen_key"] for s in sigs[last:]}) == 1
    # Control: with learning off, the spinner frames really are different screens (so rule 3
    # is what removes the revisits) and rules 1-2 alone still keep R3 and cycles quiet.
    off = DetectorConfig(learn_max_step_frac=0.0, learn_min_hits=8, learn_window=8)
    _, raw = run(frames, config=off)
    assert any(s.change["no_effect"] is False for s in raw[1:])
    assert any(s.recurrence["screen_revisits"] > 0 for s in raw)
    assert not any(s.recurrence["r3_trigger"] for s in raw)
    assert all(s.recurrence["cycle_len"] is None for s in raw)
    # Clicking a dead spot while the spinner turns is recurrence again: the mask learned
    # from the waits hides the spinner, and the clicks do not change the screen.
    state, _ = run(frames)
    _, clicks = run(
        [(screen("list", spinner=3), [DEAD_SPOT]), (screen("list", spinner=4), [DEAD_SPOT])],
        state=state,
    )
    assert [c.recurrence["r3_trigger"] for c in clicks] == [False, True]


# --- action keys ---------------------------------------------------------------------------


def test_action_keys():
    assert exact_action_key([LeftClick((501, 553))]) == "left_click()@501,553"
    assert exact_action_key([Type("Hello  World")]) == 'type("Hello  World")'
    assert relaxed_action_key([Type(" hello world")]) == relaxed_action_key([Type("Hello  World")])
    assert exact_action_key([Scroll(-5, (10, 20))]) != exact_action_key([Scroll(-10, (10, 20))])
    assert relaxed_action_key([Scroll(-5, (10, 20))]) == relaxed_action_key([Scroll(-10, (10, 20))])
    assert relaxed_action_key([Scroll(5)]) != relaxed_action_key([Scroll(-5)])
    assert relaxed_action_key([Key(("Ctrl", "S"))]) == relaxed_action_key([Key(("ctrl", "s"))])
    assert exact_action_key([Wait(1)]) != exact_action_key([Wait(2)])
    assert relaxed_action_key([Wait(1)]) == relaxed_action_key([Wait(2)])
    drag = LeftClickDrag((400, 500), start=(100, 200))
    assert exact_action_key([drag]) == "left_click_drag()@100,200>400,500"
    assert exact_action_key(["click(5, 6)"]) == 'raw("click(5, 6)")'
    two = exact_action_key([LeftClick((1, 2)), Type("a")])
    assert two == 'left_click()@1,2; type("a")'


def test_none_entries_and_untyped_objects_do_not_crash():
    _, sigs = run([(screen(), None), (screen(), [None]), (screen(), [ValueError("bad")])])
    assert sigs[1].recurrence["action_key"] is None  # nothing executed
    assert sigs[2].recurrence["action_key"] == 'raw("bad")'


def test_raw_action_text_counts_like_a_typed_action():
    raw = "pyautogui.click(1344, 324)"
    _, sigs = run([(screen(), None), (screen(), [raw]), (screen(), [raw.upper()])])
    assert sigs[2].recurrence["action_key"] == sigs[1].recurrence["action_key"]
    assert sigs[2].recurrence["r3_trigger"] is True


# --- state -----------------------------------------------------------------------------------


def test_state_round_trips_through_json():
    a, b = screen("list", page_clock="3"), screen("detail")
    open_msg, back = LeftClick((120, 190)), LeftClick((115, 666))
    frames = [
        *[(screen("list", page_clock=str(i)), None) for i in (0, 1, 2)],
        (a, None),  # the third change of the page clock: its cells are learned
        (b, [open_msg]),
        (a, [back]),
        (a, [DEAD_SPOT]),
    ]
    state, _ = run(frames, platform="web")
    text = state.to_json()
    json.loads(text)  # plain JSON
    again = DetectorState.from_json(text)
    assert again == state
    assert again.learned_cells and again.cycle_counts and again.anchors
    assert np.array_equal(again.thumb, state.thumb)
    assert again.to_json() == text
    # Both continue identically.
    nxt = [(b, [open_msg]), (a, [DEAD_SPOT])]
    _, s1 = run(nxt, state=state)
    _, s2 = run(nxt, state=again)
    assert [(x.change, x.recurrence) for x in s1] == [(y.change, y.recurrence) for y in s2]
    assert s1[0].recurrence["cycle_len"] == 2


def test_fresh_state_round_trips_and_bad_json_is_refused():
    st = new_state("android", volatile_regions=[(0, 950, 1000, 1000)])
    assert DetectorState.from_json(st.to_json()) == st
    for bad in ("[]", '{"version": 99}', "{not json", '{"version": 1, "thumb": {"w": 1}}'):
        with pytest.raises(ValueError):
            DetectorState.from_json(bad)


def test_update_does_not_modify_its_input_state():
    state, _ = run([(screen(), None)])
    before = state.to_json()
    update(state, screen("detail"), [LeftClick((120, 190))])
    assert state.to_json() == before


def test_frame_size_change_is_a_change():
    state, _ = run([(screen(), None)])
    small = screen().resize((1280, 720))
    _, sig = update(state, small, [DEAD_SPOT])
    assert sig.change["no_effect"] is False
    assert sig.change["masked_diff_frac"] == 1.0 or sig.change["identical"] is False


# --- config and platforms ----------------------------------------------------------------------


def test_platform_masks_and_aliases():
    assert platform_masks("macos") == platform_masks("mac")
    assert platform_masks("linux") == platform_masks("ubuntu")
    assert platform_masks("web") == ()
    for name in ("windows", "mac", "ubuntu", "android"):
        assert platform_masks(name)
    with pytest.raises(ValueError, match="unknown platform") as err:
        new_state("amiga")
    known = str(err.value).split("use one of: ")[1].split(", ")
    assert len(known) == len(set(known)) and {"linux", "windows"} <= set(known)
    with pytest.raises(ValueError, match="mask"):
        new_state("web", volatile_regions=[(10, 10, 5, 20)])


@pytest.mark.parametrize(
    "field,value", [("k", 0), ("max_cycle", 1), ("pixel_delta", 300), ("no_effect_frac", 2.0)]
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        if field in {f.name for f in dataclasses.fields(ScreenThresholds)}:
            DetectorConfig(screen=ScreenThresholds(**{field: value}))
        else:
            DetectorConfig(**{field: value})


def test_signals_are_json_serialisable():
    frames = [(screen(), None), (screen(dialog=True), [LeftClick((80, 130))])]
    _, sigs = run(frames)
    for s in sigs:
        json.dumps({"change": s.change, "recurrence": s.recurrence})
    assert isinstance(sigs[1].change["dhash_dist"], int)
    assert isinstance(sigs[1].change["masked_diff_frac"], float)
    assert not math.isnan(sigs[1].change["masked_diff_frac"])


def test_update_stays_cheap_on_a_full_hd_frame():
    # The budget is 5 ms per observe on one core (benchmarks/bench_detector.py measures it);
    # this guard only catches gross regressions, such as per-pixel work at full resolution
    # (tens of ms). Best CPU time of several observes, so a busy machine cannot fail it.
    a, b = screen("list"), screen("detail")
    state, _ = run([(a, None)])
    best = math.inf
    for i in range(15):
        frame = b if i % 2 == 0 else a
        t0 = time.process_time()
        state, _ = update(state, frame, [LeftClick((120, 190))])
        best = min(best, time.process_time() - t0)
    assert best < 0.010


@pytest.mark.parametrize("seed", range(5))
def test_learned_cells_cover_exactly_the_changed_cells(seed):
    rng = np.random.default_rng(seed)
    shape, cell = (270, 483), 8  # a width that is not a multiple of the cell size
    px = rng.random(shape) > 0.995
    cells = [int(c) for c in _cells_of(px, cell)]
    mask = Mask.build(shape, (), _cell_slices(cells, shape, cell)).px
    assert mask[px].all()  # every changed pixel is covered
    cols = -(-shape[1] // cell)
    expected = np.zeros(shape, dtype=bool)
    for c in cells:
        r, k = divmod(c, cols)
        expected[r * cell : (r + 1) * cell, k * cell : (k + 1) * cell] = True
        assert px[r * cell : (r + 1) * cell, k * cell : (k + 1) * cell].any()
    assert np.array_equal(mask, expected)
