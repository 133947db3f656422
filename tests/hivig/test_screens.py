"""The one screen judge (hivig.screens) and its three users: detector, guard, diagnosis."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from hivig.actions import Key, LeftClick, Type
from hivig.config import ConfigError
from hivig.recurrence import new_state, update
from hivig.screens import (
    PLATFORM_MASKS,
    Screen,
    ScreenThresholds,
    compare,
    platform_masks,
    same_screen,
    volatile_boxes,
)
from serve.diagnose.screens import Screens
from serve.guard import frames_match as _frames_match

SIZES = {"windows": (1920, 1080), "mac": (1440, 900), "ubuntu": (1920, 1080), "web": (1280, 800)}
SIZES["android"] = (1080, 2400)
PAGE_CLOCK = (820, 0, 1000, 60)
"""A web page's clock: web has no OS chrome, so the session names the box."""


def _regions(platform: str) -> list[list[int]]:
    return [list(PAGE_CLOCK)] if platform == "web" else []


def _px(box: tuple[int, ...], size: tuple[int, int]) -> tuple[int, int, int, int]:
    """A grid box in pixels, shrunk by 2 px so that it lies inside the masked area."""
    w, h = size
    x1, y1, x2, y2 = box
    return (x1 * w // 1000 + 2, y1 * h // 1000 + 2, x2 * w // 1000 - 3, y2 * h // 1000 - 3)


def _frame(platform: str, clock: int = 0, content: int = 0) -> Image.Image:
    """A screen with some content; ``clock`` repaints the volatile box, ``content`` a panel."""
    size = SIZES[platform]
    img = Image.new("RGB", size, (236, 238, 242))
    d = ImageDraw.Draw(img)
    for row in range(8):
        y = size[1] // 4 + row * size[1] // 20
        d.rectangle((size[0] // 10, y, size[0] * (4 + row % 3) // 10, y + 12), fill=(60, 60, 90))
    box = (*platform_masks(platform), PAGE_CLOCK)[0]
    # The whole volatile box changes (a status-bar redraw): far more than noise, so only the
    # mask can make the two frames the same screen.
    d.rectangle(_px(box, size), fill=(20 + 200 * (clock % 2), 40, 160 - 100 * (clock % 2)))
    if content:
        w, h = size
        d.rectangle((w // 2, h // 2, w // 2 + w // 5, h // 2 + h // 12), fill=(200, 40, 40))
    return img


def _png(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _judgements(platform: str, a: Image.Image, b: Image.Image, tmp_path: Path) -> dict[str, bool]:
    """Same screen?, as the detector, the guard and the diagnosis each answer it."""
    regions = _regions(platform)
    state, _ = update(new_state(platform, regions), a, None)
    _, sig = update(state, b, None)
    pa, pb = tmp_path / "a.png", tmp_path / "b.png"
    pa.write_bytes(_png(a))
    pb.write_bytes(_png(b))
    screens = Screens(volatile_boxes(platform, regions))
    return {
        "detector": sig.change["no_effect"],
        "guard": _frames_match(_png(a), _png(b), platform, regions),
        "diagnosis": screens.same(pa, pb),
        "diagnosis_step": screens.compare(pa, pb).no_effect,
    }


@pytest.mark.parametrize("platform", sorted(PLATFORM_MASKS))
def test_detector_guard_and_diagnosis_judge_a_pair_alike(platform, tmp_path):
    base = _frame(platform)
    clock = _judgements(platform, base, _frame(platform, clock=1), tmp_path)
    assert clock == dict.fromkeys(clock, True), clock  # a new clock: the same screen
    content = _judgements(platform, base, _frame(platform, content=1), tmp_path)
    assert content == dict.fromkeys(content, False), content  # a new panel: another screen
    both = _judgements(platform, base, _frame(platform, clock=1, content=1), tmp_path)
    assert both == dict.fromkeys(both, False), both


@pytest.mark.parametrize("platform", sorted(set(PLATFORM_MASKS) - {"web"}))
def test_the_mask_table_exists_once(platform, tmp_path, monkeypatch):
    # Control: without the platform's entry in hivig.screens' one table, all three see the
    # clock redraw as a change; a copy of the table anywhere would keep one of them blind.
    monkeypatch.setitem(PLATFORM_MASKS, platform, ())
    got = _judgements(platform, _frame(platform), _frame(platform, clock=1), tmp_path)
    assert got == dict.fromkeys(got, False), got


def test_the_session_boxes_count_for_web(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}._regions", lambda platform: [])
    got = _judgements("web", _frame("web"), _frame("web", clock=1), tmp_path)
    assert got == dict.fromkeys(got, False), got


def _typed(img: Image.Image, text: str) -> Image.Image:
    out = img.copy()
    ImageDraw.Draw(out).text((700, 600), text, fill=(0, 0, 0))
    return out


@pytest.mark.parametrize(
    "actions",
    [[], [LeftClick((100, 100))], [LeftClick((600, 540))], [Type("ab")], [Key(("enter",))]],
    ids=["none", "click_far", "click_near", "type", "key"],
)
def test_diagnosis_judges_a_step_as_the_detector_does(actions, tmp_path):
    base = _frame("ubuntu")
    for after in (_frame("ubuntu", clock=1), _typed(base, "ab"), _frame("ubuntu", content=1)):
        state, _ = update(new_state("ubuntu"), base, None)
        _, sig = update(state, after, actions)
        pa, pb = tmp_path / "a.png", tmp_path / "b.png"
        pa.write_bytes(_png(base))
        pb.write_bytes(_png(after))
        got = Screens(volatile_boxes("ubuntu")).compare(pa, pb, actions)
        want = sig.change
        assert (got.identical, got.dhash_dist, got.no_effect, got.region_changed) == (
            want["identical"],
            want["dhash_dist"],
            want["no_effect"],
            want["region_changed"],
        )
        assert round(got.diff_frac, 6) == want["masked_diff_frac"]


def test_typing_is_an_effect_only_where_it_shows():
    base = _frame("ubuntu")
    a, typed = Screen.of(base), Screen.of(_typed(base, "ab"))
    boxes = volatile_boxes("ubuntu")
    assert same_screen(a, typed, boxes)  # two characters are under every global threshold
    assert not compare(a, typed, boxes, [Type("ab")]).no_effect  # but typing may act anywhere
    assert compare(a, a, boxes, [Type("ab")]).no_effect


def test_screens_of_different_sizes_are_never_the_same():
    a = Screen.of(_frame("ubuntu"))
    b = Screen.of(_frame("ubuntu").resize((1280, 720)))
    change = compare(a, b, volatile_boxes("ubuntu"), [LeftClick((500, 500))])
    assert not change.no_effect and change.masked_diff_frac == 1.0
    assert change.region_changed is True
    assert not same_screen(a, b)


def test_volatile_boxes_validate_and_combine():
    assert volatile_boxes("linux", [[0, 950, 100, 1000]]) == (
        *PLATFORM_MASKS["ubuntu"],
        (0, 950, 100, 1000),
    )
    assert volatile_boxes(None) == ()
    with pytest.raises(ValueError, match="unknown platform"):
        volatile_boxes("amiga")
    with pytest.raises(ValueError, match="mask"):
        volatile_boxes("web", [[10, 10, 5, 20]])


@pytest.mark.parametrize(
    "field,value", [("pixel_delta", 255), ("crop_frac", 1.5), ("crop_min_px", 0)]
)
def test_bad_thresholds_name_the_field(field, value):
    with pytest.raises(ConfigError, match=field):
        ScreenThresholds(**{field: value})


def test_undecodable_frames_do_not_match():
    good = _png(_frame("web"))
    assert not _frames_match(good, b"not a png", "web")
    assert not _frames_match(good, "sha256:" + "0" * 64, "web")  # a reference, not pixels
    assert _frames_match(good, good, "web")
