"""ScaleCUA-style calls -> Qwen3-VL actions: the mapping table.

One ``_Normaliser`` walks a step's calls in order and keeps the step state the mapping needs: the
pointer position (drag starts, bare clicks), held keys (keyDown/press/keyUp folding) and a pending
mobile ``moveTo``. Calls with no equivalent in the platform's space give
``ActionError("unsupported_action", ...)``; data-quality events go to a counter.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from hivig.actions._calls import RawCall
from hivig.actions.keys import is_key_name, is_mobile_key_name
from hivig.actions.model import (
    GRID_MAX,
    MOBILE,
    Action,
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
    Point,
    RightClick,
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    TripleClick,
    Type,
    Wait,
    check_seconds,
    is_number,
    round_half_up,
    space_for_platform,
)
from hivig.actions.scale import CLAMP_FRACTION, Scale, coordinate_values, resolve_scale

OUTLIER_COUNT = 10
"""``clicks``/``presses`` above this are kept but flagged (``clicks=40``-style data noise)."""

SCROLL_PIXELS_PER_CLICK = 100
"""Wheel click -> Qwen ``pixels``; the reference's magnitude, kept so magnitudes mean the same."""

SWIPE_PIXELS_PER_SCREEN = 1000
"""``swipe(amount=a)`` -> ``pixels = a * 1000`` (the reference's magnitude)."""

MAX_PRESSES = 100
"""``presses`` above this are rejected: each press becomes one action; no real step needs more."""

HSwipe = Literal["finger", "reference"]


_UNMAPPED = frozenset({"open_url", "go_forward", "go_backward", "select_option"})
_KEY_CALLS = frozenset({"press", "hotkey", "keyDown", "keyUp"})
_STATUS = {"success": "success", "failure": "failure", "fail": "failure"}
# Finger direction -> unit vector on screen (y grows downward).
_FINGER = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}


@dataclass
class _Normaliser:
    """Per-step state while mapping calls: pointer position, held keys, pending mobile move."""

    space: str
    width: int
    height: int
    scale: Scale | None
    scroll_sign: int
    hswipe: str
    pixels_per_click: int
    flags: Counter[str]
    pointer: Point | None = None
    actions: list[Action] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    chord: list[str] = field(default_factory=list)
    pressed_while_held: bool = False
    mobile_move: Point | None = None

    # --- coordinates ---------------------------------------------------------------------

    def _axis(self, value: float, side: int, label: str) -> int | ActionError:
        if self.scale == "unit":
            rel = value
        elif self.scale == "grid":
            rel = value / GRID_MAX
        else:
            rel = value / side
        if rel < 0.0 or rel > 1.0:
            if rel < -CLAMP_FRACTION or rel > 1.0 + CLAMP_FRACTION:
                return ActionError(
                    "coordinate_out_of_range", f"{label}={value} ({self.scale} scale) is off screen"
                )
            self.flags["clamped"] += 1
            rel = min(max(rel, 0.0), 1.0)
        return min(max(round_half_up(rel * GRID_MAX), 0), GRID_MAX)

    def grid(self, x: float, y: float) -> Point | ActionError:
        if not (is_number(x) and is_number(y)):
            return ActionError("bad_argument", f"coordinates must be numbers, got {x!r}, {y!r}")
        gx = self._axis(x, self.width, "x")
        if isinstance(gx, ActionError):
            return gx
        gy = self._axis(y, self.height, "y")
        if isinstance(gy, ActionError):
            return gy
        return (gx, gy)

    def point(self, kw: dict[str, Any], optional: bool = False) -> Point | None | ActionError:
        """Grid point of a call's x, y; ``None`` for ``x=None``/``y=None``.

        A missing point is counted as ``x_none`` unless the position is optional for the call
        (``scroll`` without x, y simply scrolls where the pointer is).
        """
        if kw.get("x") is None or kw.get("y") is None:
            if not optional:
                self.flags["x_none"] += 1
            return None
        return self.grid(kw["x"], kw["y"])

    def required_point(self, call: RawCall) -> Point | ActionError:
        pt = self.point(call.kwargs)
        if pt is None:
            return ActionError("missing_coordinate", f"{call.name} needs x and y: {call.line!r}")
        return pt

    # --- helpers -------------------------------------------------------------------------

    def unsupported(self, call: RawCall, why: str = "") -> ActionError:
        self.flags[f"unsupported:{call.name}"] += 1
        detail = f" ({why})" if why else ""
        return ActionError(
            "unsupported_action", f"{call.name} has no {self.space} form{detail}: {call.line!r}"
        )

    def count(self, call: RawCall, key: str) -> int | ActionError:
        value = call.kwargs.get(key, 1)
        if not is_number(value) or value != int(value) or value < 1:
            return ActionError("bad_argument", f"{key} must be an integer >= 1: {call.line!r}")
        if value > OUTLIER_COUNT:
            self.flags[f"outlier_{key}"] += 1
        return int(value)

    # --- clicks and pointer --------------------------------------------------------------

    def click(self, call: RawCall) -> ActionError | None:
        kw = call.kwargs
        clicks = self.count(call, "clicks")
        if isinstance(clicks, ActionError):
            return clicks
        button = kw.get("button", "left")
        if button not in ("left", "right", "middle"):
            return ActionError("bad_argument", f"button must be left|right|middle: {call.line!r}")
        pt = self.point(kw)
        if isinstance(pt, ActionError):
            return pt
        if pt is None:
            # pyautogui clicks at the current pointer; Qwen needs a coordinate, so only a known
            # pointer (an earlier call of this step, or the caller's) can stand in for it.
            if self.space == MOBILE or self.pointer is None:
                return ActionError("missing_coordinate", f"no pointer position: {call.line!r}")
            pt = self.pointer
        self.pointer = pt
        if self.space == MOBILE:
            if button != "left" or clicks > 2:
                return self.unsupported(call, f"button={button}, clicks={clicks}")
            if clicks == 2:
                self.flags["mobile_double_click"] += 1
            self.actions.extend([Click(pt)] * clicks)
            return None
        if clicks >= 2 and button != "left":
            self.flags["clicks_and_button"] += 1  # the reference's rule: the clicks test wins
        if clicks >= 3:
            self.actions.append(TripleClick(pt))
        elif clicks == 2:
            self.actions.append(DoubleClick(pt))
        else:
            cls = {"left": LeftClick, "right": RightClick, "middle": MiddleClick}[button]
            self.actions.append(cls(pt))
        return None

    def move_to(self, call: RawCall) -> ActionError | None:
        pt = self.required_point(call)
        if isinstance(pt, ActionError):
            return pt
        self.pointer = pt
        if self.space == MOBILE:
            self.mobile_move = pt  # only meaningful as the start of a following dragTo
        else:
            self.actions.append(MouseMove(pt))
        return None

    def drag_to(self, call: RawCall) -> ActionError | None:
        if call.kwargs.get("button", "left") != "left":
            return self.unsupported(call, "only left-button drags exist")
        pt = self.required_point(call)
        if isinstance(pt, ActionError):
            return pt
        if self.space == MOBILE:
            if self.mobile_move is None:
                return self.unsupported(call, "dragTo without moveTo")
            self.actions.append(Swipe(self.mobile_move, pt))
            self.mobile_move = None
        else:
            self.actions.append(LeftClickDrag(pt, start=self.pointer))
        self.pointer = pt
        return None

    def scroll(self, call: RawCall, horizontal: bool = False) -> ActionError | None:
        if self.space == MOBILE:
            return self.unsupported(call)
        clicks = call.kwargs.get("clicks")
        if not is_number(clicks) or clicks != int(clicks):
            return ActionError("bad_argument", f"clicks must be an integer: {call.line!r}")
        if abs(clicks) > OUTLIER_COUNT:
            self.flags["outlier_clicks"] += 1
        pt = self.point(call.kwargs, optional=True)
        if isinstance(pt, ActionError):
            return pt
        if pt is not None:
            # The wheel acts where the pointer is: keep the position as a mouse_move.
            self.actions.append(MouseMove(pt))
            self.pointer = pt
        pixels = int(clicks) * self.pixels_per_click
        if horizontal:
            self.actions.append(HScroll(pixels))
        else:
            self.actions.append(Scroll(pixels * self.scroll_sign))
        return None

    def swipe(self, call: RawCall) -> ActionError | None:
        kw = call.kwargs
        start, end = kw.get("from_coord"), kw.get("to_coord")
        if (start is None) != (end is None):
            return ActionError("missing_argument", f"swipe needs both from/to: {call.line!r}")
        if start is not None:
            pairs = [p for p in (start, end) if isinstance(p, (list, tuple)) and len(p) == 2]
            if len(pairs) != 2:
                return ActionError("bad_argument", f"from/to must be [x, y]: {call.line!r}")
            a = self.grid(*start)
            if isinstance(a, ActionError):
                return a
            b = self.grid(*end)
            if isinstance(b, ActionError):
                return b
            if self.space == MOBILE:
                self.actions.append(Swipe(a, b))
            else:
                self.flags["coordinate_swipe_on_computer"] += 1
                self.actions.extend([MouseMove(a), LeftClickDrag(b, start=a)])
                self.pointer = b
            return None
        return self.direction_swipe(call)

    def direction_swipe(self, call: RawCall) -> ActionError | None:
        direction, amount = call.kwargs.get("direction"), call.kwargs.get("amount")
        if not isinstance(direction, str) or direction not in _FINGER:
            return ActionError(
                "bad_argument", f"direction must be up|down|left|right: {call.line!r}"
            )
        if not is_number(amount) or not 0.0 <= amount <= 1.0:
            return ActionError("bad_argument", f"amount must be in [0, 1]: {call.line!r}")
        if self.space == MOBILE:
            # Synthesised finger path through the screen centre, length amount * screen.
            ux, uy = _FINGER[direction]
            off = GRID_MAX / 2 * amount
            c = GRID_MAX / 2
            a = (round_half_up(c - off * ux), round_half_up(c - off * uy))
            b = (round_half_up(c + off * ux), round_half_up(c + off * uy))
            self.flags["synthetic_swipe"] += 1
            self.actions.append(Swipe(a, b, synthetic=True))
            return None
        # Finger up pushes content up: the view moves down -> negative pixels.
        px = round_half_up(amount * SWIPE_PIXELS_PER_SCREEN)
        if direction in ("up", "down"):
            self.actions.append(Scroll(-px if direction == "up" else px))
            return None
        finger_left = px if self.hswipe == "finger" else -px
        self.actions.append(HScroll(finger_left if direction == "left" else -finger_left))
        return None

    def long_press(self, call: RawCall) -> ActionError | None:
        if self.space != MOBILE:
            return self.unsupported(call)
        secs = check_seconds(call.kwargs.get("duration"), "duration")
        if isinstance(secs, ActionError):
            return ActionError(secs.reason, f"{secs.message}: {call.line!r}")
        pt = self.required_point(call)
        if isinstance(pt, ActionError):
            return pt
        self.actions.append(LongPress(pt, secs))
        return None

    # --- keys ----------------------------------------------------------------------------

    def key_names(self, call: RawCall, value: Any) -> tuple[str, ...] | ActionError:
        names = (value,) if isinstance(value, str) else value
        if not isinstance(names, (list, tuple)) or not names:
            return ActionError("bad_argument", f"keys must be a string or list: {call.line!r}")
        check = is_mobile_key_name if self.space == MOBILE else is_key_name
        for name in names:
            if not check(name):
                return ActionError("bad_key", f"unknown key name {name!r}: {call.line!r}")
        if self.space == MOBILE:
            return tuple(names)
        # pyautogui lower-cases named keys itself; single characters keep their case ('A').
        return tuple(n if len(n) == 1 else n.lower() for n in names)

    def press(self, call: RawCall) -> ActionError | None:
        keys = self.key_names(call, call.kwargs.get("keys"))
        if isinstance(keys, ActionError):
            return keys
        presses = self.count(call, "presses")
        if isinstance(presses, ActionError):
            return presses
        if presses > MAX_PRESSES:
            return ActionError("bad_argument", f"presses above {MAX_PRESSES}: {call.line!r}")
        if self.space == MOBILE:
            if len(keys) != 1:
                return self.unsupported(call, "key combination")
            name = keys[0]
            one: Action = SystemButton("Enter") if name.lower() == "enter" else MobileKey(name)
            self.actions.extend([one] * presses)
            return None
        combo = Key((*self.held, *keys))
        self.pressed_while_held = self.pressed_while_held or bool(self.held)
        self.actions.extend([combo] * presses)
        return None

    def hotkey(self, call: RawCall) -> ActionError | None:
        if self.space == MOBILE:
            return self.unsupported(call)
        keys = self.key_names(call, call.kwargs.get("keys"))
        if isinstance(keys, ActionError):
            return keys
        self.pressed_while_held = self.pressed_while_held or bool(self.held)
        self.actions.append(Key((*self.held, *keys)))
        return None

    def key_down(self, call: RawCall) -> ActionError | None:
        if self.space == MOBILE:
            return self.unsupported(call)
        keys = self.key_names(call, call.kwargs.get("key"))
        if isinstance(keys, ActionError):
            return keys
        if not self.held:
            self.chord, self.pressed_while_held = [], False
        self.held.extend(keys)
        self.chord.extend(keys)
        return None

    def key_up(self, call: RawCall) -> ActionError | None:
        if self.space == MOBILE:
            return self.unsupported(call)
        keys = self.key_names(call, call.kwargs.get("key"))
        if isinstance(keys, ActionError):
            return keys
        for key in keys:
            if key not in self.held:
                self.flags["lone_key_up"] += 1
                return self.unsupported(call, "keyUp without keyDown")
            self.held.remove(key)
        if not self.held and not self.pressed_while_held:
            # keyDown(a) ... keyUp(a) with nothing pressed in between is a press of the chord.
            self.actions.append(Key(tuple(self.chord)))
        return None

    # --- everything else -----------------------------------------------------------------

    def simple(self, call: RawCall) -> ActionError | None:
        made = _simple_action(call, self.space)
        if isinstance(made, ActionError):
            if made.reason == "unsupported_action":
                self.flags[f"unsupported:{call.name}"] += 1
            return made
        if isinstance(made, Terminate) and call.kwargs.get("status") == "fail":
            self.flags["status_fail"] += 1
        self.actions.append(made)
        return None

    def run(self, calls: list[RawCall]) -> list[Action] | ActionError:
        for call in calls:
            if self.held and call.name not in _KEY_CALLS:
                return self.unsupported(call, "a key is held down across a non-key call")
            handler = _HANDLERS.get(call.name)
            err = handler(self, call) if handler else self.simple(call)
            if err is not None:
                return err
        if self.held:
            self.flags["lone_key_down"] += 1
            return ActionError("unsupported_action", f"keyDown without keyUp: {self.held}")
        if self.mobile_move is not None:
            return ActionError("unsupported_action", "moveTo without dragTo on mobile_use")
        return self.actions


_HANDLERS = {
    "click": _Normaliser.click,
    "doubleClick": lambda n, c: n.click(RawCall(c.name, {**c.kwargs, "clicks": 2}, line=c.line)),
    "rightClick": lambda n, c: n.click(
        RawCall(c.name, {**c.kwargs, "clicks": 1, "button": "right"}, line=c.line)
    ),
    "moveTo": _Normaliser.move_to,
    "dragTo": _Normaliser.drag_to,
    "scroll": _Normaliser.scroll,
    "hscroll": lambda n, c: n.scroll(c, horizontal=True),
    "swipe": _Normaliser.swipe,
    "long_press": _Normaliser.long_press,
    "press": _Normaliser.press,
    "hotkey": _Normaliser.hotkey,
    "keyDown": _Normaliser.key_down,
    "keyUp": _Normaliser.key_up,
}


def _text(call: RawCall, key: str) -> str | ActionError:
    value = call.kwargs.get(key)
    if not isinstance(value, str):
        return ActionError("bad_argument", f"{key} must be a string: {call.line!r}")
    return value


def _simple_action(call: RawCall, space: str) -> Action | ActionError:
    """Calls without coordinates or step state."""
    name, kw = call.name, call.kwargs
    mobile_only = {"open_app", "navigate_home", "navigate_back"}
    if name in _UNMAPPED or (name in mobile_only and space != MOBILE):
        return ActionError("unsupported_action", f"{name} has no {space} form: {call.line!r}")
    if name == "write":
        text = _text(call, "message")
        return text if isinstance(text, ActionError) else Type(text)
    if name == "response":
        text = _text(call, "answer")
        return text if isinstance(text, ActionError) else Answer(text)
    if name == "open_app":
        text = _text(call, "app_name")
        return text if isinstance(text, ActionError) else Open(text)
    if name in ("navigate_home", "navigate_back"):
        return SystemButton("Home" if name == "navigate_home" else "Back")
    if name == "call_user":
        return CallUser()
    if name == "wait":
        secs = check_seconds(kw.get("seconds"), "seconds")
        if isinstance(secs, ActionError):
            return ActionError(secs.reason, f"{secs.message}: {call.line!r}")
        return Wait(secs)
    if name != "terminate":
        return ActionError("unknown_action", f"unknown call {name!r}: {call.line!r}")
    status = kw.get("status", "success")
    status = _STATUS.get(status) if isinstance(status, str) else None
    if status is None:
        return ActionError("bad_argument", f"status must be success|failure: {call.line!r}")
    info = kw.get("info")
    if info is not None and not isinstance(info, str):
        return ActionError("bad_argument", f"info must be a string or None: {call.line!r}")
    return Terminate(status, info)  # type: ignore[arg-type]


def _check_frame(platform: str, width: Any, height: Any) -> str | ActionError:
    try:
        space = space_for_platform(platform)
    except ActionError as exc:
        return exc
    for name, side in (("width", width), ("height", height)):
        if not isinstance(side, int) or isinstance(side, bool) or side <= 0:
            return ActionError("bad_argument", f"{name} must be a positive integer, got {side!r}")
    return space


def map_calls(
    calls: list[RawCall],
    platform: str,
    width: int,
    height: int,
    scale: str | None,
    *,
    scroll_sign: int = 1,
    hswipe: str = "finger",
    pixels_per_click: int = SCROLL_PIXELS_PER_CLICK,
    pointer: Point | None = None,
    flags: Counter[str] | None = None,
) -> tuple[list[Action], Scale | None] | ActionError:
    """Map bound calls to actions; also returns the scale used (see ``normalise_calls``).

    Args:
        calls: Bound calls (ScaleCUA names; ``hscroll`` is accepted for pyautogui code).
        platform: Platform name, which picks ``computer_use`` or ``mobile_use``.
        width: Screenshot width in pixels.
        height: Screenshot height in pixels.
        scale: Explicit scale, or ``None`` for the record's own.
        scroll_sign: Wheel sign convention, ``1`` or ``-1``.
        hswipe: Horizontal swipe convention, ``finger`` or ``reference``.
        pixels_per_click: Qwen ``pixels`` per wheel click.
        pointer: Pointer position before the first call, if known.
        flags: Counter receiving data-quality events.

    Returns:
        ``(actions, scale_used)`` or an ``ActionError``.
    """
    space = _check_frame(platform, width, height)
    if isinstance(space, ActionError):
        return space
    if scroll_sign not in (1, -1) or hswipe not in ("finger", "reference"):
        return ActionError("bad_argument", "scroll_sign must be +-1 and hswipe finger|reference")
    used = resolve_scale(coordinate_values(calls), scale)
    if isinstance(used, ActionError):
        return used
    norm = _Normaliser(
        space=space,
        width=width,
        height=height,
        scale=used,
        scroll_sign=scroll_sign,
        hswipe=hswipe,
        pixels_per_click=pixels_per_click,
        flags=flags if flags is not None else Counter(),
        pointer=pointer,
    )
    actions = norm.run(calls)
    if isinstance(actions, ActionError):
        return actions
    return actions, used
