"""Tool calls as plain argument dicts: render, parse and mark through ``hivig.actions``.

Generators work on the JSON ``arguments`` objects (``{"action": "scroll", "pixels": -300}``), which
is what a perturbation changes; everything the critic will see is rendered and marked by the one
shared implementation in ``hivig.actions``, so a Bad sample's text and marker are exactly what
serving would produce for the same call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from hivig.actions import (
    ActionError,
    action_from_arguments,
    parse_tool_calls,
    render_tool_calls,
)

Call = dict[str, Any]

POINT_TARGETS = frozenset(
    {
        "left_click",
        "right_click",
        "middle_click",
        "double_click",
        "triple_click",
        "click",
        "long_press",
    }
)
"""Actions whose ``coordinate`` is the element acted on (``mouse_move`` only positions)."""

_BLOCK = re.compile(r"(<tool_call>\s*)(.*?)(\s*</tool_call>)", re.DOTALL | re.IGNORECASE)


class CallError(ValueError):
    """A call that the action model rejects (a generator bug, never a data problem)."""


def to_actions(calls: Sequence[Call], space: str) -> list[Any]:
    """Typed actions for argument dicts.

    Raises:
        CallError: A call is not valid in ``space``.
    """
    out = []
    for call in calls:
        action = action_from_arguments(call, space)
        if isinstance(action, ActionError):
            raise CallError(f"{call!r}: {action}")
        out.append(action)
    return out


def render_calls(calls: Sequence[Call], space: str) -> str:
    """The Qwen3-VL ``<tool_call>`` text of valid calls (one block per call, order kept)."""
    return render_tool_calls(to_actions(calls, space), space)


def render_invalid(calls: Sequence[Call], space: str, index: int, arguments: dict[str, Any]) -> str:
    """Render ``calls`` with call ``index`` replaced by raw, possibly invalid ``arguments``.

    The other calls and the wrapper keep the exact shared rendering, so the only difference a
    critic can see is the error itself.
    """
    text = render_calls(calls, space)
    blocks = list(_BLOCK.finditer(text))
    match = blocks[index]
    body = json.loads(match.group(2))
    body["arguments"] = arguments
    new_body = json.dumps(body, ensure_ascii=False)
    return text[: match.start(2)] + new_body + text[match.end(2) :]


def break_json(text: str, index: int = 0) -> str:
    """Remove the last closing brace of block ``index`` (unbalanced JSON, a real model slip)."""
    blocks = list(_BLOCK.finditer(text))
    match = blocks[index]
    body = match.group(2)
    cut = body.rstrip()
    pos = cut.rfind("}")
    broken = cut[:pos] + cut[pos + 1 :]
    return text[: match.start(2)] + broken + text[match.end(2) :]


def parse_calls(text: str) -> list[Call] | ActionError:
    """Argument dicts of a ``<tool_call>`` text (strict JSON), or the parser's typed error."""
    actions = parse_tool_calls(text)
    if isinstance(actions, ActionError):
        return actions
    return [a.to_arguments() for a in actions]


def primary_point(calls: Sequence[Call]) -> tuple[int, Call] | None:
    """The first call that acts on an element by coordinate, with its index."""
    for i, call in enumerate(calls):
        if call.get("action") in POINT_TARGETS and isinstance(call.get("coordinate"), list):
            return i, call
    return None


def names(calls: Sequence[Call]) -> list[str]:
    """Action names in order."""
    return [str(c.get("action")) for c in calls]
