"""Qwen3-VL ``<tool_call>`` parsing and the ``computer_use``/``mobile_use`` tool definitions.

Tool-call bodies are strict JSON: ``true``/``null`` and double quotes. Python literals
(``True``, single quotes) are rejected, as are ``NaN``/``Infinity``, which ``json`` would
otherwise accept.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from hivig.actions._strict_json import loads
from hivig.actions._tags import all_blocks
from hivig.actions.model import (
    ACTION_NAMES,
    COMPUTER,
    MOBILE,
    SPACES,
    SYSTEM_BUTTONS,
    TERMINATE_STATUSES,
    Action,
    ActionError,
    Point,
    action_from_arguments,
)
from hivig.actions.render import marks_for_actions
from hivig.messages import Mark


def _parse_block(body: str) -> Action | ActionError:
    obj = loads(body.strip(), "tool call")
    if isinstance(obj, ActionError):
        return obj
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        return ActionError("bad_syntax", "tool call must be an object with name and arguments")
    name, arguments = obj["name"], obj["arguments"]
    if name not in SPACES:
        return ActionError("unknown_action", f"unknown function {name!r}")
    if isinstance(arguments, str):
        # Some servers pass ``arguments`` as a JSON-encoded string (OpenAI style).
        arguments = loads(arguments, "tool call arguments")
        if isinstance(arguments, ActionError):
            return arguments
    return action_from_arguments(arguments, space=name)


def parse_tool_calls(text: str) -> list[Action] | ActionError:
    """Parse every ``<tool_call>`` block of a model response, in order.

    Surrounding text (``<think>`` blocks, ``Thought:``/``Action:`` lines) is ignored; tags are
    matched case-insensitively.

    Args:
        text: The full response text.

    Returns:
        The actions, or an ``ActionError``: ``no_tool_call`` (no block), ``bad_syntax``
        (unterminated block, not strict JSON, wrong shape), ``unknown_action`` or any reason of
        ``action_from_arguments``. Never raises.
    """
    if not isinstance(text, str):
        return ActionError("bad_syntax", f"response must be a string, got {type(text).__name__}")
    bodies, well_formed = all_blocks(text, "tool_call")
    if not well_formed:
        return ActionError("bad_syntax", "unterminated <tool_call> block")
    if not bodies:
        return ActionError("no_tool_call", "no <tool_call> block in the response")
    actions: list[Action] = []
    for body in bodies:
        action = _parse_block(body)
        if isinstance(action, ActionError):
            return action
        actions.append(action)
    return actions


_COORD = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": 1000},
    "minItems": 2,
    "maxItems": 2,
}

_COMPUTER_DESCRIPTION = (
    "Operate a computer with the mouse and keyboard by looking at screenshots. "
    "The screen is 1000x1000: coordinates are integers from 0 to 1000 relative to the "
    "screenshot, x to the right and y downward. There is no terminal or application menu; "
    "aim clicks at the centre of the target element.\n"
    "* `key`: press the keys in `keys` together (released in reverse order).\n"
    "* `type`: type `text`.\n"
    "* `mouse_move`: move the pointer to `coordinate`.\n"
    "* `left_click`, `right_click`, `middle_click`, `double_click`, `triple_click`: click at "
    "`coordinate`.\n"
    "* `left_click_drag`: drag from the current pointer position to `coordinate`.\n"
    "* `scroll`: scroll vertically by `pixels` (positive up, negative down).\n"
    "* `hscroll`: scroll horizontally by `pixels` (positive right, negative left).\n"
    "* `wait`: wait `time` seconds.\n"
    "* `terminate`: end the task with `status`.\n"
    "* `answer`: give the answer `text` to the user."
)

_MOBILE_DESCRIPTION = (
    "Operate a phone touch screen by looking at screenshots. The screen is 1000x1000: "
    "coordinates are integers from 0 to 1000 relative to the screenshot, x to the right and y "
    "downward.\n"
    "* `key`: send the key event named `text`.\n"
    "* `click`: tap at `coordinate`.\n"
    "* `long_press`: press at `coordinate` for `time` seconds.\n"
    "* `swipe`: move a finger from `coordinate` to `coordinate2`.\n"
    "* `type`: type `text` into the focused field.\n"
    "* `system_button`: press the system `button`.\n"
    "* `open`: open the app named `text`.\n"
    "* `wait`: wait `time` seconds.\n"
    "* `answer`: give the answer `text` to the user.\n"
    "* `terminate`: end the task with `status`."
)


def _status() -> dict[str, Any]:
    return {"type": "string", "enum": list(TERMINATE_STATUSES), "description": "For terminate."}


TOOL_GRIDS = (1000, 999)
"""Grid sides a tool definition can state: the 0-1000 grid of ``norm1000`` (the training data's)
and the 999x999 screen some Qwen3-VL prompts state (``norm999``)."""


def action_space(space: str, grid: int = 1000) -> dict[str, Any]:
    """The tool definition embedded in prompts for ``computer_use`` or ``mobile_use``.

    Args:
        space: ``"computer_use"`` or ``"mobile_use"``.
        grid: The grid side the definition states (``TOOL_GRIDS``); 1000 is the critic's own
            prompts' and the training data's, 999 matches a policy told ``999x999``.

    Returns:
        ``{"type": "function", "function": {"name", "description", "parameters"}}`` with the
        screen stated as ``grid`` x ``grid``.

    Raises:
        ActionError: ``unknown_action`` for any other space name, ``bad_argument`` for a grid
            outside ``TOOL_GRIDS``.
    """
    spec = _action_space(space)
    if grid == 1000:
        return spec
    if grid not in TOOL_GRIDS:
        raise ActionError("bad_argument", f"grid must be one of {TOOL_GRIDS}, got {grid!r}")
    return _regrid(spec, grid)


def _regrid(spec: dict[str, Any], grid: int) -> dict[str, Any]:
    """``spec`` with every statement of the 1000 grid (text and schema bounds) set to ``grid``."""
    fn = dict(spec["function"])
    fn["description"] = (
        fn["description"]
        .replace("1000x1000", f"{grid}x{grid}")
        .replace("from 0 to 1000", f"from 0 to {grid}")
    )
    props = {}
    for name, prop in fn["parameters"]["properties"].items():
        if prop.get("items", {}).get("maximum") == 1000:
            prop = {**prop, "items": {**prop["items"], "maximum": grid}}
            if "description" in prop:
                prop["description"] = prop["description"].replace("0-1000", f"0-{grid}")
        props[name] = prop
    fn["parameters"] = {**fn["parameters"], "properties": props}
    return {**spec, "function": fn}


def _action_space(space: str) -> dict[str, Any]:
    if space == COMPUTER:
        description = _COMPUTER_DESCRIPTION
        props: dict[str, Any] = {
            "keys": {"type": "array", "items": {"type": "string"}, "description": "For key."},
            "text": {"type": "string", "description": "For type and answer."},
            "coordinate": {**_COORD, "description": "Target point [x, y] on the 0-1000 grid."},
            "pixels": {"type": "integer", "description": "For scroll and hscroll."},
            "time": {"type": "number", "description": "Seconds, for wait."},
            "status": _status(),
        }
    elif space == MOBILE:
        description = _MOBILE_DESCRIPTION
        props = {
            "coordinate": {**_COORD, "description": "Point [x, y]; the start of a swipe."},
            "coordinate2": {**_COORD, "description": "End point [x, y] of a swipe."},
            "text": {"type": "string", "description": "For key, type, open and answer."},
            "time": {"type": "number", "description": "Seconds, for long_press and wait."},
            "button": {"type": "string", "enum": list(SYSTEM_BUTTONS)},
            "status": _status(),
        }
    else:
        raise ActionError("unknown_action", f"unknown function {space!r}")
    parameters = {
        "type": "object",
        "properties": {"action": {"type": "string", "enum": list(ACTION_NAMES[space])}, **props},
        "required": ["action"],
    }
    return {
        "type": "function",
        "function": {"name": space, "description": description, "parameters": parameters},
    }


def marks_for_tool_calls(
    text: str, *, pointer: Point | None = None, stats: MutableMapping[str, int] | None = None
) -> list[Mark]:
    """Markers for a proposed step given as ``<tool_call>`` text, block by block.

    The one rule for partly invalid steps, shared by data generation and serving: a block that
    does not parse (an Action Formulation Error) gets no marker; the other blocks keep theirs.

    Args:
        text: The proposed step's tool-call text.
        pointer: Pointer position before the step, if known (see ``marks_for_actions``).
        stats: Optional counters, as for ``marks_for_actions``.

    Returns:
        The marks of every block that parses, in order.
    """
    # Each block on its own, scanned once: the blocks that parse are the actions
    # ``parse_tool_calls`` returns when all of them do.
    parsed = (_parse_block(body) for body in all_blocks(text, "tool_call")[0])
    actions = [a for a in parsed if not isinstance(a, ActionError)]
    return marks_for_actions(actions, pointer=pointer, stats=stats)
