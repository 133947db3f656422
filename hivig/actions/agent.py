"""Tolerant reading of what real agents emit: one front door, ``parse_agent_output``.

The strict parsers (``parse_tool_calls``, ``parse_scalecua``, ``parse_osworld``,
``parse_androidworld``) read clean training data and reject anything irregular. Live agents are
less tidy: ScaleCUA agents prefix calls with ``pyautogui.``/``mobile.`` and join key combos with
``+``; OSWorld agents wrap code in fences, put a triple-quoted thought before the call, leave
``typewrite('it's')`` unescaped; Qwen3-VL policies write free text before the call, double the
opening brace or put the JSON after the closing tag; AndroidWorld agents write ``Reason: ...
Action: {...}``. This module repairs exactly those slips and then maps the calls with the same
normaliser as the strict parsers, so the grid conversion, key validation and step folding are the
ones training data gets. What still cannot be read comes back as an ``ActionError``: the caller
then sends the text as it is (judged without a marker), it never drops the step.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Literal

from hivig.actions._calls import RawCall, parse_module
from hivig.actions._normalise import SCROLL_PIXELS_PER_CLICK, map_calls
from hivig.actions._strict_json import decode_objects, loads
from hivig.actions._tags import all_blocks, first_block
from hivig.actions.androidworld import androidworld_calls
from hivig.actions.keys import PYAUTOGUI_KEY_TABLE, is_key_name
from hivig.actions.model import (
    GRID_MAX,
    MOBILE,
    SPACES,
    Action,
    ActionError,
    ElementAction,
    Type,
    action_from_arguments,
    is_number,
    space_for_platform,
)
from hivig.actions.osworld import OSWORLD_WAIT_SECONDS, StatementSource, statement_calls
from hivig.actions.scalecua import parse_scalecua_calls

AgentFormat = Literal["auto", "qwen", "scalecua", "osworld", "androidworld", "webarena_code"]
AGENT_FORMATS: tuple[str, ...] = (
    "auto",
    "qwen",
    "scalecua",
    "osworld",
    "androidworld",
    "webarena_code",
)

CoordSpace = Literal["screen_px", "norm1000", "norm999", "norm01", "resized_px"]
COORD_SPACES: tuple[str, ...] = ("screen_px", "norm1000", "norm999", "norm01", "resized_px")

DEFAULT_COORD_SPACE: dict[str, str | None] = {
    "qwen": "norm1000",
    "osworld": "screen_px",
    "androidworld": "screen_px",
    "webarena_code": "screen_px",
    "scalecua": None,  # ScaleCUA outputs are read by their own magnitudes (scale detection)
}
"""Coordinate space each format is read in when the caller names none."""

GRID_999 = 999
"""Side of the 999-grid some Qwen3-VL agents divide by; read as pixels of a 999x999 frame."""

_FENCE = re.compile(r"```[A-Za-z0-9_+-]*[ \t]*\r?\n(.*?)```", re.DOTALL)
_MODULE_PREFIX = re.compile(r"^(?:pyautogui|mobile|computer)\.(?=[A-Za-z_]\w*\s*\()")
_SPECIAL_NAMES = {
    "WAIT": RawCall("wait", {"seconds": OSWORLD_WAIT_SECONDS}),
    "DONE": RawCall("terminate", {"status": "success", "info": None}),
    "FAIL": RawCall("terminate", {"status": "failure", "info": None}),
}
# typewrite('it's') with the inner quote left unescaped: the head of such a call, and the ends
# its text may have (the quote, optional keyword arguments, the closing parenthesis, then the
# end of the line or a ``;`` before the next statement).
_WRITE_HEAD = re.compile(r"^(?P<head>\s*(?:pyautogui\.)?(?:typewrite|write)\(\s*)(?P<q>['\"])")
_WRITE_END = {
    q: re.compile(re.escape(q) + r"(?P<tail>\s*(?:,[^()'\"]*)?\))\s*(?P<sep>;|$)") for q in "'\""
}
_STATUS_SYNONYMS = {
    "complete": "success",
    "completed": "success",
    "done": "success",
    "finished": "success",
    "succeed": "success",
    "succeeded": "success",
    "successful": "success",
    "failed": "failure",
    "infeasible": "failure",
    "incomplete": "failure",
    "error": "failure",
}


# ---------------------------------------------------------------------------------------------
# Coordinate spaces


def _frame_scale(
    coord_space: str | None, width: int, height: int, frame: tuple[int, int] | None
) -> tuple[str | None, int, int] | ActionError:
    """(normaliser scale, width, height) that reads coordinates written in ``coord_space``."""
    if coord_space is None:
        return None, width, height
    if coord_space == "screen_px":
        return "pixel", width, height
    if coord_space == "norm1000":
        return "grid", width, height
    if coord_space == "norm01":
        return "unit", width, height
    if coord_space == "norm999":
        return "pixel", GRID_999, GRID_999
    if coord_space == "resized_px":
        ok = isinstance(frame, (tuple, list)) and len(frame) == 2
        if not ok or not all(isinstance(v, int) and v > 0 for v in frame):  # type: ignore[union-attr]
            return ActionError("bad_argument", "resized_px needs the resized frame (w, h)")
        return "pixel", int(frame[0]), int(frame[1])  # type: ignore[index]
    return ActionError("bad_argument", f"coord_space must be one of {COORD_SPACES}")


def _to_grid(value: Any, scale: str | None, width: int, height: int) -> Any:
    """A Qwen ``coordinate`` pair in ``scale`` -> grid floats (validated later)."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return value
    if not all(is_number(v) for v in value) or scale in (None, "grid"):
        return value
    if scale == "unit":
        return [value[0] * GRID_MAX, value[1] * GRID_MAX]
    return [value[0] / width * GRID_MAX, value[1] / height * GRID_MAX]


# ---------------------------------------------------------------------------------------------
# Text clean-up shared by the code formats


def _unfence(text: str) -> str:
    """The contents of markdown code fences, joined; the text itself when there are none."""
    blocks = _FENCE.findall(text)
    return "\n".join(blocks) if blocks else text


def _repair_write_quotes(code: str) -> str:
    """Re-quote ``typewrite('...')`` lines whose text holds an unescaped quote of its own kind."""
    out = []
    for line in code.splitlines():
        if isinstance(parse_module(line), ActionError):
            line = _repair_write_line(line) or line
        out.append(line)
    return "\n".join(out)


def _repair_write_line(line: str) -> str | None:
    """``line`` with its leading ``typewrite`` re-quoted, or ``None`` when that cannot be done.

    The text is cut at the first end that gives a statement of its own (shortest first), so a
    following ``; pyautogui.press('enter')`` stays a statement and never becomes typed text; the
    rest of the line is repaired the same way. Text that still holds ``pyautogui.`` is code, not
    a slip: the line is left unreadable.
    """
    head = _WRITE_HEAD.match(line)
    if head is None:
        return None
    for end in _WRITE_END[head["q"]].finditer(line, head.end()):
        text = line[head.end() : end.start()]
        if "pyautogui." in text:
            return None
        stmt = f"{head['head']}{text!r}{end['tail']}"
        if isinstance(parse_module(stmt), ActionError):
            continue
        rest = line[end.end() :].strip()
        if not rest:
            return stmt
        if isinstance(parse_module(rest), ActionError):
            rest = _repair_write_line(rest)  # type: ignore[assignment]
            if rest is None:
                continue
        return f"{stmt}; {rest}"
    return None


# ---------------------------------------------------------------------------------------------
# OSWorld pyautogui code


def _osworld_statement(stmt: ast.stmt, source: StatementSource) -> list[RawCall] | ActionError:
    value = stmt.value if isinstance(stmt, ast.Expr) else None
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return []  # a thought block written as a bare string before the call
    if isinstance(value, ast.Name) and value.id in _SPECIAL_NAMES:
        return [_SPECIAL_NAMES[value.id]]
    func = value.func if isinstance(value, ast.Call) else None
    owner = func.value if isinstance(func, ast.Attribute) else None
    if isinstance(owner, ast.Name) and owner.id == "pyautogui" and func.attr == "sleep":  # type: ignore[union-attr]
        owner.id = "time"  # pyautogui.sleep is time.sleep
    return statement_calls(stmt, source)


def osworld_calls(text: str) -> list[RawCall] | ActionError:
    """Raw calls of OSWorld-style pyautogui code (fences, imports, ``WAIT``/``DONE``/``FAIL``)."""
    code = _unfence(text).strip()
    special = _SPECIAL_NAMES.get(code)
    if special is not None:
        return [special]
    body = parse_module(code)
    if isinstance(body, ActionError):
        code = _repair_write_quotes(code)
        body = parse_module(code)
        if isinstance(body, ActionError):
            return body
    source = StatementSource(code)
    calls: list[RawCall] = []
    for stmt in body:
        got = _osworld_statement(stmt, source)
        if isinstance(got, ActionError):
            return got
        calls.extend(got)
    if not calls:
        return ActionError("empty", "no pyautogui calls in the code")
    return calls


# ---------------------------------------------------------------------------------------------
# ScaleCUA calls


def _scalecua_lines(text: str) -> str:
    tagged = first_block(text, "action")
    body = _unfence(text if tagged is None else tagged)
    lines = []
    for raw in body.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or line.startswith(("import ", "from ")):
            continue
        lines.append(_MODULE_PREFIX.sub("", line))
    return "\n".join(lines)


def _combo_parts(keys: str) -> list[str] | None:
    """``"ctrl+s"`` -> ``["ctrl", "s"]``; ``"ctrl++"`` (the plus key) -> ``["ctrl", "+"]``."""
    if keys.endswith("++"):
        head = keys[:-2]
        return [*head.split("+"), "+"] if head else None
    return keys.split("+")


def _split_combo(call: RawCall) -> RawCall:
    """A ``+``-joined combo in one argument -> ``hotkey(keys=["ctrl", "s"])``.

    Covers ``key("ctrl+s")``, ``press(keys="ctrl+s")``, ``press(keys="ctrl++")`` (a combo whose
    key is ``+``), ``hotkey("ctrl+s")`` and the keys given as one list, ``hotkey(['cmd', 'a'])``.
    """
    keys = call.kwargs.get("keys")
    if call.name == "hotkey" and isinstance(keys, (list, tuple)) and len(keys) == 1:
        keys = keys[0]  # one positional combo or list: the same slip as key("ctrl+s")
        if isinstance(keys, (list, tuple)):
            return RawCall("hotkey", {"keys": tuple(keys)}, alias=call.alias, line=call.line)
    if call.name not in ("press", "hotkey") or not isinstance(keys, str) or len(keys) < 2:
        return call
    if "+" not in keys or call.kwargs.get("presses", 1) != 1:
        return call
    parts = _combo_parts(keys)
    if parts is None or len(parts) < 2:
        return call
    parts = [p if p == "+" else p.strip() for p in parts]
    if not all(parts) or not all(is_key_name(p) for p in parts):
        return call  # prose with a plus sign stays what it is: a bad key
    return RawCall("hotkey", {"keys": parts}, alias=call.alias, line=call.line)


def _settle_keys(calls: list[RawCall]) -> list[RawCall]:
    """Give a step's lone ``keyDown``/``keyUp`` a form the critic can be shown.

    pyautogui's ``keyDown('shift')`` holds a key and ``keyUp('shift')`` releases it, often in
    separate steps. Qwen3-VL's action space has no hold or release, so: a key still held when the
    step ends is released there (``keyDown('shift')`` alone, or ``keyDown('ctrl')`` then
    ``press('c')``, is shown as the ``key`` action of what was pressed: ``["shift"]``,
    ``["ctrl", "c"]``), and a ``keyUp`` of a key this step did not hold is shown as a ``key``
    action of that key. A key held across a pointer call (a shift-click) has no such form and
    stays unreadable: it is judged as the text it is. The strict parsers of training data keep
    rejecting lone key events; only live output is read this way.
    """
    held: list[str] = []
    out: list[RawCall] = []
    for call in calls:
        key = call.kwargs.get("key")
        if call.name == "keyDown" and isinstance(key, str):
            held.append(key)
        elif call.name == "keyUp" and isinstance(key, str):
            if key not in held:
                out.append(RawCall("press", {"keys": key, "presses": 1}, line=call.line))
                continue
            held.remove(key)
        out.append(call)
    out.extend(RawCall("keyUp", {"key": k}, line=f"keyUp({k!r})") for k in reversed(held))
    return out


# A status the agent wrote as one word, or as the label that opens a sentence ("Done. ...",
# "Failed: ..."): the word decides. Anything else in a sentence is never guessed at, since words
# like "not found" or "cannot" appear in reports of finished tasks too.
_STATUS_WORDS = {
    **_STATUS_SYNONYMS,
    "success": "success",
    "successfully": "success",
    "failure": "failure",
    "fail": "fail",  # kept as written: the normaliser maps it and counts it
    "impossible": "failure",
}
# The leading word counts only when punctuation sets it off as a label, so an imperative such as
# "Complete the form first" is not read as a status.
_LEADING_STATUS = re.compile(r"\s*([A-Za-z]+)\s*[.,:;!\-\u2013\u2014(]")
_TRAILING_PUNCT = ".!?;:, \t\r\n"
NEUTRAL_STATUS = "success"
"""Status of a ``terminate`` whose text names none: ScaleCUA's default, and AndroidLab ends the
task the same way whatever the status says (every ``terminate`` is its ``finish``)."""


def _status_of(text: str) -> str | None:
    """The status a one-word status or a sentence's leading label names, else ``None``."""
    word = text.strip().rstrip(_TRAILING_PUNCT).strip().lower()
    if word in _STATUS_WORDS:
        return _STATUS_WORDS[word]
    lead = _LEADING_STATUS.match(text)
    return _STATUS_WORDS.get(lead.group(1).lower()) if lead else None


def _terminate_status(call: RawCall) -> RawCall:
    """A ``terminate`` whose status is a synonym or free text -> success/failure, text kept.

    A one-word status is read whatever its case and trailing punctuation (``Success``,
    ``FAILURE``, ``Completed.``), synonyms included (``infeasible`` is a failure). A sentence
    sets the status only through a leading status word set off by punctuation (``Done. The
    file ...``, ``Failed: ...``); any other sentence gets ``NEUTRAL_STATUS``, the text kept as
    the terminate's ``info``. Another single word (``maybe``) stays a ``bad_argument``.
    """
    status = call.kwargs.get("status")
    if call.name != "terminate" or not isinstance(status, str):
        return call
    text = status.strip()
    mapped = _status_of(text)
    if mapped is None and not re.search(r"\s", text):
        return call  # an unknown word: the normaliser reports it
    kwargs = {**call.kwargs, "status": mapped or NEUTRAL_STATUS}
    if mapped is None or re.search(r"\s", text):
        info = call.kwargs.get("info")
        kept = info.strip() if isinstance(info, str) else ""
        kwargs["info"] = f"{text} {kept}" if kept else text
    return RawCall(call.name, kwargs, alias=call.alias, line=call.line)


def repair_calls(calls: list[RawCall]) -> list[RawCall]:
    """The key and status repairs of model text read by a tolerant harness parser (ScaleCUA)."""
    return _settle_keys([_terminate_status(_split_combo(c)) for c in calls])


# AndroidLab's agents write ``enter()`` for the Enter key (its executor's "Enter" action).
_ENTER_CALL = re.compile(r"^enter\(\s*\)$")


def scalecua_calls(text: str) -> list[RawCall] | ActionError:
    """Raw calls of ScaleCUA-style action text, read as tolerantly as its harness reads it."""
    lines = [
        "press(keys='enter')" if _ENTER_CALL.match(line) else line
        for line in _scalecua_lines(text).splitlines()
    ]
    calls = parse_scalecua_calls("\n".join(lines))
    if isinstance(calls, ActionError):
        return calls
    return repair_calls(calls)


# ---------------------------------------------------------------------------------------------
# Qwen3-VL tool calls


def _tool_objects(text: str) -> list[Any]:
    """Tool-call objects: decoded inside the ``<tool_call>`` blocks when there are any.

    Free text around tagged blocks (a thought that quotes an ``{"action": ...}`` schema or an
    earlier step) is never read as a call; only when the blocks hold nothing is the text after
    the last tag scanned (a call written after its empty block). Without tags, any JSON object
    with ``arguments`` or ``action`` in the text counts.
    """
    bodies, _ = all_blocks(text, "tool_call")
    found = [obj for body in bodies for obj in _block_objects(body)]
    if found:
        return found
    low = text.lower()
    open_at, close_at = low.rfind("<tool_call>"), low.rfind("</tool_call>")
    if open_at >= 0:
        cut = max(open_at + len("<tool_call>"), close_at + len("</tool_call>"))
        text = text[cut:]
    return _loose_objects(text)


def _block_objects(body: str) -> list[Any]:
    """The call(s) in one ``<tool_call>`` block.

    Strict JSON first, then with a doubled opening brace dropped, then objects embedded in the
    block's own text.
    """
    body = body.strip()
    if not body:
        return []
    decoded = loads(body, "tool call")
    if isinstance(decoded, ActionError) and body.startswith("{{"):
        decoded = loads(body[1:], "tool call")
    if not isinstance(decoded, ActionError):
        return [decoded]
    return _loose_objects(body)


def _loose_objects(text: str) -> list[Any]:
    return [o for o in decode_objects(text) if "arguments" in o or "action" in o]


def _qwen_action(obj: Any, space: str, scale: str | None, w: int, h: int) -> Action | ActionError:
    if not isinstance(obj, dict):
        return ActionError("bad_syntax", "tool call must be an object")
    if "arguments" in obj:
        name, arguments = obj.get("name"), obj["arguments"]
        if name in SPACES:
            space = name
        if isinstance(arguments, str):
            arguments = loads(arguments, "tool call arguments")
            if isinstance(arguments, ActionError):
                return arguments
    else:
        arguments = obj  # a bare arguments object, {"action": ...}
    if not isinstance(arguments, dict):
        return ActionError("bad_syntax", "tool call arguments must be an object")
    args = dict(arguments)
    for key in ("coordinate", "coordinate2"):
        if key in args:
            args[key] = _to_grid(args[key], scale, w, h)
    return action_from_arguments(args, space=space)


def _parse_qwen(text: str, space: str, scale: str | None, w: int, h: int) -> Any:
    objects = _tool_objects(text)
    if not objects:
        return ActionError("no_tool_call", "no tool call in the response")
    actions: list[Action] = []
    for obj in objects:
        action = _qwen_action(obj, space, scale, w, h)
        if isinstance(action, ActionError):
            return action
        actions.append(action)
    return actions


# ---------------------------------------------------------------------------------------------
# AndroidWorld JSON actions


_ACTION_LABEL = re.compile(r"action\s*:", re.IGNORECASE)
DICT_MAX_CHARS = 4096
"""Longest Python-dict action text evaluated. An M3A/T3A action is one short dict (a few
hundred characters; a long ``input_text`` stays well within this): a longer one is judged as
written, and ``literal_eval`` never spends seconds on a hostile megabyte."""
DICT_TRIES = 8
"""Closing braces tried from the end of that text (prose after the dict may hold a few)."""
PY_REPR_MAX_CHARS = 16384
"""Longest WebArenaLiteV2 code list read as a Python repr (its JSON text has no limit): a step's
code is a few short items, and ``literal_eval`` is slow on huge literals."""
_ELEMENT_KINDS = ("click", "double_tap", "long_press", "input_text")


def _python_dict(text: str) -> dict[str, Any] | None:
    """The Python-literal dict after the last ``Action:`` (how M3A/T3A write their action).

    Upstream reads it with ``ast.literal_eval``; so does this, on the text from the first ``{``
    after the label to each of the last few ``}`` (trailing prose does not matter). The work is
    bounded whatever the text: at most ``DICT_MAX_CHARS`` are evaluated, ``DICT_TRIES`` times.
    """
    labels = list(_ACTION_LABEL.finditer(text))
    start = text.find("{", labels[-1].end() if labels else 0)
    if start < 0:
        return None
    end = min(len(text), start + DICT_MAX_CHARS)
    for _ in range(DICT_TRIES):
        end = text.rfind("}", start, end)
        if end < 0:
            return None
        try:
            obj = ast.literal_eval(text[start : end + 1])
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            continue
        return obj if isinstance(obj, dict) and "action_type" in obj else None
    return None


def androidworld_object(action: Any) -> dict[str, Any] | ActionError:
    """The AndroidWorld action object in ``action`` (a dict, JSON, or a Python dict literal)."""
    obj = action
    if isinstance(action, str):
        obj = loads(action.strip(), "action")
        if isinstance(obj, ActionError):
            found = [o for o in decode_objects(action) if "action_type" in o]
            obj = found[0] if found else _python_dict(action)
            if obj is None:
                return ActionError("bad_syntax", "no AndroidWorld action object in the text")
    if not isinstance(obj, dict):
        return ActionError("bad_syntax", "an AndroidWorld action must be a JSON object")
    # JSONAction dataclasses serialise every field, unset ones as null.
    return {k: v for k, v in obj.items() if v is not None}


def _element_actions(obj: dict[str, Any]) -> list[Action] | ActionError | None:
    """An index action without a point -> ``ElementAction`` (plus the typing); else ``None``.

    ``input_text`` with an index taps the element, then types, as AndroidWorld executes it.
    """
    kind, index = obj.get("action_type"), obj.get("index")
    if kind not in _ELEMENT_KINDS or index is None or obj.get("x") is not None:
        return None
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        return ActionError("bad_argument", f"index must be an integer >= 0, got {index!r}")
    if kind != "input_text":
        return [ElementAction(kind, index)]
    text = obj.get("text")
    if not isinstance(text, str):
        return ActionError("bad_argument", f"input_text needs a text string, got {text!r}")
    return [ElementAction("click", index), Type(text)]


def _parse_androidworld(action: Any, platform: str, scale: str | None, w: int, h: int) -> Any:
    obj = androidworld_object(action)
    if isinstance(obj, ActionError):
        return obj
    if space_for_platform(platform) == MOBILE:
        by_index = _element_actions(obj)
        if by_index is not None:
            return by_index
    calls = androidworld_calls(obj)
    if isinstance(calls, ActionError):
        return calls
    out = map_calls(calls, platform, w, h, scale)
    return out if isinstance(out, ActionError) else out[0]


# ---------------------------------------------------------------------------------------------
# WebArenaLiteV2 executed code: [{"name": ..., "parameters": {...}}, ...] in screen pixels

_WEBARENA_NAMES = {
    "click": "click",
    "doubleClick": "doubleClick",
    "rightClick": "rightClick",
    "moveTo": "moveTo",
    "dragTo": "dragTo",
    "write": "write",
    "wait": "wait",
    "response": "response",
    "terminate": "terminate",
    "callUser": "call_user",
    # Only the lower-case spellings have a handler; ``keyDown`` runs nothing there.
    "keydown": "keyDown",
    "keyup": "keyUp",
}
# Parameters each executed action reads (the environment's defaults where it has one).
_WEBARENA_PARAMS: dict[str, dict[str, Any]] = {
    "click": {"x": None, "y": None, "clicks": 1, "button": "left"},
    "doubleClick": {"x": None, "y": None, "button": "left"},
    "rightClick": {"x": None, "y": None},
    "moveTo": {"x": None, "y": None},
    "dragTo": {"x": None, "y": None, "button": "left"},
    "write": {"message": ""},
    "wait": {"seconds": 3},
    "response": {"answer": ""},
    "terminate": {"status": "success", "info": None},
    "call_user": {},
    "keyDown": {"key": None},
    "keyUp": {"key": None},
}


def _webarena_items(output: Any) -> list[Any] | ActionError:
    items = output
    if isinstance(output, str):
        items = loads(output.strip(), "code")
        if isinstance(items, ActionError):
            if len(output) > PY_REPR_MAX_CHARS:
                return items
            try:
                items = ast.literal_eval(output.strip())  # a Python repr of the list
            except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
                return items  # type: ignore[return-value]
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, (list, tuple)) or not items:
        return ActionError("bad_syntax", "code must be a non-empty list of {name, parameters}")
    return list(items)


def _webarena_swipe(params: dict[str, Any], line: str, w: int, h: int) -> list[RawCall]:
    """``swipe`` turns the mouse wheel: at ``from_coord`` by ``from - to``, else by direction."""
    start, end = params.get("from_coord"), params.get("to_coord")
    pair = [start, end]
    if all(isinstance(p, (list, tuple)) and len(p) == 2 and all(map(is_number, p)) for p in pair):
        dx, dy = start[0] - end[0], start[1] - end[1]  # type: ignore[index]
        vertical = abs(dy) >= abs(dx)
        delta, side = (dy, h) if vertical else (dx, w)
        names = ("up", "down") if vertical else ("left", "right")
        swipe = {"direction": names[0] if delta >= 0 else names[1]}
        swipe["amount"] = min(1.0, abs(delta) / side)  # type: ignore[assignment]
        move = RawCall("moveTo", {"x": start[0], "y": start[1]}, line=line)  # type: ignore[index]
        return [move, RawCall("swipe", {"from_coord": None, "to_coord": None, **swipe}, line=line)]
    kwargs = {
        "from_coord": None,
        "to_coord": None,
        "direction": params.get("direction", "up"),
        "amount": params.get("amount", 0.5),
    }
    return [RawCall("swipe", kwargs, line=line)]


def _skipped_key(keys: list[Any]) -> Any:
    """The first key the environment would skip (not a name of its table), else ``None``."""
    return next((k for k in keys if not isinstance(k, str) or k not in PYAUTOGUI_KEY_TABLE), None)


def _webarena_keys(written: str, params: dict[str, Any], line: str) -> list[RawCall] | ActionError:
    """``hotkey``/``press`` read as the browser environment executes them.

    The environment presses a key only when its name is in pyautogui's key table exactly as
    written, and silently skips any other: a ``+``-joined combo (``"ctrl+s"``, ``"ctrl++"``), a
    list nested in ``args``, an alias (``cmd``), a capital letter. This is executed code, so no
    repair may stand in for what does not run: such a key is a ``bad_key`` and the step is judged
    as written. ``hotkey`` holds its ``args`` down in order; ``press`` with a list presses each
    key in turn (``presses`` times each), never as a combination.
    """
    keys = params.get("args") if written == "hotkey" else params.get("keys")
    seq = keys if isinstance(keys, list) else [keys]
    if not seq:
        return ActionError("bad_argument", f"{written} without keys runs nothing: {line}")
    skipped = _skipped_key(seq)
    if skipped is not None:
        return ActionError("bad_key", f"the environment skips key {skipped!r}: {line}")
    if written == "hotkey":
        return [RawCall("hotkey", {"keys": tuple(seq)}, line=line)]
    presses = params.get("presses", 1)
    return [RawCall("press", {"keys": k, "presses": presses}, line=line) for k in seq]


def _webarena_call(item: Any, w: int, h: int) -> list[RawCall] | ActionError:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return ActionError("bad_syntax", f"each code item needs a name: {item!r}")
    written, params = item["name"], item.get("parameters") or {}
    line = json.dumps(item, ensure_ascii=False, default=str)
    if not isinstance(params, dict):
        return ActionError("bad_argument", f"parameters must be an object: {line}")
    if written == "swipe":
        return _webarena_swipe(params, line, w, h)
    if written in ("hotkey", "press"):
        return _webarena_keys(written, params, line)
    name = _WEBARENA_NAMES.get(written)
    if name is None:
        return ActionError("unsupported_action", f"unknown code action {written!r}: {line}")
    defaults = _WEBARENA_PARAMS[name]
    kwargs = {key: params.get(key, default) for key, default in defaults.items()}
    return [RawCall(name, kwargs, line=line)]


def _webarena_calls(output: Any, w: int, h: int) -> list[RawCall] | ActionError:
    items = _webarena_items(output)
    if isinstance(items, ActionError):
        return items
    calls: list[RawCall] = []
    for item in items:
        got = _webarena_call(item, w, h)
        if isinstance(got, ActionError):
            return got
        calls.extend(got)
    # Executed code: no key repair (see ``_webarena_keys``); a terminate's status is read, as
    # the environment ends the task on any status.
    return [_terminate_status(c) for c in calls]


# ---------------------------------------------------------------------------------------------
# The front door


# An AndroidWorld action as text: a bare object, or the object after an M3A/T3A ``Action:``
# label (optionally fenced). ``action_type`` alone is not enough: typed text or a message may
# hold the word (``typewrite('set action_type to 3')``).
_LABELLED_OBJECT = re.compile(r"\baction\s*:\s*(?:```[A-Za-z]*\s*)?\{", re.IGNORECASE)


def is_androidworld_text(text: str) -> bool:
    """Whether ``text`` reads as an AndroidWorld action.

    That is an object with ``action_type`` that opens the text or follows an ``Action:`` label.

    Args:
        text: Agent output text.

    Returns:
        True for ``{"action_type": ...}`` and ``Reason: ... Action: {'action_type': ...}``.
    """
    if "action_type" not in text.lower():
        return False
    return text.lstrip().startswith("{") or _LABELLED_OBJECT.search(text) is not None


def detect_format(output: str | dict[str, Any] | list[Any]) -> str:
    """Guess which agent style produced ``output``.

    Args:
        output: Agent output text, a decoded AndroidWorld/tool-call object, or a WebArenaLiteV2
            code list.

    Returns:
        ``qwen``, ``androidworld``, ``webarena_code``, ``scalecua`` or ``osworld``;
        ``scalecua`` when nothing more specific is seen.
    """
    if isinstance(output, (list, tuple)):
        return "webarena_code"
    if isinstance(output, dict):
        if "action_type" in output:
            return "androidworld"
        return "webarena_code" if "parameters" in output else "qwen"
    if not isinstance(output, str):
        return "scalecua"
    low = output.lower()
    head = low.lstrip()[:1]
    if head in ("[", "{") and '"parameters"' in low and '"name"' in low:
        return "webarena_code"
    if "<tool_call>" in low or '"arguments"' in low:
        return "qwen"
    if is_androidworld_text(output):
        return "androidworld"
    if "<action>" in low or "mobile." in low:
        return "scalecua"
    if "pyautogui." in low or "import " in low or output.strip() in _SPECIAL_NAMES:
        return "osworld"
    return "scalecua"


def parse_agent_output(
    output: str | dict[str, Any] | list[Any],
    fmt: str = "auto",
    *,
    platform: str = "ubuntu",
    width: int,
    height: int,
    coord_space: str | None = None,
    frame: tuple[int, int] | None = None,
) -> list[Action] | ActionError:
    """Read one step of a live agent's output into grid actions, repairing the common slips.

    Args:
        output: The agent's action text (tool-call response, ScaleCUA or AndroidLab calls,
            pyautogui code, ``WAIT``/``DONE``/``FAIL``, an AndroidWorld ``Action: {...}`` answer
            in JSON or Python-dict style), an AndroidWorld action object, or the
            WebArenaLiteV2 ``code`` list that will execute (``[{"name", "parameters"}]``, as a
            list or its JSON text).
        fmt: ``qwen``, ``scalecua``, ``osworld``, ``androidworld``, ``webarena_code`` or
            ``auto`` (see ``detect_format``).
        platform: ``windows``, ``mac``, ``ubuntu``, ``web`` or ``android``; picks
            ``computer_use`` or ``mobile_use``.
        width: Screen width in pixels.
        height: Screen height in pixels.
        coord_space: How the output writes coordinates: ``screen_px``, ``norm1000``,
            ``norm999``, ``norm01`` or ``resized_px``; ``None`` takes the format's default
            (``DEFAULT_COORD_SPACE``).
        frame: ``(w, h)`` of the resized image the policy saw, for ``resized_px``.

    Returns:
        The step's actions in order, or an ``ActionError`` for text that stays unreadable after
        the repairs (the caller then sends it as raw text). Never raises.

    AndroidWorld index actions (``{'action_type': 'click', 'index': 3}``) have no point: they
    come back as ``ElementAction`` (no Qwen3-VL rendering until ``ElementAction.at`` gives it the
    element's centre), never with invented coordinates. Key and status repairs are described
    at ``_split_combo``, ``_settle_keys`` and ``_terminate_status``; the key repairs apply to
    model text only (``scalecua``), never to executed code (``osworld``, ``webarena_code``),
    whose keys are read as its executor presses them (see ``_webarena_keys``).

    A pyautogui-style wheel scroll (``scroll(-5)`` in OSWorld code, ``scroll(clicks=-5)`` from
    ScaleCUA) counts wheel clicks in every format: ``SCROLL_PIXELS_PER_CLICK`` (100) Qwen
    ``scroll`` pixels per click.
    """
    if fmt not in AGENT_FORMATS:
        return ActionError("bad_argument", f"format must be one of {AGENT_FORMATS}, got {fmt!r}")
    if fmt == "auto":
        fmt = detect_format(output)
    structured = {"androidworld": (dict,), "webarena_code": (dict, list, tuple)}.get(fmt, ())
    if not isinstance(output, (str, *structured)):
        return ActionError("bad_syntax", f"{fmt} output must be text, got {type(output).__name__}")
    try:
        space = space_for_platform(platform)
    except ActionError as exc:
        return exc
    if isinstance(output, str) and not output.strip():
        return ActionError("empty", "empty agent output")
    scaled = _frame_scale(
        coord_space if coord_space is not None else DEFAULT_COORD_SPACE[fmt], width, height, frame
    )
    if isinstance(scaled, ActionError):
        return scaled
    scale, w, h = scaled
    if fmt == "qwen":
        return _parse_qwen(output, space, scale, w, h)  # type: ignore[arg-type]
    if fmt == "androidworld":
        return _parse_androidworld(output, platform, scale, w, h)
    # One wheel rule for every pyautogui-style format: ``scroll(-5)`` in OSWorld code and
    # ``scroll(clicks=-5)`` from a ScaleCUA agent are the same five wheel clicks, 100 pixels
    # each on the Qwen ``scroll`` scale (the training data's and the reference's magnitude).
    pixels_per_click = SCROLL_PIXELS_PER_CLICK
    if fmt == "osworld":
        # Executed code: keys are read as pyautogui presses them, with no repair. It treats
        # "ctrl+s" as an unknown key (nothing happens), raises on hotkey(['ctrl', 'a']) and
        # keeps a lone keyDown held; those stay errors and are judged as written.
        calls = osworld_calls(output)  # type: ignore[arg-type]
    elif fmt == "scalecua":
        calls = scalecua_calls(output)  # type: ignore[arg-type]
    else:
        calls = _webarena_calls(output, w, h)
    if isinstance(calls, ActionError):
        return calls
    if space == MOBILE and fmt in ("osworld", "webarena_code"):
        return ActionError("unsupported_action", f"{fmt} code has no mobile_use form")
    out = map_calls(calls, platform, w, h, scale, pixels_per_click=pixels_per_click)
    return out if isinstance(out, ActionError) else out[0]
