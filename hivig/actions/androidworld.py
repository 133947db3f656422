"""AndroidWorld JSON actions in device pixels -> typed ``mobile_use`` actions on the 0–1000 grid.

AndroidWorld agents hand the environment one JSON action per step
(``{"action_type": "click", "x": 540, "y": 1200}``). Each is rewritten to its ScaleCUA equivalent
and mapped by the shared normaliser, so pixel conversion, range checks and swipe synthesis follow
the same rules as training data.
"""

from __future__ import annotations

from typing import Any

from hivig.actions._calls import RawCall
from hivig.actions._normalise import map_calls
from hivig.actions._strict_json import loads
from hivig.actions.model import Action, ActionError

ANDROIDWORLD_WAIT_SECONDS = 3
"""Seconds a ``wait`` stands for; AndroidWorld's ``wait`` carries no duration (ScaleCUA default)."""

SCROLL_AMOUNT = 0.5
"""Finger travel, as a fraction of the screen, for direction-only scrolls and swipes."""

# ``scroll`` names the direction the view moves (content revealed), ``swipe`` the finger's.
_REVERSE = {"up": "down", "down": "up", "left": "right", "right": "left"}
_GOAL_STATUS = {"complete": "success", "infeasible": "failure"}
_NO_ARGUMENTS = {"navigate_home": "navigate_home", "navigate_back": "navigate_back"}


def _xy(obj: dict[str, Any]) -> dict[str, Any]:
    return {"x": obj.get("x"), "y": obj.get("y")}


def _direction(obj: dict[str, Any], reverse: bool) -> list[RawCall] | ActionError:
    direction = obj.get("direction")
    if not isinstance(direction, str) or direction not in _REVERSE:
        return ActionError("bad_argument", f"direction must be up|down|left|right: {direction!r}")
    finger = _REVERSE[direction] if reverse else direction
    return [RawCall("swipe", {"direction": finger, "amount": SCROLL_AMOUNT})]


def androidworld_calls(obj: dict[str, Any]) -> list[RawCall] | ActionError:
    """One AndroidWorld action object -> ScaleCUA-style raw calls, or an ``ActionError``."""
    kind = obj.get("action_type")
    if not isinstance(kind, str):
        return ActionError("bad_argument", "action_type must be a string")
    if kind in ("click", "double_tap"):
        clicks = 2 if kind == "double_tap" else 1
        return [RawCall("click", {**_xy(obj), "clicks": clicks, "button": "left"})]
    if kind == "long_press":
        return [RawCall("long_press", {**_xy(obj), "duration": 1})]
    if kind == "input_text":
        if obj.get("x") is None and obj.get("index") is not None:
            # The field is named by its index: the tap has no point here (see ElementAction).
            return ActionError("missing_coordinate", "input_text targets an element by index")
        # A target point means "tap the field, then type"; without one, type into the focus.
        tap = [RawCall("click", {**_xy(obj), "clicks": 1})] if obj.get("x") is not None else []
        return [*tap, RawCall("write", {"message": obj.get("text")})]
    if kind == "keyboard_enter":
        return [RawCall("press", {"keys": "enter", "presses": 1})]
    if kind in _NO_ARGUMENTS:
        return [RawCall(_NO_ARGUMENTS[kind], {})]
    if kind == "open_app":
        return [RawCall("open_app", {"app_name": obj.get("app_name")})]
    if kind == "wait":
        return [RawCall("wait", {"seconds": ANDROIDWORLD_WAIT_SECONDS})]
    if kind == "answer":
        return [RawCall("response", {"answer": obj.get("text")})]
    if kind == "status":
        status = obj.get("goal_status")
        if not isinstance(status, str) or status not in _GOAL_STATUS:
            return ActionError(
                "bad_argument", f"goal_status must be complete|infeasible: {status!r}"
            )
        return [RawCall("terminate", {"status": _GOAL_STATUS[status]})]
    if kind in ("scroll", "swipe"):
        return _direction(obj, reverse=kind == "scroll")
    return ActionError("unsupported_action", f"AndroidWorld action {kind!r} is not supported")


def parse_androidworld(
    action: str | dict[str, Any], width: int, height: int
) -> list[Action] | ActionError:
    """Parse one AndroidWorld JSON action (device pixels) into grid actions.

    Args:
        action: The action object, or its strict-JSON text.
        width: Device screen width in pixels.
        height: Device screen height in pixels.

    Returns:
        ``list[Action]`` (``input_text`` with a target gives a click then a type), or an
        ``ActionError``: ``bad_syntax``, ``bad_argument``, ``missing_coordinate`` (element-index
        actions without x, y), ``coordinate_out_of_range``, ``unsupported_action``. Never raises.
    """
    obj: Any = action
    if isinstance(action, str):
        obj = loads(action, "action")
        if isinstance(obj, ActionError):
            return obj
    if not isinstance(obj, dict):
        return ActionError("bad_syntax", "an AndroidWorld action must be a JSON object")
    calls = androidworld_calls(obj)
    if isinstance(calls, ActionError):
        return calls
    out = map_calls(calls, "android", width, height, "pixel")
    return out if isinstance(out, ActionError) else out[0]
