"""The typed action model: one frozen dataclass per Qwen3-VL ``computer_use``/``mobile_use`` action.

The JSON form of an action is exactly the Qwen3-VL tool-call ``arguments`` object, e.g.
``{"action": "left_click", "coordinate": [501, 874]}``. Coordinates are integers on the 0–1000
grid relative to the screenshot. Metadata that Qwen has no field for (the start of a drag, a
terminate's ``info``, synthesised swipe points) lives on the dataclass but is never written by
``to_arguments``.

Two names exist in both spaces with different parameters: ``key`` (``keys`` array on desktop,
``text`` on mobile) is split into ``Key`` and ``MobileKey``; ``type``, ``wait``, ``answer`` and
``terminate`` share one class. ScaleCUA's ``call_user`` has no Qwen rendering and is its own class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

Point = tuple[int, int]
Space = Literal["computer_use", "mobile_use"]
Platform = Literal["windows", "mac", "ubuntu", "web", "android"]

COMPUTER: Space = "computer_use"
MOBILE: Space = "mobile_use"
SPACES: tuple[Space, ...] = (COMPUTER, MOBILE)
GRID_MAX = 1000
"""Upper end of the coordinate grid (inclusive); the lower end is 0."""

_PLATFORM_SPACE: dict[str, Space] = {
    "windows": COMPUTER,
    "mac": COMPUTER,
    "ubuntu": COMPUTER,
    "web": COMPUTER,
    "android": MOBILE,
}
DESKTOP_PLATFORMS = frozenset({"windows", "mac", "ubuntu"})
PLATFORMS = tuple(_PLATFORM_SPACE)
"""Every platform, in a stable order (CLI choices, reports); the one list the project uses."""

PLATFORM_ALIASES: dict[str, Platform] = {
    **{p: p for p in PLATFORMS},  # type: ignore[misc]
    "win": "windows",
    "macos": "mac",
    "linux": "ubuntu",
    "mobile": "android",
}
"""Platform names as data, runners and meta keys write them -> the platform they mean."""


def platform_name(name: object) -> Platform | None:
    """The platform a name means (case-insensitive; ``None`` when it names none)."""
    return PLATFORM_ALIASES.get(str(name).strip().lower()) if name is not None else None


TERMINATE_STATUSES = ("success", "failure")
SYSTEM_BUTTONS = ("Back", "Home", "Menu", "Enter")


_MAX_MESSAGE = 300


class ActionError(Exception):
    """A typed parse or validation failure; parsers return it, they never raise it.

    Attributes:
        reason: Short stable code used for counters and quarantine files (``bad_syntax``,
            ``unknown_action``, ``bad_argument``, ``missing_argument``, ``missing_coordinate``,
            ``coordinate_out_of_range``, ``ambiguous_scale``, ``unsupported_action``, ``bad_key``,
            ``no_tool_call``, ``unknown_platform``, ``empty``).
        message: Human-readable detail naming the offending call or value.
    """

    def __init__(self, reason: str, message: str) -> None:
        if len(message) > _MAX_MESSAGE:
            # Messages quote the offending input, which can be arbitrarily long.
            message = message[: _MAX_MESSAGE - 3] + "..."
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ActionError):
            return NotImplemented
        return (self.reason, self.message) == (other.reason, other.message)

    def __hash__(self) -> int:
        return hash((self.reason, self.message))

    def __repr__(self) -> str:
        return f"ActionError({self.reason!r}, {self.message!r})"


def space_for_platform(platform: str) -> Space:
    """The Qwen3-VL function a platform's actions are rendered with.

    Args:
        platform: One of ``windows``, ``mac``, ``ubuntu``, ``web``, ``android``.

    Returns:
        ``"computer_use"`` for desktop and web, ``"mobile_use"`` for Android.

    Raises:
        ActionError: ``unknown_platform`` for any other value.
    """
    try:
        return _PLATFORM_SPACE[platform]
    except (KeyError, TypeError):
        raise ActionError("unknown_platform", f"unknown platform {platform!r}") from None


# ---------------------------------------------------------------------------------------------
# The action classes. ``_json`` lists (field, kind, required) in the order Qwen writes them.


@dataclass(frozen=True)
class _Base:
    action: ClassVar[str] = ""
    spaces: ClassVar[frozenset[str]] = frozenset()
    _json: ClassVar[tuple[tuple[str, str, bool], ...]] = ()

    def to_arguments(self) -> dict[str, Any]:
        """The Qwen3-VL tool-call ``arguments`` object (metadata excluded)."""
        out: dict[str, Any] = {"action": self.action}
        for name, _kind, required in self._json:
            value = getattr(self, name)
            if value is None and not required:
                continue
            out[name] = list(value) if isinstance(value, tuple) else value
        return out


_POINT = (("coordinate", "coord", True),)


@dataclass(frozen=True)
class Key(_Base):
    """Desktop key press or hotkey: keys pressed in order, released in reverse."""

    action: ClassVar[str] = "key"
    spaces: ClassVar[frozenset[str]] = frozenset({COMPUTER})
    _json: ClassVar = (("keys", "keys", True),)
    keys: tuple[str, ...]


@dataclass(frozen=True)
class MobileKey(_Base):
    """Android key event by name (e.g. ``volume_up``)."""

    action: ClassVar[str] = "key"
    spaces: ClassVar[frozenset[str]] = frozenset({MOBILE})
    _json: ClassVar = (("text", "text", True),)
    text: str


@dataclass(frozen=True)
class Type(_Base):
    """Type a string."""

    action: ClassVar[str] = "type"
    spaces: ClassVar[frozenset[str]] = frozenset(SPACES)
    _json: ClassVar = (("text", "text", True),)
    text: str


@dataclass(frozen=True)
class MouseMove(_Base):
    """Move the pointer to ``coordinate``."""

    action: ClassVar[str] = "mouse_move"
    spaces: ClassVar[frozenset[str]] = frozenset({COMPUTER})
    _json: ClassVar = _POINT
    coordinate: Point


@dataclass(frozen=True)
class LeftClick(_Base):
    """Left click at ``coordinate``."""

    action: ClassVar[str] = "left_click"
    spaces: ClassVar[frozenset[str]] = frozenset({COMPUTER})
    _json: ClassVar = _POINT
    coordinate: Point


@dataclass(frozen=True)
class RightClick(_Base):
    """Right click at ``coordinate``."""

    action: ClassVar[str] = "right_click"
    spaces: ClassVar[frozenset[str]] = frozenset({COMPUTER})
    _json: ClassVar = _POINT
    coordinate: Point


@dataclass(frozen=True)
class MiddleClick(_Base):
    """Middle click at ``coordinate``."""

    action: ClassVar[str] = "middle_click"
    spaces: ClassVar[frozenset[str]] = frozenset({COMPUTER})
    _json: ClassVar = _POINT
    coordinate: Point


@dataclass(frozen=True)
class DoubleClick(_Base):
    """Double click at ``coordinate``."""

    action: ClassVar[str] = "double_click"
    spaces: ClassVar[frozenset[str]] = frozenset({COMPUTER})
    _json: ClassVar = _POINT
    coordinate: Point


@dataclass(frozen=True)
class TripleClick(_Base):
    """Triple click at ``coordinate``."""

    action: ClassVar[str] = "triple_click"
    spaces: ClassVar[frozenset[str]] = frozenset({COMPUTER})
    _json: ClassVar = _POINT
    coordinate: Point


@dataclass(frozen=True)
class LeftClickDrag(_Base):
    """Drag from the current pointer to ``coordinate``.

    Attributes:
        coordinate: End point of the drag.
        start: Where the drag starts (the preceding pointer position), if known; metadata only,
            used for the arrow marker.
    """

    action: ClassVar[str] = "left_click_drag"
    spaces: ClassVar[frozenset[str]] = frozenset({COMPUTER})
    _json: ClassVar = _POINT
    coordinate: Point
    start: Point | None = None


@dataclass(frozen=True)
class Scroll(_Base):
    """Vertical wheel scroll; positive ``pixels`` scroll up, negative down."""

    action: ClassVar[str] = "scroll"
    spaces: ClassVar[frozenset[str]] = frozenset({COMPUTER})
    _json: ClassVar = (("pixels", "int", True), ("coordinate", "coord", False))
    pixels: int
    coordinate: Point | None = None


@dataclass(frozen=True)
class HScroll(_Base):
    """Horizontal scroll; positive ``pixels`` scroll right (pyautogui convention)."""

    action: ClassVar[str] = "hscroll"
    spaces: ClassVar[frozenset[str]] = frozenset({COMPUTER})
    _json: ClassVar = (("pixels", "int", True), ("coordinate", "coord", False))
    pixels: int
    coordinate: Point | None = None


@dataclass(frozen=True)
class Wait(_Base):
    """Wait ``time`` seconds (parsers accept 0 to ``MAX_SECONDS``)."""

    action: ClassVar[str] = "wait"
    spaces: ClassVar[frozenset[str]] = frozenset(SPACES)
    _json: ClassVar = (("time", "time", True),)
    time: float


@dataclass(frozen=True)
class Terminate(_Base):
    """End the task with ``status``; ``info`` (ScaleCUA's note) is metadata only."""

    action: ClassVar[str] = "terminate"
    spaces: ClassVar[frozenset[str]] = frozenset(SPACES)
    _json: ClassVar = (("status", "status", True),)
    status: Literal["success", "failure"]
    info: str | None = None


@dataclass(frozen=True)
class Answer(_Base):
    """Return a text answer to the user."""

    action: ClassVar[str] = "answer"
    spaces: ClassVar[frozenset[str]] = frozenset(SPACES)
    _json: ClassVar = (("text", "text", True),)
    text: str


@dataclass(frozen=True)
class Click(_Base):
    """Mobile tap at ``coordinate``."""

    action: ClassVar[str] = "click"
    spaces: ClassVar[frozenset[str]] = frozenset({MOBILE})
    _json: ClassVar = _POINT
    coordinate: Point


@dataclass(frozen=True)
class LongPress(_Base):
    """Mobile long press at ``coordinate`` for ``time`` seconds (0 to ``MAX_SECONDS``)."""

    action: ClassVar[str] = "long_press"
    spaces: ClassVar[frozenset[str]] = frozenset({MOBILE})
    _json: ClassVar = (("coordinate", "coord", True), ("time", "time", True))
    coordinate: Point
    time: float


@dataclass(frozen=True)
class Swipe(_Base):
    """Finger swipe from ``coordinate`` to ``coordinate2``.

    Attributes:
        coordinate: Start of the finger path.
        coordinate2: End of the finger path.
        synthetic: True when the points were synthesised from a direction-only swipe;
            metadata only.
    """

    action: ClassVar[str] = "swipe"
    spaces: ClassVar[frozenset[str]] = frozenset({MOBILE})
    _json: ClassVar = (("coordinate", "coord", True), ("coordinate2", "coord", True))
    coordinate: Point
    coordinate2: Point
    synthetic: bool = False


@dataclass(frozen=True)
class SystemButton(_Base):
    """Press an Android system button (``Back``, ``Home``, ``Menu``, ``Enter``)."""

    action: ClassVar[str] = "system_button"
    spaces: ClassVar[frozenset[str]] = frozenset({MOBILE})
    _json: ClassVar = (("button", "button", True),)
    button: Literal["Back", "Home", "Menu", "Enter"]


@dataclass(frozen=True)
class Open(_Base):
    """Open an app by name."""

    action: ClassVar[str] = "open"
    spaces: ClassVar[frozenset[str]] = frozenset({MOBILE})
    _json: ClassVar = (("text", "text", True),)
    text: str


@dataclass(frozen=True)
class CallUser(_Base):
    """ScaleCUA's ``call_user()``: hand control to the user. No Qwen3-VL rendering exists."""

    action: ClassVar[str] = "call_user"

    def to_arguments(self) -> dict[str, Any]:
        """Always fails: ``call_user`` has no Qwen3-VL form.

        Raises:
            ActionError: ``unsupported_action``.
        """
        raise ActionError("unsupported_action", "call_user has no Qwen3-VL rendering")


@dataclass(frozen=True)
class ElementAction(_Base):
    """A tap aimed at a UI element by its index, with no point (AndroidWorld M3A/T3A).

    Those agents pick an element from a numbered list of the screen's UI elements and the
    environment taps the centre of its bounding box. Without that list the point is unknown, so
    the action carries the index and has no Qwen3-VL rendering until ``at`` gives it the point;
    a caller that cannot resolve it sends the agent's text as it is (judged without a marker).

    Attributes:
        kind: ``click``, ``double_tap`` or ``long_press``.
        index: The element's index in the agent's UI-element list.
    """

    action: ClassVar[str] = "element"
    kind: Literal["click", "double_tap", "long_press"]
    index: int

    def to_arguments(self) -> dict[str, Any]:
        """Always fails: an element index has no Qwen3-VL form (resolve it with ``at``).

        Raises:
            ActionError: ``missing_coordinate``.
        """
        raise ActionError("missing_coordinate", f"{self.kind} on element {self.index} has no point")

    def at(self, point: Point) -> list[Action]:
        """The actions this is once the element's centre (grid point) is known.

        Args:
            point: The centre of the element's bounding box on the 0-1000 grid.

        Returns:
            ``[Click]``, two ``Click`` for ``double_tap``, or ``[LongPress]`` (1 s, the
            AndroidWorld long-press the executor performs).
        """
        if self.kind == "long_press":
            return [LongPress(point, 1)]
        return [Click(point)] * (2 if self.kind == "double_tap" else 1)


Action = (
    Key
    | MobileKey
    | Type
    | MouseMove
    | LeftClick
    | RightClick
    | MiddleClick
    | DoubleClick
    | TripleClick
    | LeftClickDrag
    | Scroll
    | HScroll
    | Wait
    | Terminate
    | Answer
    | Click
    | LongPress
    | Swipe
    | SystemButton
    | Open
    | CallUser
    | ElementAction
)

_RENDERABLE: tuple[type[_Base], ...] = (
    Key,
    MobileKey,
    Type,
    MouseMove,
    LeftClick,
    RightClick,
    MiddleClick,
    DoubleClick,
    TripleClick,
    LeftClickDrag,
    Scroll,
    HScroll,
    Wait,
    Terminate,
    Answer,
    Click,
    LongPress,
    Swipe,
    SystemButton,
    Open,
)

ACTION_NAMES: dict[Space, tuple[str, ...]] = {
    space: tuple(dict.fromkeys(c.action for c in _RENDERABLE if space in c.spaces))
    for space in SPACES
}
"""Action enum per space, in a stable order."""

POINT_ACTIONS = (MouseMove, LeftClick, RightClick, MiddleClick, DoubleClick, TripleClick, Click)


def in_space(action: Action, space: str) -> bool:
    """Whether ``action`` can be rendered as a call of ``space``."""
    return space in type(action).spaces


# ---------------------------------------------------------------------------------------------
# JSON arguments -> Action


def round_half_up(value: float) -> int:
    """Round to the nearest integer, halves away from zero for positives (873.5 -> 874).

    Python's ``round`` rounds halves to even; the grid conversion must not depend on parity. The
    value is first rounded to 6 decimals so that float noise (873.4999999) does not flip a half.
    """
    return math.floor(round(value, 6) + 0.5)


MAX_MAGNITUDE = 1e15
"""Largest accepted numeric argument: far beyond any screen, scroll or duration, and small enough
that every int converts to a float exactly (huge literals would overflow ``float()``)."""


def is_number(value: object) -> bool:
    """Whether ``value`` is a real, finite number of sane size (bools excluded).

    Args:
        value: Any decoded argument value.

    Returns:
        True for ints and finite floats with magnitude at most ``MAX_MAGNITUDE``.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return abs(value) <= MAX_MAGNITUDE


def _show(value: object) -> str:
    """``repr`` for messages; huge ints refuse ``repr`` beyond Python's digit limit."""
    try:
        return repr(value)
    except ValueError:
        return f"<{type(value).__name__} too large to show>"


MAX_SECONDS = 3600
"""Longest accepted ``wait``/``long_press`` duration in seconds (one hour). No GUI step waits
longer; a bigger value is a corrupt record or a runaway model, and would stall an executor."""


def check_seconds(value: object, name: str) -> float | ActionError:
    """Validate a duration argument: a number in [0, ``MAX_SECONDS``].

    Args:
        value: The decoded argument value.
        name: Argument name, for the message.

    Returns:
        The value unchanged, or ``bad_argument``.
    """
    if not is_number(value) or not 0 <= value <= MAX_SECONDS:  # type: ignore[operator]
        msg = f"{name} must be a number in [0, {MAX_SECONDS}] (seconds), got {_show(value)}"
        return ActionError("bad_argument", msg)
    return value  # type: ignore[return-value]


def _check_coord(value: object, name: str) -> Point | ActionError:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return ActionError("bad_argument", f"{name} must be [x, y], got {_show(value)}")
    if not all(is_number(v) for v in value):
        return ActionError("bad_argument", f"{name} must hold two numbers, got {_show(value)}")
    x, y = (round_half_up(v) for v in value)
    if not (0 <= x <= GRID_MAX and 0 <= y <= GRID_MAX):
        return ActionError("coordinate_out_of_range", f"{name} {[x, y]} is outside 0..{GRID_MAX}")
    return (x, y)


def _check_value(kind: str, value: object, name: str) -> Any:
    """Validate one argument by kind; returns the stored value or an ActionError."""
    if kind == "coord":
        return _check_coord(value, name)
    if kind == "text":
        if not isinstance(value, str):
            return ActionError("bad_argument", f"{name} must be a string, got {_show(value)}")
        return value
    if kind == "keys":
        ok = isinstance(value, list) and value and all(isinstance(k, str) and k for k in value)
        if not ok:
            msg = f"keys must be a non-empty list of strings: {_show(value)}"
            return ActionError("bad_argument", msg)
        return tuple(value)
    if kind == "int":
        if not is_number(value) or value != int(value):
            return ActionError("bad_argument", f"{name} must be an integer, got {_show(value)}")
        return int(value)
    if kind == "time":
        return check_seconds(value, name)
    if kind == "status":
        if value not in TERMINATE_STATUSES:
            return ActionError("bad_argument", f"status must be success|failure: {_show(value)}")
        return value
    if value not in SYSTEM_BUTTONS:  # kind == "button"
        return ActionError("bad_argument", f"button must be in {SYSTEM_BUTTONS}: {_show(value)}")
    return value


def _candidates(name: object, space: str | None) -> list[type[_Base]]:
    return [c for c in _RENDERABLE if c.action == name and (space is None or space in c.spaces)]


def action_from_arguments(obj: object, space: str | None = None) -> Action | ActionError:
    """Build an action from a Qwen3-VL ``arguments`` object; the inverse of ``to_arguments``.

    Args:
        obj: The decoded ``arguments`` object, e.g. ``{"action": "click", "coordinate": [1, 2]}``.
        space: ``"computer_use"`` or ``"mobile_use"`` to restrict the enum; ``None`` accepts the
            union (``key`` then picks ``keys`` vs ``text`` by which argument is present).

    Returns:
        The action, or an ``ActionError`` (unknown action, missing or unexpected argument, bad
        value or enum, coordinate outside 0..1000). Fractional coordinates are rounded half up;
        ``terminate`` accepts only ``success``/``failure``. Never raises.
    """
    if space is not None and space not in SPACES:
        return ActionError("unknown_action", f"unknown function {space!r}")
    if not isinstance(obj, dict):
        return ActionError("bad_argument", f"arguments must be an object, got {type(obj).__name__}")
    name = obj.get("action")
    classes = _candidates(name, space)
    if not classes:
        where = f" in {space}" if space else ""
        return ActionError("unknown_action", f"unknown action {_show(name)}{where}")
    if len(classes) > 1:  # only "key" without a space: choose by the argument present
        classes = [c for c in classes if c._json[0][0] in obj] or classes[:1]
    cls = classes[0]
    allowed = {n for n, _k, _r in cls._json}
    extra = sorted(str(k) for k in obj if k != "action" and k not in allowed)
    if extra:
        return ActionError("bad_argument", f"{name}: unexpected argument(s) {extra}")
    values: dict[str, Any] = {}
    for arg, kind, required in cls._json:
        if arg not in obj or (obj[arg] is None and not required):
            if required:
                return ActionError("missing_argument", f"{name} needs {arg!r}")
            continue
        checked = _check_value(kind, obj[arg], arg)
        if isinstance(checked, ActionError):
            return checked
        values[arg] = checked
    return cls(**values)  # type: ignore[return-value]
