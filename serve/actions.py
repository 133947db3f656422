"""Actions as runners send them -> typed 0–1000 grid actions, prompt text and markers.

A runner states its coordinate space once per session (or per action); the gateway converts, so a
click means the same pixel whatever the policy's convention (screen pixels, the 0–1000 grid, the
0–999 grid some Qwen3-VL agents divide by, [0, 1] floats, or pixels of a resized frame). Text the
parsers cannot read is kept: it is critiqued as raw text without a marker, which is what the
Action Formulation Error dimension is for. A typed pointer action outside the frame is never
clamped; the verdict comes from a rule instead (``out_of_frame``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from hivig.actions import (
    AGENT_FORMATS,
    SCROLL_PIXELS_PER_CLICK,
    Action,
    ActionError,
    ElementAction,
    action_from_arguments,
    detect_format,
    in_space,
    marks_for_tool_calls,
    parse_agent_output,
    parse_androidworld,
    parse_osworld,
    parse_scalecua,
    parse_tool_calls,
    pointer_after,
    render_tool_calls,
    space_for_platform,
)
from hivig.actions.model import round_half_up
from hivig.messages import Mark
from hivig.prompts import format_raw_step, format_step
from serve.errors import ApiError

OUT_OF_RANGE = "coordinate_out_of_range"

_OSWORLD_SPECIAL = ("WAIT", "DONE", "FAIL")
_INTENT_LINE = re.compile(r"^\s*Action:\s*(.+?)\s*$", re.MULTILINE)
_COORD_KEYS = ("coordinate", "coordinate2")


@dataclass(frozen=True)
class CoordinateSpace:
    """How coordinates are stated: the space and, for pixel spaces, the image they refer to."""

    space: str
    width: int
    height: int

    def to_grid(self, x: float, y: float) -> tuple[int, int]:
        """Grid coordinates of a point, unclamped (out-of-frame points stay out of 0..1000)."""
        if self.space == "norm1000":
            return round_half_up(x), round_half_up(y)
        if self.space == "norm01":
            return round_half_up(x * 1000), round_half_up(y * 1000)
        w, h = (999, 999) if self.space == "norm999" else (self.width, self.height)
        return round_half_up(x / w * 1000), round_half_up(y / h * 1000)

    def from_grid(self, x: int, y: int) -> tuple[int, int]:
        """Screen pixels of a grid point (for the ``marker`` field of responses)."""
        return int(x / 1000 * self.width), int(y / 1000 * self.height)

    def scale(self) -> tuple[str, int, int]:
        """``(scale, width, height)`` for the text parsers (ScaleCUA, OSWorld, AndroidWorld)."""
        if self.space == "norm1000":
            return "grid", 1000, 1000
        if self.space == "norm01":
            return "unit", self.width, self.height
        if self.space == "norm999":
            return "pixel", 999, 999
        return "pixel", self.width, self.height


@dataclass(frozen=True)
class ResolvedAction:
    """One proposed or executed step, ready for a prompt.

    Attributes:
        intent: The policy's verbal intent, if any (the ``Action:`` line).
        actions: Typed grid actions, or ``None`` when the text could not be parsed.
        raw: The policy's text as sent (or the typed JSON).
        tool_calls: Canonical ``<tool_call>`` text of ``actions``, else ``raw``.
        error: The parse failure (``reason: message``), if any.
        out_of_frame: A pointer coordinate lies outside the frame (answered by a rule).
    """

    intent: str | None
    actions: tuple[Action, ...] | None
    raw: str
    tool_calls: str
    error: str | None = None
    out_of_frame: bool = False

    def step_text(self, space: str) -> str:
        """The step as prompts show it (``format_step``, or ``format_raw_step`` when unparsed)."""
        if self.actions:
            return format_step(self.intent, self.actions, space)
        return format_raw_step(self.intent, self.tool_calls)

    def marks(self, pointer: tuple[int, int] | None) -> list[Mark]:
        """Markers of the step, by the rule training used (blocks that parse keep theirs)."""
        return marks_for_tool_calls(self.tool_calls, pointer=pointer)

    def to_trace(self) -> dict[str, Any]:
        """The trace's view of the step."""
        return {
            "intent": self.intent,
            "action_text": self.tool_calls,
            "raw": self.raw,
            "parse_error": self.error,
        }


def pointer_of(actions: list[Action]) -> tuple[int, int] | None:
    """Pointer position after the executed actions (drag starts are read from it)."""
    return pointer_after(actions)


# ---------------------------------------------------------------------------------------------
# Entry point


def resolve(
    obj: Any, platform: str, frame: CoordinateSpace, default_format: str = "auto"
) -> ResolvedAction:
    """Turn a request's action object into a ``ResolvedAction``.

    Args:
        obj: ``{"raw": str, "format"?, "intent"?, "coord_space"?, "frame"?, "verbatim"?}`` or a
            typed ``{"type": ..., "x": .., "y": ..}`` object (see ``docs/serving.md``). With
            ``verbatim: true`` the text is read strictly (no repair): the runner will execute
            it as written, so a broken call is judged as the raw text it is.
        platform: Session platform (picks ``computer_use`` or ``mobile_use``).
        frame: Session coordinate frame; ``coord_space``/``frame`` in ``obj`` override it.
        default_format: The session's ``action_format``.

    Raises:
        ApiError: 422 ``bad_action`` when there is neither a typed action nor ``raw`` text, or a
            field has the wrong type.
    """
    if not isinstance(obj, dict):
        raise ApiError(422, "bad_action", "an action must be a JSON object")
    frame = _override_frame(obj, frame)
    space = space_for_platform(platform)
    intent = obj.get("intent")
    if intent is not None and not isinstance(intent, str):
        raise ApiError(422, "bad_action", "`intent` must be a string")
    if "type" in obj:
        raw = obj.get("raw") if isinstance(obj.get("raw"), str) else _typed_text(obj)
        parsed = _typed(obj, frame, space)
        return _finish(intent, parsed, raw, space, frame)
    raw = obj.get("raw")
    if not isinstance(raw, str) or not raw.strip():
        raise ApiError(422, "bad_action", "an action needs a typed `type` or non-empty `raw` text")
    fmt = obj.get("format", default_format) or "auto"
    if fmt not in AGENT_FORMATS:
        raise ApiError(422, "bad_action", f"unknown action format {fmt!r}")
    if fmt == "auto":
        fmt = detect_format(raw)
    if intent is None and fmt == "qwen":
        found = _INTENT_LINE.search(raw.split("<tool_call>", 1)[0])
        intent = found.group(1) if found else None
    verbatim = obj.get("verbatim", False)
    if not isinstance(verbatim, bool):
        raise ApiError(422, "bad_action", "`verbatim` must be true or false")
    parsed = _parse_text(raw, fmt, platform, frame, space)
    if isinstance(parsed, ActionError) and parsed.reason != OUT_OF_RANGE and not verbatim:
        # What real agents emit (module prefixes, a doubled brace, prose around the call) goes
        # through the shared tolerant front door, as the runner adapters do; text that stays
        # unreadable is judged as it was written.
        repaired = parse_agent_output(
            raw,
            fmt,
            platform=platform,
            width=frame.width,
            height=frame.height,
            coord_space=frame.space,
            frame=(frame.width, frame.height),
        )
        if not isinstance(repaired, ActionError):
            parsed = repaired
    return _finish(intent, parsed, raw, space, frame)


def _finish(
    intent: str | None,
    parsed: list[Action] | ActionError,
    raw: str,
    space: str,
    frame: CoordinateSpace | None = None,
) -> ResolvedAction:
    if isinstance(parsed, ActionError):
        return ResolvedAction(
            intent=intent,
            actions=None,
            raw=raw,
            tool_calls=_unparsed_calls(raw, frame),
            error=_error_text(parsed),
            out_of_frame=parsed.reason == OUT_OF_RANGE,
        )
    if not parsed:
        return ResolvedAction(intent, None, raw, raw, "empty: no action in the text")
    unshown = [a for a in parsed if not in_space(a, space)]
    if unshown:
        # An action with no tool-call form here (an element index without its point, a
        # call_user): the step is judged as the text the policy wrote, never with a made-up point.
        why = unshown[0]
        error = ActionError("unsupported_action", f"{why.action} has no {space} tool call")
        if isinstance(why, ElementAction):
            error = ActionError("missing_coordinate", f"{why.kind} on element {why.index}")
        return _finish(intent, error, raw, space, frame)
    return ResolvedAction(intent, tuple(parsed), raw, render_tool_calls(parsed, space))


def _error_text(error: ActionError) -> str:
    """``reason: message`` once (an ``ActionError``'s own text may start with its reason)."""
    text = str(error)
    return text if text.startswith(f"{error.reason}:") else f"{error.reason}: {text}"


_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL | re.IGNORECASE)


def _unparsed_calls(raw: str, frame: CoordinateSpace | None) -> str:
    """What the critic sees of a step that does not parse, in the training data's form.

    Training's malformed steps are their ``<tool_call>`` blocks only, coordinates on the grid
    (``format_raw_step(intent, calls)``): thought text and the ``Action:`` line are dropped (the
    intent is shown once, from its own field), and a block whose JSON reads has its coordinates
    converted from the session's space, so its marker lands where the policy pointed. Text with
    no tool-call block is kept as written.
    """
    blocks = _BLOCK.findall(raw)
    if not blocks:
        return raw.strip()
    if frame is None or frame.space == "norm1000":
        return "\n".join(blocks)
    return "\n".join(_grid_block(b, frame) for b in blocks)


def _grid_block(block: str, frame: CoordinateSpace) -> str:
    body = block[len("<tool_call>") :]
    closed = body.lower().endswith("</tool_call>")
    body = body[: -len("</tool_call>")] if closed else body
    try:
        call = json.loads(body)
    except (json.JSONDecodeError, ValueError):
        return block
    args = call.get("arguments") if isinstance(call, dict) else None
    if not isinstance(args, dict):
        return block
    converted = _grid_arguments(args, frame)
    if isinstance(converted, ActionError):
        return block
    text = json.dumps({**call, "arguments": converted}, ensure_ascii=False)
    return f"<tool_call>\n{text}\n</tool_call>" if closed else f"<tool_call>\n{text}"


def _override_frame(obj: dict[str, Any], frame: CoordinateSpace) -> CoordinateSpace:
    space = obj.get("coord_space", frame.space)
    size = obj.get("frame")
    if space not in ("screen_px", "norm1000", "norm999", "norm01", "resized_px"):
        raise ApiError(422, "bad_request", f"unknown coord_space {space!r}")
    if size is None:
        return CoordinateSpace(space, frame.width, frame.height)
    if not (
        isinstance(size, dict) and _positive_int(size.get("w")) and _positive_int(size.get("h"))
    ):
        raise ApiError(422, "bad_request", '`frame` must be {"w": int > 0, "h": int > 0}')
    return CoordinateSpace(space, size["w"], size["h"])


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# ---------------------------------------------------------------------------------------------
# Text formats


def _parse_text(
    raw: str, fmt: str, platform: str, frame: CoordinateSpace, space: str
) -> list[Action] | ActionError:
    scale, width, height = frame.scale()
    if fmt == "qwen":
        return _parse_qwen(raw, frame, space)
    if fmt == "osworld":
        text = raw.strip()
        # pyautogui scrolls in wheel clicks, 100 Qwen pixels each, as ScaleCUA's scroll(clicks=)
        # is read for the training data and as the adapters read it.
        code = text if text in _OSWORLD_SPECIAL else raw
        return parse_osworld(code, width, height, pixels_per_click=SCROLL_PIXELS_PER_CLICK)
    if fmt == "androidworld":
        return parse_androidworld(raw, width, height)
    if fmt == "webarena_code":
        # Only the tolerant front door reads the executed code list (no strict form exists).
        return ActionError("bad_syntax", "webarena_code is read by the front door")
    out = parse_scalecua(raw, platform, frame.width, frame.height, scale=scale)
    if isinstance(out, ActionError):
        return out
    return list(out.actions)


def _parse_qwen(raw: str, frame: CoordinateSpace, space: str) -> list[Action] | ActionError:
    """Qwen3-VL tool calls; coordinates are converted first when the space is not the grid."""
    if frame.space == "norm1000":
        return parse_tool_calls(raw)
    blocks = re.findall(r"<tool_call>(.*?)</tool_call>", raw, flags=re.DOTALL | re.IGNORECASE)
    if not blocks:
        return parse_tool_calls(raw)
    actions: list[Action] = []
    for body in blocks:
        try:
            call = json.loads(body)
        except json.JSONDecodeError as e:
            return ActionError("bad_syntax", f"tool call is not JSON: {e}")
        args = call.get("arguments") if isinstance(call, dict) else None
        if not isinstance(args, dict):
            return ActionError("bad_syntax", "tool call without an arguments object")
        converted = _grid_arguments(args, frame)
        if isinstance(converted, ActionError):
            return converted
        action = action_from_arguments(converted, space)
        if isinstance(action, ActionError):
            return action
        actions.append(action)
    return actions


def _grid_arguments(args: dict[str, Any], frame: CoordinateSpace) -> dict[str, Any] | ActionError:
    out = dict(args)
    for key in _COORD_KEYS:
        value = args.get(key)
        if value is None:
            continue
        if not (isinstance(value, list) and len(value) == 2 and all(map(_number, value))):
            return ActionError("bad_argument", f"{key} must be [x, y] of finite numbers")
        if not all(map(_on_some_screen, value)):
            return _far_off(key, value)
        out[key] = list(frame.to_grid(float(value[0]), float(value[1])))
    return out


_MAX_COORDINATE = 1e9
"""Beyond any screen in any space; a larger coordinate is off screen, not a number to scale."""


def _number(value: Any) -> bool:
    """A finite JSON number (booleans, strings, NaN and infinities are not coordinates)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value)


def _on_some_screen(value: float) -> bool:
    return abs(value) < _MAX_COORDINATE


def _far_off(key: str, value: Any) -> ActionError:
    # Answered by the off-screen rule like any other point outside the frame (never the model).
    return ActionError(OUT_OF_RANGE, f"{key} {value!r} is far outside any screen")


# ---------------------------------------------------------------------------------------------
# Typed JSON actions

_TYPED_FIELDS = ("text", "keys", "pixels", "time", "status", "button")


def _typed(obj: dict[str, Any], frame: CoordinateSpace, space: str) -> list[Action] | ActionError:
    kind = obj.get("type")
    if not isinstance(kind, str):
        return ActionError("unknown_action", "`type` must be a string")
    points: dict[str, list[int]] = {}
    for names, key in ((("x", "y"), "coordinate"), (("x2", "y2"), "coordinate2")):
        a, b = obj.get(names[0]), obj.get(names[1])
        if a is None and b is None:
            continue
        if not (_number(a) and _number(b)):
            # A typed action is the client's own JSON: a wrong type is its mistake (422), not a
            # policy's text to judge as written.
            raise ApiError(422, "bad_action", f"`{names[0]}`/`{names[1]}` must be JSON numbers")
        if not (_on_some_screen(a) and _on_some_screen(b)):
            return _far_off(key, [a, b])
        points[key] = list(frame.to_grid(float(a), float(b)))
    if kind == "left_click_drag" and "coordinate2" in points:
        # A desktop drag is a move to its start and a drag to its end (the Qwen action takes the
        # end only), exactly as the OSWorld parser writes moveTo + dragTo: both points are checked
        # against the frame and the marker's arrow starts where the move left the pointer.
        move = action_from_arguments(
            {"action": "mouse_move", "coordinate": points["coordinate"]}, space
        )
        drag = action_from_arguments({"action": kind, "coordinate": points["coordinate2"]}, space)
        for part in (move, drag):
            if isinstance(part, ActionError):
                return part
        return [move, drag]  # type: ignore[list-item]
    args: dict[str, Any] = {"action": kind, **points}
    for name in _TYPED_FIELDS:
        if name in obj:
            args[name] = obj[name]
    action = action_from_arguments(args, space)
    return action if isinstance(action, ActionError) else [action]


def _typed_text(obj: dict[str, Any]) -> str:
    keep = {k: v for k, v in obj.items() if k not in ("raw", "intent", "coord_space", "frame")}
    return json.dumps(keep, ensure_ascii=False, sort_keys=True)
