"""ScaleCUA ``<action>`` blocks -> typed actions on the 0–1000 grid.

A block holds one pyautogui-style call per line (``click(x=0.3674, y=0.9192)``). Parsing runs in
three steps so ingest can tally the coordinate scale per file between them:

1. ``parse_scalecua_calls``: ``ast`` per line, arguments bound to the ScaleCUA signatures, aliases
   resolved (``RawCall`` list);
2. ``coordinate_values`` + ``detect_scale``: the per-record scale decision (unit / grid / pixel);
3. ``normalise_calls``: coordinates to the grid and the ScaleCUA -> Qwen3-VL mapping.

``parse_scalecua`` runs all three. Calls with no Qwen3-VL equivalent in the platform's space give
``ActionError("unsupported_action", ...)`` so the caller counts and quarantines the step.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hivig.actions._calls import (
    REQUIRED,
    RawCall,
    Signature,
    bind,
    parse_expression,
    split_call,
)
from hivig.actions._normalise import HSwipe, map_calls
from hivig.actions._tags import first_block
from hivig.actions.model import (
    Action,
    ActionError,
    Point,
    is_number,
)
from hivig.actions.scale import Scale, coordinate_values, detect_scale

_XY: Signature = (("x", None), ("y", None))

SIGNATURES: dict[str, Signature] = {
    "click": (*_XY, ("clicks", 1), ("button", "left")),
    "doubleClick": (*_XY, ("button", "left")),
    "rightClick": _XY,
    "moveTo": _XY,
    "dragTo": (*_XY, ("button", "left")),
    "scroll": (("clicks", REQUIRED), *_XY),
    "swipe": (("from_coord", None), ("to_coord", None), ("direction", "up"), ("amount", 0.5)),
    "press": (("keys", REQUIRED), ("presses", 1)),
    "hotkey": (("keys", REQUIRED),),
    "keyDown": (("key", REQUIRED),),
    "keyUp": (("key", REQUIRED),),
    "write": (("message", REQUIRED),),
    "long_press": (*_XY, ("duration", 1)),
    "open_app": (("app_name", REQUIRED),),
    "navigate_home": (),
    "navigate_back": (),
    "open_url": (("url", REQUIRED),),
    "go_forward": (),
    "go_backward": (),
    "select_option": (*_XY, ("value", REQUIRED)),
    "call_user": (),
    "wait": (("seconds", 3),),
    "response": (("answer", REQUIRED),),
    "terminate": (("status", "success"), ("info", None)),
}
"""ScaleCUA call signatures; positional arguments bind in this order."""

ALIASES: dict[str, str] = {
    "left_click": "click",
    "tripleClick": "click",
    "type": "write",
    "answer": "response",
    "key": "press",
}
"""Names seen in related code paths, accepted and counted."""

_ALIAS_SIGNATURES: dict[str, Signature] = {"tripleClick": (*_XY, ("button", "left"))}
_ALIAS_FIXED: dict[str, dict[str, Any]] = {"tripleClick": {"clicks": 3}}
# Keyword spellings the aliases bring along (``type(text=...)``, ``key(key=...)``).
_KEYWORD_SYNONYMS: dict[str, dict[str, str]] = {
    "write": {"text": "message"},
    "response": {"text": "answer"},
    "press": {"key": "keys"},
}


@dataclass(frozen=True)
class ScaleCUAParse:
    """A parsed ScaleCUA action block.

    Attributes:
        actions: The step's actions in order.
        scale: The scale used for conversion; ``None`` when the step has no coordinates.
        record_scale: The per-record decision before any file-level tie-break.
        aliases: Alias name -> uses.
        positional: Canonical call name -> calls that used positional arguments.
        flags: Data-quality events (``x_none``, ``clamped``, ``outlier_clicks``,
            ``synthetic_swipe``, ``status_fail``, ``clicks_and_button``, ...) -> count.
    """

    actions: tuple[Action, ...]
    scale: Scale | None
    record_scale: Scale | None
    aliases: dict[str, int] = field(default_factory=dict)
    positional: dict[str, int] = field(default_factory=dict)
    flags: dict[str, int] = field(default_factory=dict)


def _check_coordinate_types(name: str, kw: dict[str, Any], line: str) -> ActionError | None:
    for axis in ("x", "y"):
        if axis in kw and kw[axis] is not None and not is_number(kw[axis]):
            return ActionError("bad_argument", f"{name}: {axis} must be a number: {line!r}")
    for key in ("from_coord", "to_coord"):
        value = kw.get(key)
        if value is None:
            continue
        if not (isinstance(value, (list, tuple)) and len(value) == 2):
            return ActionError("bad_argument", f"{name}: {key} must be [x, y]: {line!r}")
        if not all(is_number(v) for v in value):
            return ActionError("bad_argument", f"{name}: {key} must hold numbers: {line!r}")
    return None


def _bind_scalecua(written: str, args: list[Any], kwargs: dict[str, Any], line: str) -> Any:
    name = ALIASES.get(written, written)
    if name not in SIGNATURES:
        return ActionError("unknown_action", f"unknown call {written!r}: {line!r}")
    for alt, param in _KEYWORD_SYNONYMS.get(name, {}).items():
        if alt in kwargs:
            if param in kwargs:
                return ActionError("bad_argument", f"{name} got {param!r} twice: {line!r}")
            kwargs[param] = kwargs.pop(alt)
    if name == "hotkey":
        # f(*keys): the positional values bind to `keys` as one tuple, so `keys=` given as well
        # is "got twice" rather than half of the keys silently dropped.
        bound = bind(name, SIGNATURES[name], [tuple(args)] if args else [], kwargs, line)
    else:
        bound = bind(name, _ALIAS_SIGNATURES.get(written, SIGNATURES[name]), args, kwargs, line)
    if isinstance(bound, ActionError):
        return bound
    bound.update(_ALIAS_FIXED.get(written, {}))
    bad = _check_coordinate_types(name, bound, line)
    if bad is not None:
        return bad
    alias = written if written != name else None
    return RawCall(name, bound, alias=alias, positional=bool(args), line=line)


def _parse_line(line: str) -> RawCall | ActionError:
    node = parse_expression(line)
    if isinstance(node, ActionError):
        return node
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        return ActionError("bad_syntax", f"not a call of a bare name: {line!r}")
    split = split_call(node, line)
    if isinstance(split, ActionError):
        return split
    return _bind_scalecua(node.func.id, *split, line)


def parse_scalecua_calls(text: str) -> list[RawCall] | ActionError:
    """Parse a ScaleCUA ``<action>`` body (one call per line) into bound calls.

    Args:
        text: The body of ``<action>``; a full ``<action>...</action>`` block is also accepted.

    Returns:
        The calls in order, or ``bad_syntax`` (unparseable line, not a bare-name call),
        ``unknown_action``, ``bad_argument``, ``missing_argument`` or ``empty``. Never raises.
    """
    if not isinstance(text, str):
        return ActionError("bad_syntax", f"action text must be a string, got {type(text).__name__}")
    tagged = first_block(text, "action")
    body = text if tagged is None else tagged
    lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
    if not lines:
        return ActionError("empty", "no action calls")
    calls: list[RawCall] = []
    for line in lines:
        call = _parse_line(line)
        if isinstance(call, ActionError):
            return call
        calls.append(call)
    return calls


def normalise_calls(
    calls: list[RawCall],
    platform: str,
    width: int,
    height: int,
    scale: str | None = None,
    *,
    scroll_sign: int = 1,
    hswipe: HSwipe = "finger",
    pointer: Point | None = None,
    flags: Counter[str] | None = None,
) -> list[Action] | ActionError:
    """Map bound ScaleCUA calls to Qwen3-VL actions on the 0–1000 grid.

    Args:
        calls: Output of ``parse_scalecua_calls``.
        platform: ``windows``, ``mac``, ``ubuntu``, ``web`` (``computer_use``) or ``android``
            (``mobile_use``).
        width: Screenshot width in pixels (used for pixel scale).
        height: Screenshot height in pixels.
        scale: The file's scale decision; ``None`` uses the record's own (``detect_scale``).
            Contradictions give ``ambiguous_scale``.
        scroll_sign: ``1`` keeps the pyautogui wheel sign (positive = up); ``-1`` flips it for
            data whose convention was found inverted.
        hswipe: ``"finger"`` (finger left -> positive ``hscroll``) or ``"reference"`` (the HiViG
            release's opposite horizontal sign, for compatibility runs).
        pointer: Pointer position left by the previous step, if known (drag start, bare click).
        flags: Counter that receives data-quality events; a fresh one when omitted.

    Returns:
        The actions in order, or an ``ActionError`` (``unsupported_action`` for calls with no
        equivalent in the platform's space, ``coordinate_out_of_range``, ``ambiguous_scale``,
        ``missing_coordinate``, ``bad_key``, ``bad_argument``, ...). Never raises.
    """
    out = map_calls(
        calls,
        platform,
        width,
        height,
        scale,
        scroll_sign=scroll_sign,
        hswipe=hswipe,
        pointer=pointer,
        flags=flags,
    )
    return out if isinstance(out, ActionError) else out[0]


def parse_scalecua(
    text: str,
    platform: str,
    width: int,
    height: int,
    scale: str | None = None,
    scroll_sign: int = 1,
    hswipe: HSwipe = "finger",
) -> ScaleCUAParse | ActionError:
    """Parse a ScaleCUA ``<action>`` body into typed actions with scale and quality counters.

    Args:
        text: The ``<action>`` body, one call per line.
        platform: ``windows``, ``mac``, ``ubuntu``, ``web`` or ``android``.
        width: Screenshot width in pixels.
        height: Screenshot height in pixels.
        scale: The file-level scale decision, or ``None`` to use the record's own.
        scroll_sign: Wheel sign convention (see ``normalise_calls``).
        hswipe: Horizontal swipe convention (see ``normalise_calls``).

    Returns:
        A ``ScaleCUAParse`` or an ``ActionError``. Never raises.
    """
    calls = parse_scalecua_calls(text)
    if isinstance(calls, ActionError):
        return calls
    flags: Counter[str] = Counter()
    out = map_calls(
        calls, platform, width, height, scale, scroll_sign=scroll_sign, hswipe=hswipe, flags=flags
    )
    if isinstance(out, ActionError):
        return out
    actions, used = out
    return ScaleCUAParse(
        actions=tuple(actions),
        scale=used,
        record_scale=detect_scale(coordinate_values(calls)),
        aliases=dict(Counter(c.alias for c in calls if c.alias)),
        positional=dict(Counter(c.name for c in calls if c.positional)),
        flags=dict(flags),
    )
