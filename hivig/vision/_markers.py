"""Set-of-mark markers: a red open-centre X for point actions, a blue arrow for drags and swipes.

Geometry follows the HiViG reference: every size is derived from
``base = min(W, H)`` of the image being drawn on, with one table per size class. We draw on the
canonical frame, so ``W, H`` are the frame's; the reference drew on the original screenshot (see
``reference_marked_image`` for that mode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from PIL import Image, ImageDraw

from hivig.messages import ArrowMark, Mark, PointMark, SizeClass

POINT_COLOUR = (255, 0, 0)
"""Pure red, as in the reference."""
ARROW_COLOUR = (0, 0, 255)
"""Pure blue, as in the reference."""
GRID = 1000
"""Marks live on the 0–1000 grid relative to the image."""

# Platforms whose screens use the mobile marker table; everything else is a desktop screen.
_MOBILE_PLATFORMS = frozenset({"android", "ios"})


@dataclass(frozen=True)
class MarkerGeometry:
    """Marker sizes in pixels for one image.

    Attributes:
        gap: Half-size of the open centre of the X.
        outer: Half-size of the whole X (gap + arm).
        width: Line width of X arms and arrow shafts.
        head: Arrow-head length (tip to base corners).
    """

    gap: int
    outer: int
    width: int
    head: int


class DrawResult(NamedTuple):
    """What ``draw_marks`` returns; unpacks as ``image, skipped``.

    Attributes:
        image: The marked image (a new image; the input is never modified).
        skipped: Marks not drawn because a coordinate lies outside [0, 1000].
    """

    image: Image.Image
    skipped: int


def size_class_for(width: int, height: int, size_class: SizeClass | None = None) -> SizeClass:
    """The marker size class: the explicit one if given, else portrait means mobile.

    Args:
        width: Image width in pixels.
        height: Image height in pixels.
        size_class: Explicit class from the caller (platform-based); wins when not ``None``.

    Returns:
        ``"desktop"`` or ``"mobile"``.

    Raises:
        ValueError: ``size_class`` is neither ``None``, ``"desktop"`` nor ``"mobile"``.
    """
    if size_class is None:
        return "mobile" if height > width else "desktop"
    if size_class not in ("desktop", "mobile"):
        raise ValueError(f"size_class must be 'desktop' or 'mobile', got {size_class!r}")
    return size_class


def size_class_for_platform(platform: str | None) -> SizeClass | None:
    """Platform-based size class (android → mobile); ``None`` for an unknown platform.

    Args:
        platform: Trajectory platform (``windows``, ``mac``, ``ubuntu``, ``web``, ``android``).

    Returns:
        The size class, or ``None`` so that drawing falls back to the aspect ratio.
    """
    if not platform:
        return None
    return "mobile" if platform.lower() in _MOBILE_PLATFORMS else "desktop"


def marker_geometry(width: int, height: int, size_class: SizeClass) -> MarkerGeometry:
    """Marker sizes for an image of ``width`` × ``height``.

    Args:
        width: Image width in pixels.
        height: Image height in pixels.
        size_class: ``"desktop"`` or ``"mobile"``.

    Returns:
        The geometry; 1920×1080 desktop gives gap 7, outer 16, width 3, head 9.
    """
    base = min(width, height)
    if size_class == "mobile":
        gap = max(6, base // 80)
        arm = max(12, base // 40)
        return MarkerGeometry(gap, gap + arm, max(4, base // 150), max(10, base // 60))
    gap = max(3, base // 150)
    arm = max(4, base // 120)
    return MarkerGeometry(gap, gap + arm, max(2, base // 300), max(6, base // 120))


def _in_range(*coords: int) -> bool:
    return all(0 <= c <= GRID for c in coords)


def _to_px(c: int, extent: int) -> int:
    # Truncation, not rounding, to match the reference's int(rel * W).
    return int(c / GRID * extent)


def _draw_point(draw: ImageDraw.ImageDraw, x: int, y: int, g: MarkerGeometry) -> None:
    # Four arms from the outer corners to the gap corners; the centre stays open so the element
    # under the click remains visible to the model.
    for sx in (-1, 1):
        for sy in (-1, 1):
            outer = (x + sx * g.outer, y + sy * g.outer)
            inner = (x + sx * g.gap, y + sy * g.gap)
            draw.line([outer, inner], fill=POINT_COLOUR, width=g.width)


def _draw_arrow(
    draw: ImageDraw.ImageDraw, x1: int, y1: int, x2: int, y2: int, g: MarkerGeometry
) -> None:
    # A zero-length arrow still gets a head (angle 0): the mark must not vanish silently.
    angle = math.atan2(y2 - y1, x2 - x1)
    # The shaft stops half a head short of the tip so its square end hides inside the triangle.
    shaft_end = (
        round(x2 - 0.5 * g.head * math.cos(angle)),
        round(y2 - 0.5 * g.head * math.sin(angle)),
    )
    draw.line([(x1, y1), shaft_end], fill=ARROW_COLOUR, width=g.width)
    corners = [
        (
            round(x2 - g.head * math.cos(angle + s * math.pi / 6)),
            round(y2 - g.head * math.sin(angle + s * math.pi / 6)),
        )
        for s in (-1, 1)
    ]
    draw.polygon([(x2, y2), *corners], fill=ARROW_COLOUR)


def draw_marks_inplace(
    image: Image.Image, marks: tuple[Mark, ...] | list[Mark], size_class: SizeClass | None = None
) -> int:
    """Draw ``marks`` onto ``image`` itself (RGB); returns how many were skipped as out of range."""
    width, height = image.size
    # Resolve the class first so a bad value fails even when there is nothing to draw.
    resolved = size_class_for(width, height, size_class)
    if not marks:
        return 0
    geometry = marker_geometry(width, height, resolved)
    draw = ImageDraw.Draw(image)
    skipped = 0
    for mark in marks:
        if isinstance(mark, PointMark):
            if not _in_range(mark.x, mark.y):
                skipped += 1
                continue
            _draw_point(draw, _to_px(mark.x, width), _to_px(mark.y, height), geometry)
        elif isinstance(mark, ArrowMark):
            if not _in_range(mark.x1, mark.y1, mark.x2, mark.y2):
                skipped += 1
                continue
            _draw_arrow(
                draw,
                _to_px(mark.x1, width),
                _to_px(mark.y1, height),
                _to_px(mark.x2, width),
                _to_px(mark.y2, height),
                geometry,
            )
        else:
            raise TypeError(f"not a mark: {mark!r}")
    return skipped


def marked_rows(
    marks: tuple[Mark, ...] | list[Mark],
    width: int,
    height: int,
    size_class: SizeClass | None = None,
) -> tuple[int, int]:
    """Rows ``[top, bottom)`` outside which ``draw_marks`` leaves an image of this size as it is.

    A bound, never too small: each shape's rows widened by the line width and a pixel (Pillow
    draws a wide line as a polygon around its centre line). ``(0, 0)`` when nothing is drawn.

    Raises:
        ValueError: ``size_class`` is not a known class.
    """
    g = marker_geometry(width, height, size_class_for(width, height, size_class))
    spans = []
    for mark in marks:
        if isinstance(mark, PointMark) and _in_range(mark.x, mark.y):
            y = _to_px(mark.y, height)
            spans.append((y - g.outer, y + g.outer))
        elif isinstance(mark, ArrowMark) and _in_range(mark.x1, mark.y1, mark.x2, mark.y2):
            y1, y2 = _to_px(mark.y1, height), _to_px(mark.y2, height)
            spans.append((min(y1, y2) - g.head, max(y1, y2) + g.head))
    if not spans:
        return 0, 0
    pad = g.width + 1
    top = max(0, min(lo for lo, _ in spans) - pad)
    bottom = min(height, max(hi for _, hi in spans) + pad + 1)
    return (top, bottom) if top < bottom else (0, 0)


def draw_marks(
    image: Image.Image,
    marks: tuple[Mark, ...] | list[Mark],
    size_class: SizeClass | None = None,
) -> DrawResult:
    """Draw set-of-mark markers on a copy of ``image``.

    Grid coordinates map to pixels as ``int(c / 1000 · W)``. A mark with any coordinate outside
    [0, 1000] is not drawn and is counted in ``DrawResult.skipped``.

    Args:
        image: The image to mark (normally a canonical frame); converted to RGB if needed.
        marks: Point and arrow marks on the 0–1000 grid, drawn in order.
        size_class: ``"desktop"`` / ``"mobile"`` (from the platform); ``None`` picks by aspect
            ratio (portrait → mobile).

    Returns:
        ``DrawResult(image, skipped)``.

    Raises:
        TypeError: An item of ``marks`` is not a ``PointMark`` or ``ArrowMark``.
        ValueError: ``size_class`` is not a known class.
    """
    out = image.convert("RGB") if image.mode != "RGB" else image.copy()
    skipped = draw_marks_inplace(out, marks, size_class)
    return DrawResult(out, skipped)
