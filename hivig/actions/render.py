"""Actions -> Qwen3-VL tool-call text, and actions -> screenshot marks.

Rendering is the single place that writes ``<tool_call>`` blocks, so training targets, prompts and
serving show identical text: one block per call, compact JSON with ``ensure_ascii=False`` (typed
text stays UTF-8), order kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from hivig.actions.model import (
    POINT_ACTIONS,
    Action,
    ActionError,
    LeftClickDrag,
    LongPress,
    MouseMove,
    Swipe,
    in_space,
)
from hivig.media import ArrowMark, Mark, PointMark


def tool_call(action: Action, space: str) -> dict[str, Any]:
    """The ``{"name": space, "arguments": {...}}`` object of one call.

    Args:
        action: The action.
        space: ``"computer_use"`` or ``"mobile_use"``.

    Returns:
        The tool-call object.

    Raises:
        ActionError: ``unsupported_action`` when the action has no form in ``space`` (e.g. a
            ``Swipe`` in ``computer_use``, or ``CallUser`` anywhere).
    """
    if not in_space(action, space):
        raise ActionError("unsupported_action", f"{action.action} has no {space} form")
    return {"name": space, "arguments": action.to_arguments()}


def action_to_json(action: Action, space: str) -> str:
    """One tool call as a JSON string (UTF-8 text, no unicode escapes).

    Raises:
        ActionError: As ``tool_call``.
    """
    return json.dumps(tool_call(action, space), ensure_ascii=False)


def render_tool_calls(actions: Iterable[Action], space: str) -> str:
    """Render actions as Qwen3-VL ``<tool_call>`` blocks joined by newlines.

    Args:
        actions: The step's actions in order.
        space: ``"computer_use"`` or ``"mobile_use"``.

    Returns:
        One ``<tool_call>`` block per action (JSON on its own line), joined by newlines.

    Raises:
        ActionError: ``unsupported_action`` for an action outside ``space``; callers validate
            with ``in_space`` first when the input is untrusted.
    """
    return "\n".join(f"<tool_call>\n{action_to_json(a, space)}\n</tool_call>" for a in actions)


def marks_for_actions(actions: Iterable[Action]) -> list[Mark]:
    """Marks to draw for a step: X for point actions, arrows for swipes and drags.

    A drag's arrow starts at its ``start`` metadata, else at the most recent preceding
    ``mouse_move`` in ``actions``; with neither, the drag gets no mark (its start is unknown).

    Args:
        actions: The step's actions in order.

    Returns:
        Marks in action order (grid coordinates).
    """
    marks: list[Mark] = []
    last_move = None
    for action in actions:
        if isinstance(action, (*POINT_ACTIONS, LongPress)):
            marks.append(PointMark(*action.coordinate))
            if isinstance(action, MouseMove):
                last_move = action.coordinate
        elif isinstance(action, Swipe):
            marks.append(ArrowMark(*action.coordinate, *action.coordinate2))
        elif isinstance(action, LeftClickDrag):
            start = action.start or last_move
            if start is not None:
                marks.append(ArrowMark(*start, *action.coordinate))
    return marks
