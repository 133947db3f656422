"""The screen judge: whether two screenshots show the same screen, and what one step changed.

Every stage asks this question with the same rules, so the gateway's recurrence detector, the
guard's recovery check and the offline diagnosis judge one pair of screenshots alike::

    boxes = volatile_boxes("ubuntu", session_regions)  # the platform's clock boxes + the session's
    a, b = Screen.of(before_image), Screen.of(after_image)   # box-reduced thumbnails
    same_screen(a, b, boxes)                       # True when nothing but volatile pixels moved
    compare(a, b, boxes, [LeftClick((500, 552))])  # one step's change signals (``ScreenChange``)

How a pair is judged (on RGB/grey thumbnails about 480 px on their long side, so a 1920×1080
screen costs a few milliseconds on one core):

- **Volatile mask**: the platform's clock/status-bar boxes (``PLATFORM_MASKS``) ∪ the caller's
  boxes, blanked in both thumbnails; the recurrence detector adds the cells it learned.
- **Signals**: ``identical`` (masked thumbnails equal), ``dhash_dist`` (global 9×8 dHash Hamming
  distance), ``masked_diff_frac`` (share of unmasked pixels whose grey value moved by more than
  ``pixel_delta``) and ``region_changed`` (a crop around each pointer target; a blinking caret
  alone does not count).
- **Judgement**: ``no_effect`` (the same screen) is ``identical``, or a small masked diff with the
  global hash and every target region unchanged. A step with an action that has no target point
  (``type``, ``key``, raw text) may act anywhere, so for it any changed unmasked pixel is an
  effect (``untargeted_max_px``), a lone caret line aside except when text was typed.
  ``same_screen`` is the judgement without actions.

The R3 paper compares full-resolution pixels; here "identical" means the masked thumbnails are
equal, so a change must move some block average by at least one grey level (one changed pixel of
contrast ≥ ``factor²`` grey levels always does). Screens of different sizes are never the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from hivig.actions.model import (
    PLATFORM_ALIASES,
    Action,
    LeftClickDrag,
    Swipe,
    Type,
    Wait,
    platform_name,
)
from hivig.config import ConfigError
from hivig.vision import (
    GridBox,
    array_fingerprint,
    dhash_array,
    grid_box_px,
    hamming,
    screen_thumbnail,
)

PLATFORM_MASKS: dict[str, tuple[GridBox, ...]] = {
    # Taskbar notification area and clock, bottom right; the app buttons left of it stay
    # watched (clicking one is a common step whose only visible effect may be its highlight).
    "windows": ((870, 955, 1000, 1000),),
    # Menu-bar status items and clock, top right; the app menus on the left stay watched.
    "mac": ((650, 0, 1000, 30),),
    # GNOME top bar: the centred clock and the system menu on the right ("Activities" stays).
    "ubuntu": ((420, 0, 580, 30), (880, 0, 1000, 30)),
    # The whole status bar (clock, battery, signal, notification icons).
    "android": ((0, 0, 1000, 40),),
    # A browser viewport has no OS chrome; page clocks and tickers are the session's boxes (or
    # the detector's learned mask).
    "web": (),
}
"""Volatile regions per platform, on the 0–1000 grid: only what changes by itself."""


def platform_masks(platform: str | None) -> tuple[GridBox, ...]:
    """The volatile regions of a platform (``None``: none).

    Args:
        platform: ``windows``, ``mac``/``macos``, ``ubuntu``/``linux``, ``android``, ``web``.

    Returns:
        Grid boxes ``(x1, y1, x2, y2)`` on 0–1000.

    Raises:
        ValueError: An unknown platform.
    """
    if platform is None:
        return ()
    name = platform_name(platform)
    if name not in PLATFORM_MASKS:
        known = ", ".join(sorted({*PLATFORM_MASKS, *PLATFORM_ALIASES}))
        raise ValueError(f"unknown platform {platform!r}; use one of: {known}")
    return PLATFORM_MASKS[name]


def volatile_boxes(
    platform: str | None, regions: Sequence[Sequence[int]] = ()
) -> tuple[GridBox, ...]:
    """The platform's volatile regions followed by a session's own boxes, checked.

    Args:
        platform: The platform (see ``platform_masks``); ``None`` for none.
        regions: Extra boxes ``(x1, y1, x2, y2)`` on the 0–1000 grid (lists are accepted).

    Returns:
        All boxes, as tuples of ints.

    Raises:
        ValueError: An unknown platform or a malformed box.
    """
    extra = tuple(tuple(int(v) for v in box) for box in regions)
    for box in extra:
        grid_box_px(box, 10, 10)  # type: ignore[arg-type]  # raises on a malformed box
    return (*platform_masks(platform), *extra)  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Thresholds


@dataclass(frozen=True)
class ScreenThresholds:
    """Thresholds of the judgement.

    Defaults: the dHash limits of the common 9×8 difference hash and a grey-level step well
    above PNG/JPEG and resampling noise. Starting points to tune on the project's own
    trajectories; every caller uses the same values unless it passes its own.
    """

    pixel_delta: int = 24
    """Grey-level change (0–255) above which a thumbnail pixel counts as changed."""
    no_effect_frac: float = 0.001
    """The same screen needs fewer changed unmasked pixels than this share (0.1 %)."""
    dhash_unchanged: int = 2
    """Largest global 9×8 dHash distance (of 64 bits) that still counts as unchanged."""
    crop_dhash_unchanged: int = 4
    """Largest dHash distance of a target crop that still counts as unchanged."""
    region_diff_frac: float = 0.004
    """A target crop changed when more than this share of its pixels changed."""
    caret_max_px: int = 6
    """A change at a target confined to a vertical band this narrow (screen pixels) is a blinking
    text caret, not an effect of the action (0 disables the rule)."""
    untargeted_max_px: int = 0
    """A step with an action that has no target point (``type``, ``key``, a scroll without a
    point, raw text) has no effect only when at most this many unmasked thumbnail pixels changed,
    a lone caret band aside. Such an action may act anywhere (typing a few characters changes
    well under ``no_effect_frac`` of the screen), so by default any visible change is an effect."""
    crop_frac: float = 0.10
    """Side of the crop around a pointer target, as a share of the screen's short side."""
    crop_min_px: int = 160
    """Smallest crop side, in screen pixels."""
    thumb_long_side: int = 480
    """Long side of the comparison thumbnail, in pixels (integer box reduction)."""

    def __post_init__(self) -> None:
        if not 0 <= self.pixel_delta < 255:
            raise ConfigError("`screen.pixel_delta` must be in [0, 255)")
        for name in ("no_effect_frac", "region_diff_frac", "crop_frac"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"`screen.{name}` must be in [0, 1]")
        for name in (
            "dhash_unchanged",
            "crop_dhash_unchanged",
            "caret_max_px",
            "untargeted_max_px",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"`screen.{name}` must be >= 0")
        if self.crop_min_px < 1:
            raise ConfigError("`screen.crop_min_px` must be at least 1")
        if self.thumb_long_side < 16:
            raise ConfigError("`screen.thumb_long_side` must be at least 16")


_DEFAULTS = ScreenThresholds()


# ---------------------------------------------------------------------------------------------
# Screens and masks


def grey_of(rgb: np.ndarray) -> np.ndarray:
    """The grey (``L``) version of an ``(h, w, 3)`` uint8 thumbnail, as ``Screen.of`` makes it.

    Args:
        rgb: The RGB thumbnail.

    Returns:
        ``(h, w)`` uint8.
    """
    return np.asarray(Image.fromarray(rgb).convert("L"))


@dataclass(frozen=True, eq=False)  # arrays have no single truth value: compare by identity
class Screen:
    """One screenshot as the judge sees it.

    Attributes:
        rgb: The box-reduced RGB thumbnail, ``(h, w, 3)`` uint8.
        grey: Its grey version, ``(h, w)`` uint8.
        factor: The reduction factor (screen pixels per thumbnail pixel).
        size: ``(width, height)`` of the screenshot, in pixels.
    """

    rgb: np.ndarray = field(repr=False)
    grey: np.ndarray = field(repr=False)
    factor: int
    size: tuple[int, int]

    @classmethod
    def of(cls, image: Image.Image, thresholds: ScreenThresholds | None = None) -> Screen:
        """The thumbnail of a decoded screenshot (any size and mode).

        Args:
            image: The screenshot.
            thresholds: For the thumbnail size (defaults if ``None``).

        Returns:
            The screen.
        """
        thr = thresholds or _DEFAULTS
        thumb, factor = screen_thumbnail(image, thr.thumb_long_side)
        return cls(np.asarray(thumb), np.asarray(thumb.convert("L")), factor, image.size)

    @property
    def shape(self) -> tuple[int, int]:
        """``(height, width)`` of the thumbnail."""
        return self.rgb.shape[0], self.rgb.shape[1]


Slices = tuple[tuple[int, int, int, int], ...]
"""Masked rectangles ``(y1, y2, x1, x2)`` in thumbnail pixels (zeroing by slice is far cheaper
than boolean indexing of an RGB array)."""


@dataclass(frozen=True, eq=False)
class Mask:
    """The volatile mask of one thumbnail shape, as rectangles and as a boolean array."""

    slices: Slices
    px: np.ndarray = field(repr=False)
    """bool ``(h, w)``, True = volatile."""

    @classmethod
    def build(
        cls, shape: tuple[int, int], boxes: Sequence[GridBox] = (), extra: Slices = ()
    ) -> Mask:
        """The mask of grid ``boxes`` (rounded outwards) plus ``extra`` thumbnail rectangles.

        Args:
            shape: ``(height, width)`` of the thumbnail.
            boxes: Grid boxes on 0–1000 (``volatile_boxes``).
            extra: More rectangles ``(y1, y2, x1, x2)`` in thumbnail pixels (learned cells).

        Returns:
            The mask.

        Raises:
            ValueError: A malformed box.
        """
        h, w = shape
        slices: list[tuple[int, int, int, int]] = []
        for box in boxes:
            x1, y1, x2, y2 = grid_box_px(box, w, h)
            slices.append((y1, y2, x1, x2))
        slices.extend(extra)
        px = np.zeros(shape, dtype=bool)
        for y1, y2, x1, x2 in slices:
            px[y1:y2, x1:x2] = True
        return cls(tuple(slices), px)

    def zeroed(self, arr: np.ndarray) -> np.ndarray:
        """A copy of ``arr`` (or ``arr`` itself when nothing is masked) with the mask zeroed.

        Args:
            arr: A thumbnail of the mask's shape, ``(h, w)`` or ``(h, w, c)``.

        Returns:
            The masked array.
        """
        if not self.slices:
            return arr
        out = arr.copy()
        for y1, y2, x1, x2 in self.slices:
            out[y1:y2, x1:x2] = 0
        return out


def screen_key(screen: Screen, mask: Mask) -> str:
    """The masked screen's identity: 16 hex digits of its thumbnail's exact fingerprint.

    Args:
        screen: The screen.
        mask: The mask of its shape.

    Returns:
        The first 16 hex digits of ``array_fingerprint`` of the masked RGB thumbnail.
    """
    return array_fingerprint(mask.zeroed(screen.rgb))[:16]


# ---------------------------------------------------------------------------------------------
# Action targets


def action_points(action: Action) -> tuple[tuple[int, int], ...]:
    """Pointer targets of an action on the 0–1000 grid (drag: start, if known, then end).

    Args:
        action: A typed action.

    Returns:
        The points; empty for an action without a target (``type``, ``key``, a bare scroll).
    """
    if isinstance(action, LeftClickDrag):
        return tuple(p for p in (action.start, action.coordinate) if p is not None)
    if isinstance(action, Swipe):
        return (action.coordinate, action.coordinate2)
    coord = getattr(action, "coordinate", None)
    return (tuple(coord),) if coord is not None else ()  # type: ignore[return-value]


def _crop_boxes(
    points: Sequence[tuple[int, int]], screen: Screen, thr: ScreenThresholds
) -> list[tuple[int, int, int, int]]:
    """Thumbnail-pixel boxes ``(y1, y2, x1, x2)`` centred on each pointer target."""
    h, w = screen.shape
    side_px = max(thr.crop_frac * min(screen.size), thr.crop_min_px)
    half = max(1, round(side_px / screen.factor / 2))
    boxes = []
    for x, y in points:
        cx, cy = min(w - 1, int(x * w / 1000)), min(h - 1, int(y * h / 1000))
        boxes.append((max(0, cy - half), min(h, cy + half), max(0, cx - half), min(w, cx + half)))
    return boxes


def _untargeted(
    actions: Sequence[Action | str], screen: Screen, thr: ScreenThresholds
) -> tuple[bool, int]:
    """``(has_untargeted_action, caret_rows)`` of a step.

    An action is untargeted when it has no pointer target (raw text included; waits are not
    actions here). A blinking caret is allowed for as a line up to a target crop's side tall
    (a caret is a line of text tall) — except when the step types text: a field whose caret
    blinks has the focus, so the typed characters would show, and a narrow character such as
    "i" changes no more of a thumbnail than a caret does.
    """
    untargeted = any(
        isinstance(a, str) or (not isinstance(a, Wait) and not action_points(a)) for a in actions
    )
    if not untargeted or any(isinstance(a, Type) and a.text for a in actions):
        return untargeted, 0
    side = max(thr.crop_frac * min(screen.size), thr.crop_min_px)
    return True, max(1, round(side / screen.factor))


def _caret_cols(factor: int, thr: ScreenThresholds) -> int:
    """Thumbnail columns a caret line of up to ``caret_max_px`` can cover (0: rule off)."""
    # A caret line can straddle one more thumbnail column than its width needs.
    return math.ceil(thr.caret_max_px / factor) + 1 if thr.caret_max_px else 0


def _is_caret_line(changed: np.ndarray, caret_cols: int, caret_rows: int) -> bool:
    """Whether all changed pixels form one upright line, as a text caret's blink does.

    The line is under ``caret_cols`` columns wide, at least twice as tall as wide and under
    ``caret_rows`` rows tall.
    """
    cols = np.flatnonzero(changed.any(axis=0))
    if not cols.size or cols[-1] - cols[0] >= caret_cols:
        return False
    rows = np.flatnonzero(changed[:, cols[0] : cols[-1] + 1].any(axis=1))
    width, height = cols[-1] - cols[0] + 1, rows[-1] - rows[0] + 1
    return bool(2 * width <= height < caret_rows)


def _untargeted_still(
    changed: np.ndarray, n_changed: int, factor: int, caret_rows: int, thr: ScreenThresholds
) -> bool:
    """The untargeted rule: at most ``untargeted_max_px`` changed pixels, or a lone caret line.

    ``caret_rows`` = 0 allows no caret.
    """
    if n_changed <= thr.untargeted_max_px:
        return True
    caret_cols = _caret_cols(factor, thr)
    # Cheap bound first: more changed pixels than the band holds cannot be a caret.
    if not caret_cols or n_changed > caret_cols * caret_rows:
        return False
    return _is_caret_line(changed, caret_cols, caret_rows)


# ---------------------------------------------------------------------------------------------
# The judgement


@dataclass(frozen=True)
class ScreenChange:
    """How the screen changed from one screenshot to the next (see the module docstring).

    Attributes:
        identical: The masked thumbnails are equal.
        dhash_dist: Hamming distance of the masked global 9×8 dHashes.
        region_changed: Whether a crop around a pointer target changed (``None``: no target).
        masked_diff_frac: Share of unmasked thumbnail pixels that changed by more than
            ``pixel_delta`` (1.0 across a change of screen size).
        no_effect: The same screen: nothing but volatile or sub-threshold pixels moved.
        changed_px: bool ``(h, w)``, the changed unmasked thumbnail pixels (what the detector
            learns volatile cells from); all False across a change of size.
    """

    identical: bool
    dhash_dist: int
    region_changed: bool | None
    masked_diff_frac: float
    no_effect: bool
    changed_px: np.ndarray = field(repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        """The gateway's ``change`` object (JSON-serialisable)."""
        return {
            "identical": self.identical,
            "dhash_dist": self.dhash_dist,
            "region_changed": self.region_changed,
            "masked_diff_frac": round(self.masked_diff_frac, 6),
            "no_effect": self.no_effect,
        }


def compare(
    before: Screen,
    after: Screen,
    boxes: Sequence[GridBox] = (),
    actions: Sequence[Action | str] = (),
    thresholds: ScreenThresholds | None = None,
    *,
    mask: Mask | None = None,
) -> ScreenChange:
    """The change from ``before`` to ``after`` when ``actions`` ran in between.

    Args:
        before: The earlier screen.
        after: The later screen.
        boxes: Volatile grid boxes (``volatile_boxes``).
        actions: The actions executed in between, typed or as raw text; none (or only waits)
            judges the pair as ``same_screen`` does.
        thresholds: Defaults if ``None``.
        mask: The volatile mask of ``after``'s shape when the caller built one (the detector's,
            with its learned cells); by default ``boxes`` alone. Ignored across a change of size.

    Returns:
        The change signals.
    """
    thr = thresholds or _DEFAULTS
    points = [p for a in actions if not isinstance(a, str) for p in action_points(a)]
    crops = _crop_boxes(points, after, thr)
    if before.shape != after.shape:
        return _resized(before, after, boxes, bool(crops))
    mask = mask if mask is not None else Mask.build(after.shape, boxes)
    return _compare_masked(before, after, mask, crops, _untargeted(actions, after, thr), thr)


def same_screen(
    a: Screen,
    b: Screen,
    boxes: Sequence[GridBox] = (),
    thresholds: ScreenThresholds | None = None,
) -> bool:
    """Whether ``b`` shows the same screen as ``a``: ``compare`` without actions.

    Args:
        a: The reference screen (e.g. a recovery target's screenshot).
        b: The screen to check.
        boxes: Volatile grid boxes (``volatile_boxes``).
        thresholds: Defaults if ``None``.

    Returns:
        True when nothing but volatile or sub-threshold pixels differ.
    """
    return compare(a, b, boxes, (), thresholds).no_effect


def _resized(
    before: Screen, after: Screen, boxes: Sequence[GridBox], has_targets: bool
) -> ScreenChange:
    """Signals across a change of screen size: always a change; the dHash still compares."""
    prev_g = Mask.build(before.shape, boxes).zeroed(before.grey)
    cur_g = Mask.build(after.shape, boxes).zeroed(after.grey)
    dist = hamming(dhash_array(prev_g), dhash_array(cur_g))
    nothing = np.zeros(after.shape, dtype=bool)
    return ScreenChange(False, dist, True if has_targets else None, 1.0, False, nothing)


def _compare_masked(
    before: Screen,
    after: Screen,
    mask: Mask,
    crops: list[tuple[int, int, int, int]],
    untargeted: tuple[bool, int],
    thr: ScreenThresholds,
) -> ScreenChange:
    """Change signals between two equally sized screens under one mask.

    ``untargeted`` is ``(has_untargeted_action, caret_rows)``: a step with an action without a
    target point can act anywhere, so ``untargeted_max_px`` bounds its change instead of
    ``no_effect_frac``; a lone caret line up to ``caret_rows`` thumbnail rows tall is not an
    effect (0: no allowance).
    """
    if np.array_equal(before.rgb, after.rgb):
        # The common no-effect case, without any per-pixel work.
        nothing = np.zeros(mask.px.shape, dtype=bool)
        return ScreenChange(True, 0, False if crops else None, 0.0, True, nothing)
    keep = ~mask.px
    # |a - b| on uint8 without widening: max - min never wraps.
    delta = np.maximum(before.grey, after.grey) - np.minimum(before.grey, after.grey)
    changed = (delta > thr.pixel_delta) & keep
    n_changed = int(np.count_nonzero(changed))
    kept = int(np.count_nonzero(keep))
    frac = n_changed / kept if kept else 0.0
    # A visibly changed unmasked pixel settles it; otherwise compare the masked colours exactly.
    identical = n_changed == 0 and bool(
        np.array_equal(mask.zeroed(before.rgb), mask.zeroed(after.rgb))
    )
    prev_g, cur_g = mask.zeroed(before.grey), mask.zeroed(after.grey)
    dist = hamming(dhash_array(prev_g), dhash_array(cur_g))
    region = _region_changed(changed, prev_g, cur_g, crops, after.factor, thr) if crops else None
    # Besides the paper's identity rule, a sub-threshold diff counts as "no effect" only when
    # neither the global structure (dHash) nor the area around the target moved.
    no_effect = identical or (
        frac < thr.no_effect_frac and dist <= thr.dhash_unchanged and region is not True
    )
    if no_effect and not identical and untargeted[0]:
        # Typing "Acme Ltd" into a field changes about 0.06 % of the screen, under the global
        # share, and there is no target crop to see it: any visible change is the action's.
        no_effect = _untargeted_still(changed, n_changed, after.factor, untargeted[1], thr)
    return ScreenChange(identical, dist, region, frac, no_effect, changed)


def _region_changed(
    changed: np.ndarray,
    prev_g: np.ndarray,
    cur_g: np.ndarray,
    crops: list[tuple[int, int, int, int]],
    factor: int,
    thr: ScreenThresholds,
) -> bool:
    """Whether any target crop changed (by its changed-pixel share or its own dHash)."""
    caret_cols = _caret_cols(factor, thr)
    for y1, y2, x1, x2 in crops:
        if y2 <= y1 or x2 <= x1:
            continue
        crop_changed = changed[y1:y2, x1:x2]
        if caret_cols and _is_caret_line(crop_changed, caret_cols, y2 - y1 + 1):
            # Everything that moved is one thin upright line: the text caret of the field the
            # pointer is in blinked. Counting it would hide every repeated click into an
            # already focused field. (A changed digit or a radio dot is not that thin.)
            continue
        crop_frac = float(np.count_nonzero(crop_changed)) / crop_changed.size
        crop_dist = hamming(dhash_array(prev_g[y1:y2, x1:x2]), dhash_array(cur_g[y1:y2, x1:x2]))
        if crop_frac > thr.region_diff_frac or crop_dist > thr.crop_dhash_unchanged:
            return True
    return False


__all__ = [
    "PLATFORM_MASKS",
    "Mask",
    "Screen",
    "ScreenChange",
    "ScreenThresholds",
    "Slices",
    "action_points",
    "compare",
    "grey_of",
    "platform_masks",
    "same_screen",
    "screen_key",
    "volatile_boxes",
]
