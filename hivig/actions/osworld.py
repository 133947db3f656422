"""OSWorld-style pyautogui code in screen pixels -> typed actions on the 0–1000 grid.

Runners such as OSWorld hand the agent's actions over as Python source
(``pyautogui.click(960, 540)``) or the special strings ``WAIT``, ``DONE`` and ``FAIL``. The code is
read with ``ast`` (never executed); each call is rewritten to its ScaleCUA equivalent and mapped
by the same normaliser as ScaleCUA data, so both sources agree on every rule (pixel -> grid with
round(x / W * 1000), key validation, keyDown/keyUp folding).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from hivig.actions._calls import (
    REQUIRED,
    RawCall,
    Signature,
    bind,
    parse_module,
    split_call,
)
from hivig.actions._normalise import map_calls
from hivig.actions.model import Action, ActionError, Terminate, Wait

_HOTKEY: Signature = (("keys", REQUIRED),)

OSWORLD_WAIT_SECONDS = 3
"""Seconds a ``WAIT`` string stands for (ScaleCUA's ``wait`` default)."""

_SPECIAL: dict[str, Action] = {
    "WAIT": Wait(OSWORLD_WAIT_SECONDS),
    "DONE": Terminate("success"),
    "FAIL": Terminate("failure"),
}

# Timing and logging arguments change nothing about what the action does.
_IGNORED = frozenset({"interval", "duration", "tween", "logScreenshot", "_pause", "mouseDownUp"})
_XY: Signature = (("x", None), ("y", None))

# pyautogui name -> (ScaleCUA name, pyautogui signature without ignored arguments, fixed kwargs)
_CALLS: dict[str, tuple[str, Signature, dict[str, Any]]] = {
    "click": ("click", (*_XY, ("clicks", 1), ("interval", 0), ("button", "left")), {}),
    "leftClick": ("click", _XY, {}),
    "doubleClick": ("doubleClick", (*_XY, ("interval", 0), ("button", "left")), {}),
    "tripleClick": ("click", (*_XY, ("interval", 0), ("button", "left")), {"clicks": 3}),
    "rightClick": ("rightClick", _XY, {}),
    "middleClick": ("click", _XY, {"button": "middle"}),
    "moveTo": ("moveTo", _XY, {}),
    "dragTo": ("dragTo", (*_XY, ("duration", 0), ("button", "left")), {}),
    "scroll": ("scroll", (("clicks", REQUIRED), *_XY), {}),
    "vscroll": ("scroll", (("clicks", REQUIRED), *_XY), {}),
    "hscroll": ("hscroll", (("clicks", REQUIRED), *_XY), {}),
    "press": ("press", (("keys", REQUIRED), ("presses", 1)), {}),
    "keyDown": ("keyDown", (("key", REQUIRED),), {}),
    "keyUp": ("keyUp", (("key", REQUIRED),), {}),
    "write": ("write", (("message", REQUIRED),), {}),
    "typewrite": ("write", (("message", REQUIRED),), {}),
}
_POSITIONAL_ONLY_TIMING = frozenset({"interval", "duration"})
# Split after each line break ``ast`` recognises (\r\n, \r, \n; str.splitlines knows more, e.g.
# \x0c), keeping the breaks so a multi-line statement is quoted exactly as written.
_AFTER_LINE_BREAK = re.compile(r"(?<=\n)|(?<=\r)(?!\n)")


def _expand_point(args: list[Any]) -> list[Any]:
    # pyautogui accepts a point as one (x, y) sequence in place of x, y.
    if args and isinstance(args[0], (list, tuple)) and len(args[0]) == 2:
        return [*args[0], *args[1:]]
    return args


def _translate(func: str, args: list[Any], kwargs: dict[str, Any], line: str) -> Any:
    """One pyautogui call -> list of ScaleCUA-style RawCalls, or an ActionError."""
    if func == "hotkey":
        # hotkey(*keys): the positional values bind to `keys` as one tuple (see scalecua).
        keys = [tuple(args)] if args else []
        bound = bind("hotkey", _HOTKEY, keys, kwargs, line, ignore=_IGNORED)
        return bound if isinstance(bound, ActionError) else [RawCall("hotkey", bound, line=line)]
    if func not in _CALLS:
        return ActionError("unsupported_action", f"pyautogui.{func} is not supported: {line!r}")
    name, signature, fixed = _CALLS[func]
    if signature and signature[0][0] == "x":
        args = _expand_point(args)
    bound = bind(func, signature, args, kwargs, line, ignore=_IGNORED)
    if isinstance(bound, ActionError):
        return bound
    for timing in _POSITIONAL_ONLY_TIMING:
        bound.pop(timing, None)
    bound.update(fixed)
    if name == "write" and isinstance(bound["message"], (list, tuple)):
        # typewrite(['a', 'enter']) presses each named key in turn.
        return [RawCall("press", {"keys": k, "presses": 1}, line=line) for k in bound["message"]]
    return [RawCall(name, bound, line=line)]


class StatementSource:
    """Statement text by ``ast`` position, in time linear in the code's length.

    ``ast.get_source_segment`` splits the whole source on every call, which is quadratic over a
    long block of statements; here lines are split once and each is encoded at most once
    (``col_offset`` counts UTF-8 bytes).
    """

    def __init__(self, code: str) -> None:
        self.lines = _AFTER_LINE_BREAK.split(code)
        self.encoded: dict[int, bytes] = {}

    def _line(self, number: int) -> bytes:
        if number not in self.encoded:
            self.encoded[number] = self.lines[number - 1].encode("utf-8", "surrogatepass")
        return self.encoded[number]

    def segment(self, stmt: ast.stmt) -> str:
        """The source text of ``stmt`` (its node type's name where positions are missing)."""
        first, last = stmt.lineno, stmt.end_lineno or stmt.lineno
        start, end = stmt.col_offset, stmt.end_col_offset
        if not 1 <= first <= last <= len(self.lines) or end is None:
            return type(stmt).__name__
        if first == last:
            raw = self._line(first)[start:end]
        else:
            middle = [self._line(n) for n in range(first + 1, last)]
            raw = b"".join([self._line(first)[start:], *middle, self._line(last)[:end]])
        return raw.decode("utf-8", "replace")


def statement_calls(stmt: ast.stmt, source: StatementSource) -> list[RawCall] | ActionError:
    """One pyautogui statement -> raw calls (none for imports and ``pass``), or an error."""
    line = source.segment(stmt)
    if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
        return []
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return ActionError("unsupported_action", f"not a pyautogui call: {line!r}")
    owner = call.func.value
    owner_name = owner.id if isinstance(owner, ast.Name) else None
    split = split_call(call, line)
    if isinstance(split, ActionError):
        return split
    args, kwargs = split
    if owner_name == "time" and call.func.attr == "sleep":
        secs = bind("time.sleep", (("seconds", REQUIRED),), args, kwargs, line)
        return secs if isinstance(secs, ActionError) else [RawCall("wait", secs, line=line)]
    if owner_name != "pyautogui":
        return ActionError("unsupported_action", f"not a pyautogui call: {line!r}")
    return _translate(call.func.attr, args, kwargs, line)


def parse_osworld(
    code: str, width: int, height: int, *, pixels_per_click: int = 1
) -> list[Action] | ActionError:
    """Parse OSWorld-style pyautogui code (screen pixels) into grid actions.

    Args:
        code: Python source of pyautogui calls (``import`` lines and ``time.sleep`` allowed) or one
            of the strings ``WAIT``, ``DONE``, ``FAIL``.
        width: Screen width in pixels.
        height: Screen height in pixels.
        pixels_per_click: Qwen ``pixels`` per pyautogui scroll unit; 1 keeps the number as
            written, which is how Qwen3-VL agents emit ``pyautogui.scroll(pixels)``.

    Returns:
        The actions in order, or an ``ActionError`` (``bad_syntax``, ``unsupported_action`` for
        other statements or calls, ``coordinate_out_of_range``, ``bad_key``, ...). Never raises.
    """
    if not isinstance(code, str):
        return ActionError("bad_syntax", f"code must be a string, got {type(code).__name__}")
    special = _SPECIAL.get(code.strip())
    if special is not None:
        return [special]
    body = parse_module(code)
    if isinstance(body, ActionError):
        return body
    calls: list[RawCall] = []
    source = StatementSource(code)
    for stmt in body:
        got = statement_calls(stmt, source)
        if isinstance(got, ActionError):
            return got
        calls.extend(got)
    if not calls:
        return ActionError("empty", "no pyautogui calls in the code")
    out = map_calls(calls, "ubuntu", width, height, "pixel", pixels_per_click=pixels_per_click)
    return out if isinstance(out, ActionError) else out[0]
