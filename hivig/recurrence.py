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

How a step is judged is ``hivig.screens``'s business (the one screen judge, shared with the
guard's recovery check and the offline diagnosis): masked thumbnail signals ``identical``,
``dhash_dist``, ``masked_diff_frac``, ``region_changed`` and the ``no_effect`` judgement. This
module adds what needs a session's history:

- **Learned mask**: on top of the platform's clock/status-bar boxes and the session's boxes,
  cells that keep changing unprompted — in ``learn_min_hits`` of the recent frames that changed
  without any action (a wait, or a re-capture with ``actions=None``) or in a no-effect step. A
  spinner or a clock is learned after a few ticks; a one-off change during a wait (a report
  replacing its spinner) is content arriving, reported as a change and kept watched.
- **Recurrence**: consecutive single, non-wait actions with the same relaxed action key and no
  effect (R3's trigger, ``k`` = 2 by default); the shortest screen-continuous return of 2–8
  action transitions, grouped up to rotation and reported from its second traversal on; and how
  often the current screen was entered before.
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
    Action,
    Answer,
    CallUser,
    HScroll,
    Key,
    LongPress,
    MobileKey,
    Open,
    Scroll,
    SystemButton,
    Terminate,
    Type,
    Wait,
)
from hivig.config import ConfigError
from hivig.screens import (
    Mask,
    Screen,
    ScreenChange,
    ScreenThresholds,
    Slices,
    action_points,
    compare,
    grey_of,
    platform_masks,
    screen_key,
    volatile_boxes,
)
from hivig.vision import GridBox, deflate

logger = logging.getLogger(__name__)

STATE_VERSION = 1
"""Version of the ``DetectorState`` JSON layout; ``from_json`` refuses other versions."""

# ---------------------------------------------------------------------------------------------
# Config


@dataclass
class DetectorConfig:
    """Thresholds of the detector.

    Defaults: R3's cycle bound (8 transitions) and no-wait, single-action trigger; ``k`` = 2 as in
    GUI agents that give up after two unchanged repeats. How a pair of frames is judged is
    ``screen`` (``hivig.screens``, the thresholds every stage shares). All are starting points
    to tune on the project's own trajectories.
    """

    k: int = 2
    """R3 trigger: consecutive no-effect executions of one single, non-wait action key."""
    max_cycle: int = 8
    """Longest screen–action cycle searched, in transitions (R3 paper: 8)."""
    revisit_window: int = 30
    """How many recent screen entries ``screen_revisits`` counts over."""
    screen: ScreenThresholds = field(default_factory=ScreenThresholds)
    """The frame comparison's thresholds (changed pixels, dHash limits, target crops, caret)."""
    coord_tol_frac: float = 0.004
    """Relaxed action keys: pointer targets this close (share of the screen diagonal) match."""
    coord_tol_min_px: float = 8.0
    """Smallest coordinate tolerance, in screen pixels."""
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
        for name in ("k", "max_cycle", "revisit_window", "learn_cell_px"):
            if getattr(self, name) < 1:
                raise ConfigError(f"`recurrence.{name}` must be at least 1")
        if self.max_cycle < 2:
            raise ConfigError("`recurrence.max_cycle` must be at least 2 (a cycle has 2 steps)")
        for name in ("coord_tol_frac", "learn_max_step_frac", "learn_max_total_frac"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"`recurrence.{name}` must be in [0, 1]")
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
                grey=grey_of(thumb) if thumb is not None else None,
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
    platform_masks(platform)  # an unknown platform fails now, not at the first frame
    boxes = volatile_boxes(None, volatile_regions)  # and so does a malformed box
    return DetectorState(platform=platform, volatile_regions=boxes)


# ---------------------------------------------------------------------------------------------
# Action keys


_SPACES = re.compile(r"\s+")


def _norm_text(text: str) -> str:
    """Relaxed text: case-folded, whitespace collapsed and stripped."""
    return _SPACES.sub(" ", text).strip().casefold()


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
    keys = []
    for a in actions:
        keys.append(_with_points(_shape(a, False), () if isinstance(a, str) else action_points(a)))
    return "; ".join(keys)


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
        points = () if isinstance(action, str) else action_points(action)
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
# Learned mask cells


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


def _learn(
    state: DetectorState,
    compared: ScreenChange,
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
    compared: ScreenChange | None,
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
    screen: Screen
    mask: Mask
    compared: ScreenChange | None
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
    cur = Screen.of(frame, cfg.screen)
    shape = cur.shape
    boxes = (*platform_masks(state.platform), *state.volatile_regions)
    if state.thumb is None:
        return _Judged(cur, Mask.build(shape, boxes), None, (), (), False)
    grey = state.grey if state.grey is not None else grey_of(state.thumb)
    prev = Screen(state.thumb, grey, state.factor, state.frame_size or cur.size)
    if prev.shape != shape:
        # Learned cells index one thumbnail shape; a new screen size starts learning afresh.
        logger.info("frame size changed (%s -> %s); screen treated as new", prev.size, cur.size)
        mask = Mask.build(shape, boxes)
        return _Judged(cur, mask, compare(prev, cur, boxes, acts, cfg.screen), (), (), False)
    cells = state.learned_cells
    mask = Mask.build(shape, boxes, _cell_slices(cells, shape, cfg.learn_cell_px))
    compared = compare(prev, cur, boxes, acts, cfg.screen, mask=mask)
    new_cells, history = _learn(state, compared, no_action, shape, cfg)
    if new_cells == cells:
        return _Judged(cur, mask, compared, cells, history, False)
    mask = Mask.build(shape, boxes, _cell_slices(new_cells, shape, cfg.learn_cell_px))
    # Judge this frame under the mask it just taught, so the spinner tick that proves it
    # volatile already reads as "no effect".
    compared = compare(prev, cur, boxes, acts, cfg.screen, mask=mask)
    return _Judged(cur, mask, compared, new_cells, history, True)


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
    mask, compared = j.mask, j.compared
    learned_cells, history, learned_now = j.learned_cells, j.history, j.learned_now

    prev_key = state.screen_key
    unchanged = compared is not None and compared.no_effect and prev_key is not None
    remap: dict[str, str] = {}
    if unchanged and not learned_now:
        key = prev_key  # sub-threshold differences do not make a new screen; keep its identity
    else:
        key = screen_key(j.screen, mask)
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
        factor=j.screen.factor,
        thumb=j.screen.rgb,
        grey=j.screen.grey,
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
