"""Set-of-mark markers: geometry table, golden pixel hashes, open centre, skipping, size classes."""

from __future__ import annotations

import hashlib
import math

import pytest
from PIL import Image

from hivig.messages import ArrowMark, PointMark
from hivig.vision import (
    ARROW_COLOUR,
    POINT_COLOUR,
    MarkerGeometry,
    canonical_frame,
    draw_marks,
    marker_geometry,
    reference_marked_image,
    size_class_for,
    size_class_for_platform,
)

MIN_PX = 65_536
MAX_PX = 1_048_576
WHITE = (255, 255, 255)

# Golden hashes: sha256 of the raw RGB bytes of a white canonical frame with one mark drawn.
# A change here changes what the model sees at train and serve time: bump the marker version
# deliberately, never just re-pin.
GOLDEN = {
    ("desktop", "x"): "2f5055025c29221d2f18ad6c7dc2ca38716de972ee773f9431135225b6afdc4e",
    ("desktop", "arrow"): "10b8f9d6cb53ee0c28c8e21dd9899c6d2b10f59ab9f24decf5b5378e7ef077d9",
    ("phone", "x"): "6da414a5826e054ed6f02179b5c13ce44088e8eaa4433b98717266219c171009",
    ("phone", "arrow"): "e5a3b604f2cd186d7e536b212c19b711d85e36e38144340e128892705f3db807",
}
SCREENS = {"desktop": (1920, 1080), "phone": (1080, 2400)}
MARKS = {"x": PointMark(500, 500), "arrow": ArrowMark(200, 700, 650, 300)}


def _white_frame(screen: str) -> Image.Image:
    return canonical_frame(
        Image.new("RGB", SCREENS[screen], WHITE), min_pixels=MIN_PX, max_pixels=MAX_PX
    )


def _sha(img: Image.Image) -> str:
    return hashlib.sha256(img.tobytes()).hexdigest()


@pytest.mark.parametrize(("screen", "mark"), sorted(GOLDEN))
def test_golden_marker_pixels(screen, mark):
    frame = _white_frame(screen)
    result = draw_marks(frame, (MARKS[mark],))
    assert result.skipped == 0
    assert _sha(result.image) == GOLDEN[(screen, mark)]


def test_golden_hashes_can_fail():
    # Negative control: moving a mark by one grid unit changes the pinned hash.
    frame = _white_frame("desktop")
    moved = draw_marks(frame, (PointMark(501, 500),)).image
    assert _sha(moved) != GOLDEN[("desktop", "x")]


@pytest.mark.parametrize(
    ("size", "size_class", "expected"),
    [
        ((1920, 1080), "desktop", MarkerGeometry(gap=7, outer=16, width=3, head=9)),
        ((1080, 2400), "mobile", MarkerGeometry(gap=13, outer=40, width=7, head=18)),
        ((1344, 768), "desktop", MarkerGeometry(gap=5, outer=11, width=2, head=6)),
        ((672, 1504), "mobile", MarkerGeometry(gap=8, outer=24, width=4, head=11)),
        ((64, 64), "desktop", MarkerGeometry(gap=3, outer=7, width=2, head=6)),  # floors
        ((64, 64), "mobile", MarkerGeometry(gap=6, outer=18, width=4, head=10)),
    ],
)
def test_marker_geometry_table(size, size_class, expected):
    assert marker_geometry(*size, size_class) == expected


def test_x_centre_is_open_and_arms_are_red():
    frame = _white_frame("desktop")  # 1344×768, desktop: gap 5, outer 11, width 2
    img = draw_marks(frame, (PointMark(500, 500),)).image
    cx, cy = int(0.5 * 1344), int(0.5 * 768)
    g = marker_geometry(1344, 768, "desktop")
    # The open centre: everything strictly inside the gap square minus the line half-width.
    inner = g.gap - g.width
    for dx in range(-inner, inner + 1):
        for dy in range(-inner, inner + 1):
            assert img.getpixel((cx + dx, cy + dy)) == WHITE, (dx, dy)
    # The four arms: the midpoints between gap and outer corner on each diagonal are red.
    mid = (g.gap + g.outer) // 2
    for sx in (-1, 1):
        for sy in (-1, 1):
            assert img.getpixel((cx + sx * mid, cy + sy * mid)) == POINT_COLOUR
    # Nothing beyond the outer corner (plus the line width).
    reach = g.outer + g.width
    assert img.getpixel((cx + reach + 1, cy + reach + 1)) == WHITE
    assert img.getpixel((cx, cy + mid)) == WHITE  # no vertical stroke: it is an X, not a +


def test_arrow_tip_head_and_shaft_are_blue():
    frame = _white_frame("desktop")
    img = draw_marks(frame, (ArrowMark(100, 500, 600, 500),)).image
    x1, x2, y = int(0.1 * 1344), int(0.6 * 1344), int(0.5 * 768)
    g = marker_geometry(1344, 768, "desktop")
    assert img.getpixel((x2, y)) == ARROW_COLOUR  # tip exactly at the end point
    assert img.getpixel((x1, y)) == ARROW_COLOUR  # shaft starts at the start point
    assert img.getpixel(((x1 + x2) // 2, y)) == ARROW_COLOUR
    # Base corners of the head at ±30° from the reversed direction, `head` away from the tip.
    for s in (-1, 1):
        bx = round(x2 - g.head * math.cos(s * math.pi / 6))
        by = round(y - g.head * math.sin(s * math.pi / 6))
        assert img.getpixel((bx, by)) == ARROW_COLOUR
    assert img.getpixel((x2 + 2, y)) == WHITE  # nothing past the tip
    assert img.getpixel(((x1 + x2) // 2, y + g.head)) == WHITE


def test_out_of_range_marks_are_skipped_and_counted():
    frame = _white_frame("desktop")
    bad = (
        PointMark(-1, 500),
        PointMark(500, 1001),
        ArrowMark(0, 0, 1200, 10),
        ArrowMark(10, -5, 20, 20),
    )
    result = draw_marks(frame, bad)
    assert result.skipped == 4
    assert result.image.tobytes() == frame.tobytes()
    mixed = draw_marks(frame, (PointMark(500, 500), *bad))
    assert mixed.skipped == 4
    assert _sha(mixed.image) == GOLDEN[("desktop", "x")]


def test_grid_edges_are_in_range():
    frame = _white_frame("desktop")
    result = draw_marks(frame, (PointMark(0, 0), PointMark(1000, 1000)))
    assert result.skipped == 0
    assert result.image.getpixel((8, 8)) == POINT_COLOUR  # the corner X's lower-right arm


def test_draw_marks_does_not_modify_input_and_unpacks():
    frame = _white_frame("desktop")
    before = frame.tobytes()
    img, skipped = draw_marks(frame, (PointMark(500, 500),))
    assert skipped == 0 and img is not frame
    assert frame.tobytes() == before


def test_draw_marks_rejects_non_marks():
    with pytest.raises(TypeError):
        draw_marks(_white_frame("desktop"), ((500, 500),))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size_class"):
        draw_marks(_white_frame("desktop"), (), size_class="tablet")  # type: ignore[arg-type]


def test_size_class_explicit_wins_over_aspect_ratio():
    assert size_class_for(1920, 1080) == "desktop"
    assert size_class_for(1080, 2400) == "mobile"
    assert size_class_for(1000, 1000) == "desktop"
    assert size_class_for(1920, 1080, "mobile") == "mobile"
    frame = _white_frame("desktop")
    by_ratio = draw_marks(frame, (PointMark(500, 500),)).image
    as_mobile = draw_marks(frame, (PointMark(500, 500),), size_class="mobile").image
    assert _sha(by_ratio) != _sha(as_mobile)


def test_size_class_for_platform():
    assert size_class_for_platform("android") == "mobile"
    assert size_class_for_platform("windows") == "desktop"
    assert size_class_for_platform("web") == "desktop"
    assert size_class_for_platform(None) is None


def test_canonical_frame_draws_after_resizing():
    marks = (PointMark(500, 500),)
    direct = canonical_frame(
        Image.new("RGB", (1920, 1080), WHITE), min_pixels=MIN_PX, max_pixels=MAX_PX, marks=marks
    )
    assert _sha(direct) == GOLDEN[("desktop", "x")]


def test_reference_mode_draws_on_the_original_resolution():
    src = Image.new("RGB", (1920, 1080), WHITE)
    img, skipped = reference_marked_image(src, (PointMark(500, 500), PointMark(2000, 0)))
    assert skipped == 1 and img.size == (1920, 1080)
    g = marker_geometry(1920, 1080, "desktop")  # gap 7, outer 16 on the original screen
    cx, cy = 960, 540
    mid = (g.gap + g.outer) // 2
    assert img.getpixel((cx + mid, cy + mid)) == POINT_COLOUR
    assert img.getpixel((cx, cy)) == WHITE
    assert src.getpixel((cx + mid, cy + mid)) == WHITE
