"""Screen–action recurrence detector: change signals, repeat counting and cycles (R3-style).

Pure functions; the caller (the gateway) holds one ``DetectorState`` per session, persists it as
JSON and calls ``update`` on every observe::

    state = new_state(platform="ubuntu", volatile_regions=[(0, 0, 1000, 30)])
    state, sig = update(state, first_screen, None, config)            # step 0 registers
    state, sig = update(state, next_screen, [LeftClick((500, 552))], config)
    sig.change      # {"identical", "dhash_dist", "region_changed", "masked_diff_frac", "no_effect"}
    sig.recurrence  # {"same_key_no_effect_run", "cycle_len", "screen_revisits", "r3_trigger",
                    #  "action_key", "screen_key"}
    recurrence_note(sig)  # one plain-English line when a repeat or cycle is flagged, else None

How a step is judged (all on a grey/RGB thumbnail about 480 px on its long side, so a 1920×1080
screen costs a few milliseconds on one core):

- **Volatile mask** = the platform's clock/status-bar boxes ∪ the session's boxes ∪ a mask learned
  from cells that keep changing unprompted: in ``learn_min_hits`` of the recent frames that
  changed without any action (a wait, or a re-capture with ``actions=None``) or in a no-effect
  step. A spinner or a clock is learned after a few ticks; a one-off change during a wait (a
  report replacing its spinner) is content arriving, reported as a change and kept watched.
- **Change**: ``identical`` (masked thumbnails equal), ``dhash_dist`` (global 9×8 dHash Hamming
  distance), ``masked_diff_frac`` (share of unmasked pixels whose grey value moved by more than
  ``pixel_delta``) and ``region_changed`` (a crop around each pointer target; a blinking caret
  alone does not count). ``no_effect`` is ``identical``, or a small masked diff with the global
  hash and every target region unchanged. A step with an action that has no target point
  (``type``, ``key``, raw text) may act anywhere, so for it any changed unmasked pixel is an
  effect (``untargeted_max_px``), a lone caret line aside except when text was typed.
- **Recurrence**: consecutive single, non-wait actions with the same relaxed action key and no
  effect (R3's trigger, ``k`` = 2 by default); the shortest screen-continuous return of 2–8
  action transitions, grouped up to rotation and reported from its second traversal on; and how
  often the current screen was entered before.

The R3 paper's detector compares full-resolution pixels; here "identical" means the masked
thumbnails are equal, so a change must move some block average by at least one grey level (one
changed pixel of contrast ≥ ``factor²`` grey levels always does).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from hivig.actions.model import (
    PLATFORM_ALIASES,
    Action,
    Answer,
    CallUser,
    HScroll,
    Key,
    LeftClickDrag,
    LongPress,
    MobileKey,
    Open,
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    Type,
    Wait,
    platform_name,
)
from hivig.config import ConfigError
from hivig.vision._fingerprint import (
    GridBox,
    dhash_array,
    grid_box_px,
    hamming,
    mask_array,
    screen_thumbnail,
)
from hivig.vision._frame import deflate

logger = logging.getLogger(__name__)

STATE_VERSION = 1
"""Version of the ``DetectorState`` JSON layout; ``from_json`` refuses other versions."""

PLATFORM_MASKS: dict[str, tuple[GridBox, ...]] = {
    # Taskbar notification area and clock, bottom right.
    "windows": ((870, 955, 1000, 1000),),
    # Menu-bar status items and clock, top right.
    "mac": ((650, 0, 1000, 30),),
    # GNOME top bar: the centred clock and the system menu on the right.
    "ubuntu": ((420, 0, 580, 30), (880, 0, 1000, 30)),
    # The whole status bar (clock, battery, signal, notification icons).
    "android": ((0, 0, 1000, 40),),
    # A browser viewport has no OS chrome; page clocks and tickers are left to the learned mask.
    "web": (),
}
"""Default volatile regions per platform, on the 0–1000 grid."""


def platform_masks(platform: str | None) -> tuple[GridBox, ...]:
    """The default volatile regions of a platform (``None``: no defaults).

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


# ---------------------------------------------------------------------------------------------
# Config


@dataclass
class DetectorConfig:
    """Thresholds of the detector.

    Defaults: R3's cycle bound (8 transitions) and no-wait, single-action trigger; ``k`` = 2 as in
    GUI agents that give up after two unchanged repeats; dHash limits of the common 9×8
    difference hash. All are starting points to tune on the project's own trajectories.
    """

    k: int = 2
    """R3 trigger: consecutive no-effect executions of one single, non-wait action key."""
    max_cycle: int = 8
    """Longest screen–action cycle searched, in transitions (R3 paper: 8)."""
    revisit_window: int = 30
    """How many recent screen entries ``screen_revisits`` counts over."""
    pixel_delta: int = 24
    """Grey-level change (0–255) above which a thumbnail pixel counts as changed."""
    no_effect_frac: float = 0.001
    """``no_effect`` needs fewer changed unmasked pixels than this share (0.1 %)."""
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
    coord_tol_frac: float = 0.004
    """Relaxed action keys: pointer targets this close (share of the screen diagonal) match."""
    coord_tol_min_px: float = 8.0
    """Smallest coordinate tolerance, in screen pixels."""
    thumb_long_side: int = 480
    """Long side of the comparison thumbnail, in pixels (integer box reduction)."""
    learn_cell_px: int = 8
    """Learned-mask cell side, in thumbnail pixels (32 screen px at 1920×1080)."""
    learn_max_step_frac: float = 0.01
    """A no-action change counts towards the learned mask only when it covers at most this share
    of the frame; bigger changes (a page finishing loading during a wait) are content, not
    noise."""
    learn_max_total_frac: float = 0.15
    """The learned mask never grows beyond this share of the frame."""
    learn_min_hits: int = 3
    """A cell becomes volatile once it changed in this many recent unprompted steps (frames
    without an action, wait steps, no-effect action steps); a one-off change, such as a report
    replacing its spinner during a wait, is content arriving and stays watched."""
    learn_window: int = 16
    """How many recent unprompted steps with a change the hit count looks at. A cell of an
    n-phase spinner changes twice a turn, so its third hit comes within n + 1 ticks: 16 covers
    spinners of up to 15 phases."""

    def __post_init__(self) -> None:
        positive = ("k", "max_cycle", "revisit_window", "crop_min_px", "learn_cell_px")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"`recurrence.{name}` must be at least 1")
        if self.max_cycle < 2:
            raise ConfigError("`recurrence.max_cycle` must be at least 2 (a cycle has 2 steps)")
        if not 0 <= self.pixel_delta < 255:
            raise ConfigError("`recurrence.pixel_delta` must be in [0, 255)")
        for name in (
            "no_effect_frac",
            "region_diff_frac",
            "crop_frac",
            "coord_tol_frac",
            "learn_max_step_frac",
            "learn_max_total_frac",
        ):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"`recurrence.{name}` must be in [0, 1]")
        for name in ("caret_max_px", "untargeted_max_px"):
            if getattr(self, name) < 0:
                raise ConfigError(f"`recurrence.{name}` must be >= 0")
        if self.thumb_long_side < 16:
            raise ConfigError("`recurrence.thumb_long_side` must be at least 16")
        if self.learn_min_hits < 1 or self.learn_window < self.learn_min_hits:
            raise ConfigError("`recurrence.learn_window` must be >= learn_min_hits >= 1")


# ---------------------------------------------------------------------------------------------
# State


@dataclass(frozen=True)
class DetectorState:
    """Everything the detector remembers about one session; JSON round-trips (``to_json``).

    Attributes:
        platform: Platform whose default masks apply (``None``: none).
        volatile_regions: The session's own volatile boxes, 0–1000 grid.
        steps: Frames seen so far.
        frame_size: ``(width, height)`` of the last frame, in pixels.
        factor: Thumbnail reduction factor of the last frame.
        thumb: The last frame's RGB thumbnail, ``(h, w, 3)`` uint8 (not compared by ``==``).
        grey: Its grey version (derived, not serialised).
        screen_key: The last frame's screen key.
        learned_cells: Indices (row-major) of learned volatile cells on the cell grid.
        noeffect_cells: Changed cells of recent unprompted steps (no action, a wait, or an
            action without effect), oldest first; a cell in ``learn_min_hits`` of them is learned.
        run_key: Relaxed key of the current no-effect run.
        run_screen: Screen key the run happens on.
        run_len: Length of the run.
        trail_screens: Screens of the recent screen-continuous path, oldest first.
        trail_keys: Action key of each transition of the path (``None``: a wait or a change
            without an action, which no cycle may contain).
        cycle_counts: Traversals per cycle signature (canonical rotation), oldest first.
        visits: Recent screen entries (a key is appended when the screen changes).
        anchors: Relaxed-key anchors: ``[shape, [[x, y], ...], key]``, newest last.
    """

    platform: str | None = None
    volatile_regions: tuple[GridBox, ...] = ()
    steps: int = 0
    frame_size: tuple[int, int] | None = None
    factor: int = 1
    thumb: np.ndarray | None = field(default=None, compare=False, repr=False)
    grey: np.ndarray | None = field(default=None, compare=False, repr=False)
    screen_key: str | None = None
    learned_cells: tuple[int, ...] = ()
    noeffect_cells: tuple[tuple[int, ...], ...] = ()
    run_key: str | None = None
    run_screen: str | None = None
    run_len: int = 0
    trail_screens: tuple[str, ...] = ()
    trail_keys: tuple[str | None, ...] = ()
    cycle_counts: tuple[tuple[str, int], ...] = ()
    visits: tuple[str, ...] = ()
    anchors: tuple[tuple[str, tuple[tuple[int, int], ...], str], ...] = ()

    def to_json(self) -> str:
        """Serialise to a JSON string (the thumbnail as zlib-compressed base64)."""
        obj: dict[str, Any] = {"version": STATE_VERSION}
        for f in dataclasses.fields(self):
            if f.name not in ("thumb", "grey"):
                obj[f.name] = getattr(self, f.name)
        if self.thumb is not None:
            h, w, _c = self.thumb.shape
            raw = deflate(np.ascontiguousarray(self.thumb).data, 1)
            obj["thumb"] = {"w": w, "h": h, "rgb_zlib_b64": base64.b64encode(raw).decode()}
        return json.dumps(obj, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> DetectorState:
        """Rebuild a state from ``to_json`` output.

        Raises:
            ValueError: Not a detector state of this version, or a corrupt field.
        """
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict) or obj.get("version") != STATE_VERSION:
                raise ValueError(f"not a version-{STATE_VERSION} detector state")
            thumb = None
            if obj.get("thumb") is not None:
                t = obj["thumb"]
                raw = zlib.decompress(base64.b64decode(t["rgb_zlib_b64"]))
                thumb = np.frombuffer(raw, dtype=np.uint8).reshape(t["h"], t["w"], 3).copy()
            size = obj.get("frame_size")
            return cls(
                platform=obj.get("platform"),
                volatile_regions=tuple(tuple(b) for b in obj.get("volatile_regions", ())),
                steps=int(obj.get("steps", 0)),
                frame_size=tuple(size) if size else None,
                factor=int(obj.get("factor", 1)),
                thumb=thumb,
                grey=_grey_of(thumb) if thumb is not None else None,
                screen_key=obj.get("screen_key"),
                learned_cells=tuple(obj.get("learned_cells", ())),
                noeffect_cells=tuple(tuple(c) for c in obj.get("noeffect_cells", ())),
                run_key=obj.get("run_key"),
                run_screen=obj.get("run_screen"),
                run_len=int(obj.get("run_len", 0)),
                trail_screens=tuple(obj.get("trail_screens", ())),
                trail_keys=tuple(obj.get("trail_keys", ())),
                cycle_counts=tuple((str(s), int(n)) for s, n in obj.get("cycle_counts", ())),
                visits=tuple(obj.get("visits", ())),
                anchors=tuple(
                    (str(shape), tuple((int(x), int(y)) for x, y in pts), str(key))
                    for shape, pts, key in obj.get("anchors", ())
                ),
            )
        except (KeyError, TypeError, zlib.error, json.JSONDecodeError) as exc:
            raise ValueError(f"corrupt detector state: {exc}") from exc


def new_state(
    platform: str | None = None, volatile_regions: Sequence[GridBox] = ()
) -> DetectorState:
    """A fresh session state.

    Args:
        platform: The session's platform (its default masks apply); ``None`` for none.
        volatile_regions: The session's extra volatile boxes on the 0–1000 grid.

    Returns:
        An empty state.

    Raises:
        ValueError: An unknown platform or a malformed box.
    """
    platform_masks(platform)
    boxes = tuple(tuple(int(v) for v in box) for box in volatile_regions)
    mask_array(boxes, 10, 10)  # validates every box now, not at the first frame
    return DetectorState(platform=platform, volatile_regions=boxes)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Action keys


_SPACES = re.compile(r"\s+")


def _norm_text(text: str) -> str:
    """Relaxed text: case-folded, whitespace collapsed and stripped."""
    return _SPACES.sub(" ", text).strip().casefold()


def _points(action: Action) -> tuple[tuple[int, int], ...]:
    """Pointer targets of an action on the 0–1000 grid (drag: start, if known, then end)."""
    if isinstance(action, LeftClickDrag):
        return tuple(p for p in (action.start, action.coordinate) if p is not None)
    if isinstance(action, Swipe):
        return (action.coordinate, action.coordinate2)
    coord = getattr(action, "coordinate", None)
    return (tuple(coord),) if coord is not None else ()  # type: ignore[return-value]


def _shape(action: Action | str, relaxed: bool) -> str:
    """Everything of an action's key except its coordinates."""
    if isinstance(action, str):
        return f"raw({json.dumps(_norm_text(action) if relaxed else action.strip())})"
    name = action.action
    if isinstance(action, (Type, Answer, Open)):
        arg = json.dumps(_norm_text(action.text) if relaxed else action.text)
    elif isinstance(action, Key):
        arg = "+".join(k.lower() for k in action.keys) if relaxed else "+".join(action.keys)
    elif isinstance(action, MobileKey):
        arg = action.text.lower() if relaxed else action.text
    elif isinstance(action, (Scroll, HScroll)):
        # Relaxed: only the direction, so "scroll -5" and "scroll -10" on a dead page match.
        arg = ("+" if action.pixels > 0 else "-") if relaxed else str(action.pixels)
    elif isinstance(action, (Wait, LongPress)):
        arg = "" if relaxed else f"{action.time:g}"
    elif isinstance(action, Terminate):
        arg = action.status
    elif isinstance(action, SystemButton):
        arg = action.button.lower() if relaxed else action.button
    elif isinstance(action, CallUser):
        arg = ""
    else:
        arg = ""
    return f"{name}({arg})"


def _with_points(shape: str, points: Sequence[tuple[int, int]]) -> str:
    return shape + ("@" + ">".join(f"{x},{y}" for x, y in points) if points else "")


def exact_action_key(actions: Sequence[Action | str]) -> str:
    """The exact key of a step's actions: type, exact coordinates, exact text/keys (R3's rule).

    Args:
        actions: Typed actions, or raw action text (a ``str``) where the typed parse failed.

    Returns:
        One key, the actions' keys joined by ``"; "``, e.g. ``left_click()@501,553``.
    """
    return "; ".join(
        _with_points(_shape(a, False), () if isinstance(a, str) else _points(a)) for a in actions
    )


def _tolerance_px(width: int, height: int, cfg: DetectorConfig) -> float:
    return max(cfg.coord_tol_min_px, cfg.coord_tol_frac * math.hypot(width, height))


def _relaxed_key(
    actions: Sequence[Action | str],
    anchors: tuple[tuple[str, tuple[tuple[int, int], ...], str], ...],
    size: tuple[int, int],
    cfg: DetectorConfig,
) -> tuple[str, tuple[tuple[str, tuple[tuple[int, int], ...], str], ...]]:
    """Relaxed key and the updated anchors.

    A pointer action takes the key of an earlier anchor with the same shape whose every point is
    within the tolerance (Euclidean, in screen pixels); otherwise it becomes a new anchor. Anchors
    never move, so a slow drift of targets cannot chain into one key.
    """
    width, height = size
    tol = _tolerance_px(width, height, cfg)
    parts: list[str] = []
    new = list(anchors)
    for action in actions:
        shape = _shape(action, True)
        points = () if isinstance(action, str) else _points(action)
        if not points:
            parts.append(shape)
            continue
        match = None
        for a_shape, a_points, a_key in reversed(new):
            if a_shape == shape and len(a_points) == len(points):
                near = all(
                    math.hypot((x - ax) * width / 1000, (y - ay) * height / 1000) <= tol
                    for (x, y), (ax, ay) in zip(points, a_points, strict=True)
                )
                if near:
                    match = a_key
                    break
        if match is None:
            match = _with_points(shape, points)
            new.append((shape, tuple(points), match))
        parts.append(match)
    return "; ".join(parts), tuple(new[-_MAX_ANCHORS:])


_MAX_ANCHORS = 32
_MAX_CYCLE_SIGNATURES = 64


def relaxed_action_key(
    actions: Sequence[Action | str],
    size: tuple[int, int] = (1920, 1080),
    config: DetectorConfig | None = None,
) -> str:
    """The relaxed key of a step's actions without any history (each target is its own anchor).

    Text is case- and whitespace-normalised, keys lower-cased, scrolls reduced to a direction,
    wait and long-press durations dropped. Inside ``update`` pointer targets additionally snap to
    earlier targets within the coordinate tolerance.

    Args:
        actions: Typed actions or raw action texts.
        size: Screen ``(width, height)`` in pixels (for the tolerance).
        config: Thresholds (defaults if ``None``).

    Returns:
        The key.
    """
    return _relaxed_key(actions, (), size, config or DetectorConfig())[0]


# ---------------------------------------------------------------------------------------------
# Frame comparison


@dataclass(frozen=True)
class _Compared:
    identical: bool
    dhash_dist: int
    region_changed: bool | None
    masked_diff_frac: float
    no_effect: bool
    changed_px: np.ndarray  # bool (h, w): changed unmasked thumbnail pixels

    def as_dict(self) -> dict[str, Any]:
        return {
            "identical": self.identical,
            "dhash_dist": self.dhash_dist,
            "region_changed": self.region_changed,
            "masked_diff_frac": round(self.masked_diff_frac, 6),
            "no_effect": self.no_effect,
        }


def _crop_boxes(
    points: Sequence[tuple[int, int]],
    shape: tuple[int, int],
    size: tuple[int, int],
    factor: int,
    cfg: DetectorConfig,
) -> list[tuple[int, int, int, int]]:
    """Thumbnail-pixel boxes ``(y1, y2, x1, x2)`` centred on each pointer target."""
    h, w = shape
    side_px = max(cfg.crop_frac * min(size), cfg.crop_min_px)
    half = max(1, round(side_px / factor / 2))
    boxes = []
    for x, y in points:
        cx, cy = min(w - 1, int(x * w / 1000)), min(h - 1, int(y * h / 1000))
        boxes.append((max(0, cy - half), min(h, cy + half), max(0, cx - half), min(w, cx + half)))
    return boxes


Slices = tuple[tuple[int, int, int, int], ...]
"""Masked rectangles ``(y1, y2, x1, x2)`` in thumbnail pixels (zeroing by slice is far cheaper
than boolean indexing of an RGB array)."""


@dataclass(frozen=True)
class _Mask:
    """The volatile mask of one thumbnail shape, as rectangles and as a boolean array."""

    slices: Slices
    px: np.ndarray  # bool (h, w), True = volatile

    @classmethod
    def build(
        cls, static: Slices, cells: Sequence[int], shape: tuple[int, int], cell: int
    ) -> _Mask:
        slices = (*static, *_cell_slices(cells, shape, cell))
        px = np.zeros(shape, dtype=bool)
        for y1, y2, x1, x2 in slices:
            px[y1:y2, x1:x2] = True
        return cls(slices, px)

    def zeroed(self, arr: np.ndarray) -> np.ndarray:
        """A copy of ``arr`` (or ``arr`` itself when nothing is masked) with the mask zeroed."""
        if not self.slices:
            return arr
        out = arr.copy()
        for y1, y2, x1, x2 in self.slices:
            out[y1:y2, x1:x2] = 0
        return out


def _static_slices(boxes: Sequence[GridBox], shape: tuple[int, int]) -> Slices:
    h, w = shape
    out = []
    for box in boxes:
        x1, y1, x2, y2 = grid_box_px(box, w, h)
        out.append((y1, y2, x1, x2))
    return tuple(out)


def _cell_grid(shape: tuple[int, int], cell: int) -> tuple[int, int]:
    h, w = shape
    return -(-h // cell), -(-w // cell)


def _cell_slices(cells: Sequence[int], shape: tuple[int, int], cell: int) -> Slices:
    """Learned cells as rectangles, consecutive cells of a row merged into one."""
    if not cells:
        return ()
    h, w = shape
    _rows, cols = _cell_grid(shape, cell)
    out: list[tuple[int, int, int, int]] = []
    run_start = prev = None
    for c in sorted(cells):
        if prev is not None and c == prev + 1 and c % cols != 0:
            prev = c
            continue
        if run_start is not None:
            out.append(_cell_run(run_start, prev, cols, cell, h, w))  # type: ignore[arg-type]
        run_start = prev = c
    out.append(_cell_run(run_start, prev, cols, cell, h, w))  # type: ignore[arg-type]
    return tuple(out)


def _cell_run(first: int, last: int, cols: int, cell: int, h: int, w: int) -> tuple[int, ...]:
    row = first // cols
    return (
        row * cell,
        min(h, (row + 1) * cell),
        (first % cols) * cell,
        min(w, (last % cols + 1) * cell),
    )


def _cells_of(px: np.ndarray, cell: int) -> np.ndarray:
    """Row-major indices of the cells holding any True pixel."""
    rows, cols = _cell_grid(px.shape, cell)
    padded = np.zeros((rows * cell, cols * cell), dtype=bool)
    padded[: px.shape[0], : px.shape[1]] = px
    # Reduce over a middle axis (fast elementwise ORs), then OR the cell columns by slicing:
    # numpy's reduction over a short last axis is an order of magnitude slower.
    per_row = padded.reshape(rows, cell, cols * cell).any(axis=1).reshape(rows, cols, cell)
    hit = per_row[..., 0].copy()
    for i in range(1, cell):
        hit |= per_row[..., i]
    return np.flatnonzero(hit)


def _caret_cols(factor: int, cfg: DetectorConfig) -> int:
    """Thumbnail columns a caret line of up to ``caret_max_px`` can cover (0: rule off)."""
    # A caret line can straddle one more thumbnail column than its width needs.
    return math.ceil(cfg.caret_max_px / factor) + 1 if cfg.caret_max_px else 0


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
    changed: np.ndarray, n_changed: int, factor: int, caret_rows: int, cfg: DetectorConfig
) -> bool:
    """The untargeted rule: at most ``untargeted_max_px`` changed pixels, or a lone caret line.

    ``caret_rows`` = 0 allows no caret.
    """
    if n_changed <= cfg.untargeted_max_px:
        return True
    caret_cols = _caret_cols(factor, cfg)
    # Cheap bound first: more changed pixels than the band holds cannot be a caret.
    if not caret_cols or n_changed > caret_cols * caret_rows:
        return False
    return _is_caret_line(changed, caret_cols, caret_rows)


def _compare(
    prev: tuple[np.ndarray, np.ndarray],
    cur: tuple[np.ndarray, np.ndarray],
    mask: _Mask,
    crops: list[tuple[int, int, int, int]],
    factor: int,
    cfg: DetectorConfig,
    untargeted: tuple[bool, int] = (False, 0),
) -> _Compared:
    """Change signals between two equally sized ``(rgb, grey)`` thumbnails under one mask.

    ``untargeted`` is ``(has_untargeted_action, caret_rows)``: a step with an action without a
    target point can act anywhere, so ``untargeted_max_px`` bounds its change instead of
    ``no_effect_frac``; a lone caret line up to ``caret_rows`` thumbnail rows tall is not an
    effect (0: no allowance).
    """
    (prev_rgb, prev_g), (cur_rgb, cur_g) = prev, cur
    if np.array_equal(prev_rgb, cur_rgb):
        # The common no-effect case, without any per-pixel work.
        nothing = np.zeros(mask.px.shape, dtype=bool)
        return _Compared(True, 0, False if crops else None, 0.0, True, nothing)
    keep = ~mask.px
    # |a - b| on uint8 without widening: max - min never wraps.
    delta = np.maximum(prev_g, cur_g) - np.minimum(prev_g, cur_g)
    changed = (delta > cfg.pixel_delta) & keep
    n_changed = int(np.count_nonzero(changed))
    kept = int(np.count_nonzero(keep))
    frac = n_changed / kept if kept else 0.0
    # A visibly changed unmasked pixel settles it; otherwise compare the masked colours exactly.
    identical = n_changed == 0 and bool(np.array_equal(mask.zeroed(prev_rgb), mask.zeroed(cur_rgb)))
    prev_g, cur_g = mask.zeroed(prev_g), mask.zeroed(cur_g)
    dist = hamming(dhash_array(prev_g), dhash_array(cur_g))
    region: bool | None = None
    if crops:
        region = False
        caret_cols = _caret_cols(factor, cfg)
        for y1, y2, x1, x2 in crops:
            if y2 <= y1 or x2 <= x1:
                continue
            crop_changed = changed[y1:y2, x1:x2]
            if caret_cols and _is_caret_line(crop_changed, caret_cols, y2 - y1 + 1):
                # Everything that moved is one thin upright line: the text caret of the field
                # the pointer is in blinked. Counting it would hide every repeated click into
                # an already focused field. (A changed digit or a radio dot is not that thin.)
                continue
            crop_frac = float(np.count_nonzero(crop_changed)) / crop_changed.size
            crop_dist = hamming(dhash_array(prev_g[y1:y2, x1:x2]), dhash_array(cur_g[y1:y2, x1:x2]))
            if crop_frac > cfg.region_diff_frac or crop_dist > cfg.crop_dhash_unchanged:
                region = True
                break
    # Besides the paper's identity rule, a sub-threshold diff counts as "no effect" only when
    # neither the global structure (dHash) nor the area around the target moved.
    no_effect = identical or (
        frac < cfg.no_effect_frac and dist <= cfg.dhash_unchanged and region is not True
    )
    if no_effect and not identical and untargeted[0]:
        # Typing "Acme Ltd" into a field changes about 0.06 % of the screen, under the global
        # share, and there is no target crop to see it: any visible change is the action's.
        no_effect = _untargeted_still(changed, n_changed, factor, untargeted[1], cfg)
    return _Compared(identical, dist, region, frac, no_effect, changed)


def _resized_compare(
    state: DetectorState,
    prev_rgb: np.ndarray,
    cur: tuple[np.ndarray, np.ndarray],
    mask: _Mask,
    has_targets: bool,
) -> _Compared:
    """Signals across a change of screen size: always a change; the dHash still compares."""
    prev_shape = (prev_rgb.shape[0], prev_rgb.shape[1])
    boxes = (*platform_masks(state.platform), *state.volatile_regions)
    prev_mask = _Mask.build(_static_slices(boxes, prev_shape), (), prev_shape, 1)
    prev_g = prev_mask.zeroed(state.grey if state.grey is not None else _grey_of(prev_rgb))
    dist = hamming(dhash_array(prev_g), dhash_array(mask.zeroed(cur[1])))
    nothing = np.zeros(mask.px.shape, dtype=bool)
    return _Compared(False, dist, True if has_targets else None, 1.0, False, nothing)


def _screen_key(rgb: np.ndarray, mask: _Mask) -> str:
    """First 16 hex digits of the SHA-256 of the masked RGB thumbnail (and its size)."""
    digest = hashlib.sha256(f"{rgb.shape[1]}x{rgb.shape[0]}:".encode())
    digest.update(np.ascontiguousarray(mask.zeroed(rgb)).data)
    return digest.hexdigest()[:16]


def _grey_of(rgb: np.ndarray) -> np.ndarray:
    return np.asarray(Image.fromarray(rgb).convert("L"))


# ---------------------------------------------------------------------------------------------
# The entry point


@dataclass(frozen=True)
class Signals:
    """What ``update`` reports for one frame.

    Attributes:
        change: The gateway's ``change`` object, or ``None`` for the first frame.
        recurrence: The gateway's ``recurrence`` object.
        action_key_exact: The exact action key (``None`` without actions).
        cycle_repeats: Traversals of the reported cycle after the first (0 without a cycle).
        mask_learned: Whether this frame grew the learned volatile mask.
    """

    change: dict[str, Any] | None
    recurrence: dict[str, Any]
    action_key_exact: str | None = None
    cycle_repeats: int = 0
    mask_learned: bool = False


def _clean_actions(actions: Sequence[Action | str] | None) -> tuple[Action | str, ...]:
    """The actions as a tuple; ``None`` entries dropped, anything untyped kept as its text."""
    out: list[Action | str] = []
    for a in actions or ():
        if a is None:
            continue
        if isinstance(a, str) or isinstance(getattr(a, "action", None), str):
            out.append(a)
        else:
            # Not a typed action (e.g. a parse error object): compare it by its text, like raw.
            logger.debug("untyped action %r compared as text", type(a).__name__)
            out.append(str(a))
    return tuple(out)


def _is_wait(actions: Sequence[Action | str]) -> bool:
    return all(isinstance(a, Wait) for a in actions)


def _untargeted(
    acts: tuple[Action | str, ...], size: tuple[int, int], factor: int, cfg: DetectorConfig
) -> tuple[bool, int]:
    """``(has_untargeted_action, caret_rows)`` of a step, for ``_compare``.

    An action is untargeted when it has no pointer target (raw text included; waits are not
    actions here). A blinking caret is allowed for as a line up to a target crop's side tall
    (a caret is a line of text tall) — except when the step types text: a field whose caret
    blinks has the focus, so the typed characters would show, and a narrow character such as
    "i" changes no more of a thumbnail than a caret does.
    """
    untargeted = any(
        isinstance(a, str) or (not isinstance(a, Wait) and not _points(a)) for a in acts
    )
    if not untargeted or any(isinstance(a, Type) and a.text for a in acts):
        return untargeted, 0
    return True, max(1, round(max(cfg.crop_frac * min(size), cfg.crop_min_px) / factor))


def _learn(
    state: DetectorState,
    compared: _Compared,
    no_action: bool,
    shape: tuple[int, int],
    cfg: DetectorConfig,
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """The learned cells and unprompted-change history after this frame.

    Without an action (or with a wait) whatever moved is the screen's own doing, and so is a
    sub-threshold change of an action without effect; but one such change is as likely content
    arriving (a report replacing its spinner) as noise. Only cells that keep changing — in
    ``learn_min_hits`` of the last ``learn_window`` such steps, as a spinner or a clock does —
    become volatile.
    """
    cell = cfg.learn_cell_px
    learned = set(state.learned_cells)
    history = state.noeffect_cells
    changed = compared.changed_px
    if not (no_action or compared.no_effect) or not changed.any():
        return state.learned_cells, history
    if no_action and float(changed.mean()) > cfg.learn_max_step_frac:
        # A big change without an action is content (a page finished loading), never noise.
        return state.learned_cells, history
    cells = _cells_of(changed, cell)
    history = (*history, tuple(int(c) for c in cells))[-cfg.learn_window :]
    hits = np.bincount(np.fromiter(itertools.chain.from_iterable(history), dtype=np.intp))
    learned.update(int(c) for c in np.flatnonzero(hits >= cfg.learn_min_hits))
    rows, cols = _cell_grid(shape, cell)
    if len(learned) > cfg.learn_max_total_frac * rows * cols:
        logger.debug("learned volatile mask would exceed its cap; not extended")
        return state.learned_cells, history
    return tuple(sorted(learned)), history


def _find_cycle(
    screens: tuple[str, ...], keys: tuple[str | None, ...], max_cycle: int
) -> tuple[int, str] | None:
    """The shortest return to the last screen and its rotation-invariant signature.

    Returns ``None`` when no return of 2..``max_cycle`` action transitions exists.
    """
    n = len(keys)
    for length in range(2, min(max_cycle, n) + 1):
        if screens[-1 - length] != screens[-1]:
            continue
        seg_keys = keys[n - length :]
        if any(k is None for k in seg_keys):
            # The shortest return passes through a wait or an unprompted change: the screen
            # came back by itself, not through a loop of the agent's own actions.
            return None
        pairs = [f"{s}|{k}" for s, k in zip(screens[-1 - length : -1], seg_keys, strict=True)]
        rotations = ["\n".join(pairs[i:] + pairs[:i]) for i in range(length)]
        # Stored per session: a short digest of the canonical rotation keeps the state small.
        return length, hashlib.sha256(min(rotations).encode()).hexdigest()[:16]
    return None


def _advance_run(
    run: tuple[str | None, str | None, int],
    compared: _Compared | None,
    acts: tuple[Action | str, ...],
    key: str | None,
    screen: str | None,
) -> tuple[str | None, str | None, int, bool]:
    """R3's run: consecutive single, non-wait actions with one key leaving one screen unchanged.

    Returns ``(run_key, run_screen, run_len, counted)``; ``counted`` says this step extended
    or started the run (only such a step may trigger).
    """
    run_key, run_screen, run_len = run
    no_action = not acts or _is_wait(acts)
    if compared is not None and compared.no_effect:
        if no_action:
            return run_key, run_screen, run_len, False  # a wait or re-capture: neither way
        if len(acts) == 1:
            same = run_key == key and run_screen == screen
            return key, screen, run_len + 1 if same else 1, True
    return None, None, 0, False


def _advance_trail(
    state: DetectorState,
    screens: tuple[str, ...],
    before: str | None,
    key: str,
    action_key: str | None,
    changed: bool,
    cfg: DetectorConfig,
) -> tuple[tuple[str, ...], tuple[str | None, ...], tuple[tuple[str, int], ...], int | None, int]:
    """Extend the screen-continuous path and look for a repeated cycle.

    No-effect steps are self-loops and do not move the path; ``action_key`` is ``None`` for a
    transition no cycle may contain (a wait, a change without an action).

    Returns ``(screens, keys, cycle_counts, cycle_len, cycle_repeats)``.
    """
    keys = state.trail_keys
    counts = dict(state.cycle_counts)
    cycle_len, repeats = None, 0
    if before is None:
        return (key,), (), state.cycle_counts, None, 0
    if changed:
        if not screens or screens[-1] != before:
            screens, keys = (before,), ()
        keys = (*keys, action_key)[-cfg.max_cycle :]
        screens = (*screens, key)[-(cfg.max_cycle + 1) :]
        found = _find_cycle(screens, keys, cfg.max_cycle)
        if found is not None:
            length, signature = found
            counts[signature] = counts.pop(signature, 0) + 1
            # The first traversal is exploration; later ones are recurrence (R3 paper).
            if counts[signature] >= 2:
                cycle_len, repeats = length, counts[signature] - 1
    return screens, keys, tuple(counts.items())[-_MAX_CYCLE_SIGNATURES:], cycle_len, repeats


@dataclass(frozen=True)
class _Judged:
    rgb: np.ndarray
    grey: np.ndarray
    factor: int
    mask: _Mask
    compared: _Compared | None
    learned_cells: tuple[int, ...]
    history: tuple[tuple[int, ...], ...]
    learned_now: bool


def _judge(
    state: DetectorState,
    frame: Image.Image,
    acts: tuple[Action | str, ...],
    no_action: bool,
    cfg: DetectorConfig,
) -> _Judged:
    """Thumbnail the frame, compare it with the last one and let it teach the volatile mask."""
    thumb_img, factor = screen_thumbnail(frame, cfg.thumb_long_side)
    cur = np.asarray(thumb_img)
    cur_grey = np.asarray(thumb_img.convert("L"))
    shape = (cur.shape[0], cur.shape[1])
    size = (frame.width, frame.height)
    prev = state.thumb
    same_shape = prev is not None and prev.shape == cur.shape
    # Learned cells index one thumbnail shape; a new screen size starts learning afresh.
    learned_cells = state.learned_cells if same_shape else ()
    history = state.noeffect_cells if same_shape else ()
    static = _static_slices((*platform_masks(state.platform), *state.volatile_regions), shape)
    mask = _Mask.build(static, learned_cells, shape, cfg.learn_cell_px)
    crops = []
    for a in acts:
        if not isinstance(a, str):
            crops += _crop_boxes(_points(a), shape, size, factor, cfg)
    untargeted = _untargeted(acts, size, factor, cfg)

    compared: _Compared | None = None
    learned_now = False
    if same_shape:
        prev_pair = (prev, state.grey if state.grey is not None else _grey_of(prev))
        pair = (cur, cur_grey)
        compared = _compare(prev_pair, pair, mask, crops, factor, cfg, untargeted)  # type: ignore[arg-type]
        new_cells, history = _learn(state, compared, no_action, shape, cfg)
        if new_cells != learned_cells:
            learned_now = True
            learned_cells = new_cells
            mask = _Mask.build(static, learned_cells, shape, cfg.learn_cell_px)
            # Judge this frame under the mask it just taught, so the spinner tick that proves
            # it volatile already reads as "no effect".
            compared = _compare(prev_pair, pair, mask, crops, factor, cfg, untargeted)  # type: ignore[arg-type]
    elif prev is not None:
        logger.info("frame size changed (%s -> %s); screen treated as new", state.frame_size, size)
        compared = _resized_compare(state, prev, (cur, cur_grey), mask, bool(crops))
    return _Judged(cur, cur_grey, factor, mask, compared, learned_cells, history, learned_now)


def update(
    state: DetectorState,
    frame: Image.Image,
    actions: Sequence[Action | str] | None,
    config: DetectorConfig | None = None,
) -> tuple[DetectorState, Signals]:
    """Judge one new frame against the last one and update the recurrence counters.

    Args:
        state: The session's state (``new_state`` for a new session); never modified.
        frame: The new screen (the decoded screenshot, any size; the canonical frame works too).
        actions: The actions executed since the previous frame, oldest first: typed actions, or
            the raw action text (``str``) where the typed parse failed. ``None`` (or empty)
            means nothing was executed: the first frame, a settle re-capture or a no-action
            probe; such frames, like wait-only steps, teach the volatile mask.
        config: Thresholds (defaults if ``None``).

    Returns:
        ``(new_state, signals)``.
    """
    cfg = config or DetectorConfig()
    acts = _clean_actions(actions)
    no_action = not acts or _is_wait(acts)
    size = (frame.width, frame.height)
    j = _judge(state, frame, acts, no_action, cfg)
    cur, cur_grey, mask, compared = j.rgb, j.grey, j.mask, j.compared
    learned_cells, history, learned_now = j.learned_cells, j.history, j.learned_now

    prev_key = state.screen_key
    unchanged = compared is not None and compared.no_effect and prev_key is not None
    remap: dict[str, str] = {}
    if unchanged and not learned_now:
        key = prev_key  # sub-threshold differences do not make a new screen; keep its identity
    else:
        key = _screen_key(cur, mask)
        if unchanged:
            # The same screen under a wider mask: rename it everywhere.
            remap = {prev_key: key}  # type: ignore[dict-item]
    visits = tuple(remap.get(s, s) for s in state.visits)
    run_screen = remap.get(state.run_screen, state.run_screen) if state.run_screen else None
    before_key = remap.get(prev_key, prev_key) if prev_key is not None else None

    exact_key = exact_action_key(acts) if acts else None
    relaxed_key, anchors = (
        _relaxed_key(acts, state.anchors, size, cfg) if acts else (None, state.anchors)
    )
    run_key, run_screen, run_len, counted = _advance_run(
        (state.run_key, run_screen, state.run_len), compared, acts, relaxed_key, before_key
    )
    trail_screens, trail_keys, cycle_items, cycle_len, cycle_repeats = _advance_trail(
        state,
        tuple(remap.get(s, s) for s in state.trail_screens),
        before_key,
        key,
        None if no_action else relaxed_key,
        compared is None or not compared.no_effect,
        cfg,
    )
    if not visits or visits[-1] != key:
        visits = (*visits, key)[-cfg.revisit_window :]
    revisits = visits[:-1].count(key)

    new = DetectorState(
        platform=state.platform,
        volatile_regions=state.volatile_regions,
        steps=state.steps + 1,
        frame_size=size,
        factor=j.factor,
        thumb=cur,
        grey=cur_grey,
        screen_key=key,
        learned_cells=learned_cells,
        noeffect_cells=history,
        run_key=run_key,
        run_screen=run_screen,
        run_len=run_len,
        trail_screens=trail_screens,
        trail_keys=trail_keys,
        cycle_counts=cycle_items,
        visits=visits,
        anchors=anchors,
    )
    recurrence = {
        "same_key_no_effect_run": run_len,
        "cycle_len": cycle_len,
        "screen_revisits": revisits,
        "r3_trigger": counted and run_len >= cfg.k,
        "action_key": relaxed_key,
        "screen_key": key,
    }
    signals = Signals(
        change=compared.as_dict() if compared is not None else None,
        recurrence=recurrence,
        action_key_exact=exact_key,
        cycle_repeats=cycle_repeats,
        mask_learned=learned_now,
    )
    return new, signals


def same_screen(
    a: Image.Image,
    b: Image.Image,
    state: DetectorState | None = None,
    config: DetectorConfig | None = None,
) -> bool:
    """Whether ``b`` shows the same screen as ``a``: ``no_effect`` between them, without targets.

    The arrival check of a recovery (ReTrace judges arrival by transition consistency; this
    approximates it with the stored target screenshot). The session's masks apply: its platform
    and volatile regions, and its learned cells when the thumbnails have the shape they were
    learned on.

    Args:
        a: The reference screen (e.g. the recovery target's screenshot).
        b: The screen to check.
        state: The session's detector state, for its masks (``None``: no masks).
        config: Thresholds (defaults if ``None``).

    Returns:
        True when the two screens match.
    """
    cfg = config or DetectorConfig()
    base = state or DetectorState()
    (ta, fa), (tb, _fb) = (
        screen_thumbnail(a, cfg.thumb_long_side),
        screen_thumbnail(b, cfg.thumb_long_side),
    )
    ra, rb = np.asarray(ta), np.asarray(tb)
    if ra.shape != rb.shape:
        return False
    shape = (ra.shape[0], ra.shape[1])
    learned = base.learned_cells if base.thumb is not None and base.thumb.shape == ra.shape else ()
    static = _static_slices((*platform_masks(base.platform), *base.volatile_regions), shape)
    mask = _Mask.build(static, learned, shape, cfg.learn_cell_px)
    pair_a = (ra, np.asarray(ta.convert("L")))
    pair_b = (rb, np.asarray(tb.convert("L")))
    return _compare(pair_a, pair_b, mask, [], fa, cfg).no_effect


def recurrence_note(signals: Signals) -> str | None:
    """One plain-English line for the critique prompt when a repeat or a cycle is flagged.

    Args:
        signals: ``update``'s signals for the latest frame.

    Returns:
        The note, or ``None`` when neither a repeated no-effect action (a run of 2 or more, or
        an R3 trigger) nor a repeated cycle is flagged.
    """
    rec = signals.recurrence
    run = rec["same_key_no_effect_run"]
    if rec["r3_trigger"] or run >= 2:
        return (
            f"The same action ({rec['action_key']}) has now been executed {run} times in a row "
            "without changing the screen; repeating it again is unlikely to help."
        )
    if rec["cycle_len"]:
        return (
            f"The last {rec['cycle_len']} actions led back to a screen seen before, repeating an "
            "earlier sequence of screens and actions; the agent is going in a loop."
        )
    return None
