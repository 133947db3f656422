"""Actions -> Qwen3-VL tool-call text, and actions -> screenshot marks.

Rendering is the single place that writes ``<tool_call>`` blocks, so training targets, prompts and
serving show identical text: one block per call, compact JSON with ``ensure_ascii=False`` (typed
text stays UTF-8), order kept.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, MutableMapping
from typing import Any

from hivig.actions.model import (
    POINT_ACTIONS,
    Action,
    ActionError,
    HScroll,
    LeftClickDrag,
    LongPress,
    Point,
    Scroll,
    Swipe,
    in_space,
)
from hivig.messages import ArrowMark, Mark, PointMark


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


UNMARKED_DRAG = "unmarked_drag"
"""``stats`` key of ``marks_for_actions``: drags left unmarked because their start is unknown."""


def _moves_pointer_to(action: Action) -> Point | None:
    """Where the pointer is after ``action``, when the action puts it somewhere.

    This mirrors the parsers' pointer (the ScaleCUA/OSWorld normaliser): every point action leaves
    the pointer at its coordinate, a drag leaves it at its end, and so does a scroll or hscroll
    with a position (the wheel turns where the pointer was moved to).
    """
    if isinstance(action, (*POINT_ACTIONS, LeftClickDrag, Scroll, HScroll)):
        return action.coordinate  # None for a scroll without a position
    return None


def pointer_after(actions: Iterable[Action], pointer: Point | None = None) -> Point | None:
    """The pointer position after ``actions``, tracked exactly as the parsers track it.

    Args:
        actions: One step's actions, in order.
        pointer: The position before the step, if known.

    Returns:
        The position the last pointer-moving action left, else ``pointer``.
    """
    for action in actions:
        pointer = _moves_pointer_to(action) or pointer
    return pointer


def marks_for_actions(
    actions: Iterable[Action],
    *,
    pointer: Point | None = None,
    stats: MutableMapping[str, int] | None = None,
) -> list[Mark]:
    """Marks to draw for a step: X for point actions, arrows for swipes and drags.

    A drag's arrow starts at its ``start`` metadata, else at the pointer left by the preceding
    actions of the step, tracked exactly as the parsers track it (see ``_moves_pointer_to``), so
    marks are the same whether the actions came from ScaleCUA data, OSWorld code or rendered
    ``<tool_call>`` text (which carries no ``start``). A drag whose start is still unknown gets
    no mark and is counted in ``stats[UNMARKED_DRAG]``.

    Args:
        actions: The step's actions in order.
        pointer: Pointer position before the step (e.g. the last point of the previous step), if
            known; the parsers' ``pointer`` argument.
        stats: Mapping that receives counts of unmarkable actions (``UNMARKED_DRAG``); a
            ``collections.Counter`` or a plain dict.

    Returns:
        Marks in action order (grid coordinates).
    """
    marks: list[Mark] = []
    for action in actions:
        if isinstance(action, (*POINT_ACTIONS, LongPress)):
            marks.append(PointMark(*action.coordinate))
        elif isinstance(action, Swipe):
            marks.append(ArrowMark(*action.coordinate, *action.coordinate2))
        elif isinstance(action, LeftClickDrag):
            start = action.start or pointer
            if start is not None:
                marks.append(ArrowMark(*start, *action.coordinate))
            elif stats is not None:
                stats[UNMARKED_DRAG] = stats.get(UNMARKED_DRAG, 0) + 1
        pointer = _moves_pointer_to(action) or pointer
    return marks
