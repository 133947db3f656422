"""One step's action -> ScaleCUA ``<action>`` lines with [0, 1] coordinates, checked.

The published layout writes coordinates as fractions of the screenshot
(``click(x=0.3674, y=0.9192)``). Runner steps arrive two ways:

* with the runner's calls in screen pixels (``FolderStep.calls``: OSWorld and WAA pyautogui
  code as executed, AndroidLab/AndroidWorld/WebArenaLiteV2 ``<action>`` pixels of the resized
  frame already rescaled to the device exactly as the runner does). Each coordinate is divided
  by the screen side once, as a full-precision float, so ``fraction * side`` gives the runner's
  pixel back;
* as grid actions only (gateway traces, whose tool calls are on the 0-1000 grid): each action is
  written as its ScaleCUA call with ``grid / 1000``.

Either way the written lines are read back with ingest's own parser and normaliser and must give
exactly the step's grid actions; a step that does not is quarantined, never written.
"""

from __future__ import annotations

from typing import Any

from hivig.actions import (
    SCROLL_PIXELS_PER_CLICK,
    Action,
    ActionError,
    Answer,
    Click,
    DoubleClick,
    Key,
    LeftClick,
    LeftClickDrag,
    LongPress,
    MiddleClick,
    MouseMove,
    Open,
    RawCall,
    RightClick,
    Scroll,
    Swipe,
    SystemButton,
    Terminate,
    TripleClick,
    Type,
    Wait,
    normalise_calls,
    parse_scalecua_calls,
)

GRID = 1000
"""Side of the grid trace actions are written on."""

_XY = ("x", "y")
_PAIRS = ("from_coord", "to_coord")


def _literal(value: Any) -> str:
    """A Python literal ``ast.literal_eval`` reads back as ``value`` (tuples as lists)."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    return repr(value)


def render_call(name: str, kwargs: dict[str, Any]) -> str:
    """``name(k=v, ...)`` in ScaleCUA's keyword style."""
    args = ", ".join(f"{k}={_literal(v)}" for k, v in kwargs.items())
    return f"{name}({args})"


def unit_calls(calls: tuple[RawCall, ...], screen: tuple[int, int]) -> list[str]:
    """The runner's screen-pixel calls as ScaleCUA lines with fractions of the screen.

    Args:
        calls: ``FolderStep.calls``.
        screen: ``(width, height)`` in pixels.

    Returns:
        One line per call.
    """
    w, h = screen
    lines = []
    for call in calls:
        kw = dict(call.kwargs)
        for key, side in zip(_XY, (w, h), strict=True):
            if isinstance(kw.get(key), (int, float)) and not isinstance(kw[key], bool):
                kw[key] = kw[key] / side
        for key in _PAIRS:
            pair = kw.get(key)
            if isinstance(pair, (list, tuple)) and len(pair) == 2:
                kw[key] = [pair[0] / w, pair[1] / h]
        lines.append(render_call(call.name, kw))
    return lines


def _xy(point: tuple[int, int]) -> dict[str, float]:
    return {"x": point[0] / GRID, "y": point[1] / GRID}


def _grid_call(action: Action) -> list[tuple[str, dict[str, Any]]] | None:
    """ScaleCUA calls that the normaliser maps back to ``action``; ``None`` when none does."""
    if isinstance(action, (LeftClick, Click)):
        return [("click", _xy(action.coordinate))]
    if isinstance(action, (RightClick, DoubleClick, MouseMove)):
        name = {RightClick: "rightClick", DoubleClick: "doubleClick", MouseMove: "moveTo"}
        return [(name[type(action)], _xy(action.coordinate))]
    if isinstance(action, TripleClick):
        return [("click", {**_xy(action.coordinate), "clicks": 3})]
    if isinstance(action, MiddleClick):
        return [("click", {**_xy(action.coordinate), "button": "middle"})]
    if isinstance(action, LeftClickDrag) and action.start is None:
        return [("dragTo", _xy(action.coordinate))]
    if isinstance(action, Scroll) and action.coordinate is None:
        clicks, rest = divmod(action.pixels, SCROLL_PIXELS_PER_CLICK)
        return None if rest else [("scroll", {"clicks": clicks})]
    if isinstance(action, Key):
        keys = list(action.keys)
        return [("press", {"keys": keys[0]})] if len(keys) == 1 else [("hotkey", {"keys": keys})]
    if isinstance(action, Type):
        return [("write", {"message": action.text})]
    if isinstance(action, Wait):
        return [("wait", {"seconds": action.time})]
    if isinstance(action, Terminate):
        return [("terminate", {"status": action.status, "info": action.info})]
    if isinstance(action, Answer):
        return [("response", {"answer": action.text})]
    if isinstance(action, LongPress):
        return [("long_press", {**_xy(action.coordinate), "duration": action.time})]
    if isinstance(action, Swipe) and not action.synthetic:
        start, end = _xy(action.coordinate), _xy(action.coordinate2)
        return [("swipe", {"from_coord": [*start.values()], "to_coord": [*end.values()]})]
    if isinstance(action, SystemButton):
        name = {"Back": "navigate_back", "Home": "navigate_home"}.get(action.button)
        if name is not None:
            return [(name, {})]
        return [("press", {"keys": "enter"})] if action.button == "Enter" else None
    if isinstance(action, Open):
        return [("open_app", {"app_name": action.text})]
    return None


def grid_lines(actions: list[Action]) -> list[str] | None:
    """Grid actions (a trace's) as ScaleCUA lines; ``None`` when one has no ScaleCUA form."""
    lines = []
    for action in actions:
        calls = _grid_call(action)
        if calls is None:
            return None
        lines += [render_call(name, kw) for name, kw in calls]
    return lines


def check(
    lines: list[str], actions: list[Action], platform: str, screen: tuple[int, int]
) -> tuple[str, str] | None:
    """Why ``lines`` do not read back (with ingest's parser) as ``actions``; ``None`` if they do.

    Args:
        lines: The ScaleCUA lines to write.
        actions: The step's grid actions as the runner's own text reads.
        platform: The run's platform.
        screen: The screenshot's ``(width, height)``.

    Returns:
        ``(reason, message)`` or ``None``.
    """
    calls = parse_scalecua_calls("\n".join(lines))
    if isinstance(calls, ActionError):
        return "not_expressible", f"{calls.reason}: {calls.message}"
    got = normalise_calls(calls, platform, screen[0], screen[1], "unit")
    if isinstance(got, ActionError):
        return "not_expressible", f"{got.reason}: {got.message}"
    if list(got) != list(actions):
        return "conversion_mismatch", f"reads back as {got!r}, the runner's text as {actions!r}"
    return None
