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
import re
from typing import Any, Literal

from hivig.actions._calls import RawCall, parse_module
from hivig.actions._normalise import SCROLL_PIXELS_PER_CLICK, map_calls
from hivig.actions._strict_json import decode_objects, loads
from hivig.actions._tags import all_blocks, first_block
from hivig.actions.androidworld import _translate as _androidworld_calls
from hivig.actions.keys import is_key_name
from hivig.actions.model import (
    GRID_MAX,
    MOBILE,
    SPACES,
    Action,
    ActionError,
    action_from_arguments,
    is_number,
    space_for_platform,
)
from hivig.actions.osworld import OSWORLD_WAIT_SECONDS, _Source, _statement_calls
from hivig.actions.scalecua import parse_scalecua_calls

AgentFormat = Literal["auto", "qwen", "scalecua", "osworld", "androidworld"]
AGENT_FORMATS: tuple[str, ...] = ("auto", "qwen", "scalecua", "osworld", "androidworld")

CoordSpace = Literal["screen_px", "norm1000", "norm999", "norm01", "resized_px"]
COORD_SPACES: tuple[str, ...] = ("screen_px", "norm1000", "norm999", "norm01", "resized_px")

DEFAULT_COORD_SPACE: dict[str, str | None] = {
    "qwen": "norm1000",
    "osworld": "screen_px",
    "androidworld": "screen_px",
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


def _osworld_statement(stmt: ast.stmt, source: _Source) -> list[RawCall] | ActionError:
    value = stmt.value if isinstance(stmt, ast.Expr) else None
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return []  # a thought block written as a bare string before the call
    if isinstance(value, ast.Name) and value.id in _SPECIAL_NAMES:
        return [_SPECIAL_NAMES[value.id]]
    func = value.func if isinstance(value, ast.Call) else None
    owner = func.value if isinstance(func, ast.Attribute) else None
    if isinstance(owner, ast.Name) and owner.id == "pyautogui" and func.attr == "sleep":  # type: ignore[union-attr]
        owner.id = "time"  # pyautogui.sleep is time.sleep
    return _statement_calls(stmt, source)


def _osworld_calls(text: str) -> list[RawCall] | ActionError:
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
    source = _Source(code)
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


def _split_combo(call: RawCall) -> RawCall:
    """A ``+``-joined combo in one argument -> ``hotkey(keys=["ctrl", "s"])``.

    Covers ``key("ctrl+s")``, ``press(keys="ctrl+s")`` and ``hotkey("ctrl+s")``.
    """
    keys = call.kwargs.get("keys")
    if call.name == "hotkey" and isinstance(keys, (list, tuple)) and len(keys) == 1:
        keys = keys[0]  # one positional combo: the same slip as key("ctrl+s")
    if call.name not in ("press", "hotkey") or not isinstance(keys, str) or len(keys) < 2:
        return call
    if "+" not in keys or call.kwargs.get("presses", 1) != 1:
        return call
    parts = [p.strip() for p in keys.split("+")]
    if not all(parts) or not all(is_key_name(p) for p in parts):
        return call  # prose with a plus sign stays what it is: a bad key
    return RawCall("hotkey", {"keys": parts}, alias=call.alias, line=call.line)


def _terminate_status(call: RawCall) -> RawCall:
    status = call.kwargs.get("status")
    if call.name != "terminate" or not isinstance(status, str):
        return call
    mapped = _STATUS_SYNONYMS.get(status.strip().lower())
    if mapped is None:
        return call
    return RawCall(call.name, {**call.kwargs, "status": mapped}, alias=call.alias, line=call.line)


def _scalecua_calls(text: str) -> list[RawCall] | ActionError:
    calls = parse_scalecua_calls(_scalecua_lines(text))
    if isinstance(calls, ActionError):
        return calls
    return [_terminate_status(_split_combo(c)) for c in calls]


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


def _androidworld_calls_of(action: Any) -> list[RawCall] | ActionError:
    obj = action
    if isinstance(action, str):
        obj = loads(action.strip(), "action")
        if isinstance(obj, ActionError):
            found = [o for o in decode_objects(action) if "action_type" in o]
            if not found:
                return obj
            obj = found[0]
    if not isinstance(obj, dict):
        return ActionError("bad_syntax", "an AndroidWorld action must be a JSON object")
    # JSONAction dataclasses serialise every field, unset ones as null.
    return _androidworld_calls({k: v for k, v in obj.items() if v is not None})


# ---------------------------------------------------------------------------------------------
# The front door


def detect_format(output: str | dict[str, Any]) -> str:
    """Guess which agent style produced ``output``.

    Args:
        output: Agent output text, or a decoded AndroidWorld/tool-call object.

    Returns:
        ``qwen``, ``androidworld``, ``scalecua`` or ``osworld``; ``scalecua`` when nothing more
        specific is seen.
    """
    if isinstance(output, dict):
        return "androidworld" if "action_type" in output else "qwen"
    if not isinstance(output, str):
        return "scalecua"
    low = output.lower()
    if "<tool_call>" in low or '"arguments"' in low:
        return "qwen"
    if "action_type" in low:
        return "androidworld"
    if "<action>" in low or "mobile." in low:
        return "scalecua"
    if "pyautogui." in low or "import " in low or output.strip() in _SPECIAL_NAMES:
        return "osworld"
    return "scalecua"


def parse_agent_output(
    output: str | dict[str, Any],
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
        output: The agent's action text (tool-call response, ScaleCUA calls, pyautogui code,
            ``WAIT``/``DONE``/``FAIL``) or an AndroidWorld action object.
        fmt: ``qwen``, ``scalecua``, ``osworld``, ``androidworld`` or ``auto`` (see
            ``detect_format``).
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

    A pyautogui-style wheel scroll (``scroll(-5)`` in OSWorld code, ``scroll(clicks=-5)`` from
    ScaleCUA) counts wheel clicks in every format: ``SCROLL_PIXELS_PER_CLICK`` (100) Qwen
    ``scroll`` pixels per click.
    """
    if fmt not in AGENT_FORMATS:
        return ActionError("bad_argument", f"format must be one of {AGENT_FORMATS}, got {fmt!r}")
    if fmt == "auto":
        fmt = detect_format(output)
    if not isinstance(output, (str, dict)) or (isinstance(output, dict) and fmt != "androidworld"):
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
    # One wheel rule for every pyautogui-style format: ``scroll(-5)`` in OSWorld code and
    # ``scroll(clicks=-5)`` from a ScaleCUA agent are the same five wheel clicks, 100 pixels
    # each on the Qwen ``scroll`` scale (the training data's and the reference's magnitude).
    pixels_per_click = SCROLL_PIXELS_PER_CLICK
    if fmt == "osworld":
        calls = _osworld_calls(output)  # type: ignore[arg-type]
    elif fmt == "scalecua":
        calls = _scalecua_calls(output)  # type: ignore[arg-type]
    else:
        calls = _androidworld_calls_of(output)
    if isinstance(calls, ActionError):
        return calls
    if space == MOBILE and fmt == "osworld":
        return ActionError("unsupported_action", "pyautogui code has no mobile_use form")
    out = map_calls(calls, platform, w, h, scale, pixels_per_click=pixels_per_click)
    return out if isinstance(out, ActionError) else out[0]
