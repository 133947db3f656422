"""Plain Qwen3-VL tool-call policies behind the critic.

The policy is any ``generate(ctx) -> str`` that returns a Qwen3-VL response (free text and
``<tool_call>`` blocks); ``qwen_messages`` builds the usual chat messages for it from the
context (tool schema, screenshot, task, and the guard's history / feedback addendum).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from typing import Any

from hivig.actions import Action, ActionError, action_space, parse_agent_output, space_for_platform
from serve.adapters._common import action_payload
from serve.client import CriticClient, ImageInput
from serve.guard import CriticGuard, Decision, GuardConfig, PolicyContext

_ACTION_LINE = re.compile(r"^\s*Action:\s*(?P<text>[^<{\n][^\n]*)$", re.MULTILINE)

TOOLS_LEAD = (
    "You may call one or more of the functions below to act on the screen. Their signatures "
    "are given inside <tools></tools> XML tags:"
)
"""Introduces the tool definitions (the role of the lead sentence in Qwen's chat template)."""

TOOL_CALL_FORMAT = (
    "Write each function call as a JSON object with the function's name and its arguments, "
    "wrapped in <tool_call></tool_call> XML tags, one block per call:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
"""How a call is written, placed after ``</tools>``: the format Qwen3-VL's chat template and
computer-use prompts teach (one strict-JSON object per ``<tool_call>`` block)."""

GRID_OF_SPACE = {"norm1000": 1000, "norm999": 999}
"""The grid side the tool definition states for each coordinate space a Qwen policy may use."""


def qwen_intent(response: Any) -> str | None:
    """The ``Action: ...`` line a Qwen3-VL response states before its tool call."""
    if not isinstance(response, str):
        return None
    match = _ACTION_LINE.search(response)
    return match["text"].strip() if match else None


def qwen_messages(
    ctx: PolicyContext, platform: str, system: str = "", *, coord_space: str = "norm1000"
) -> list[dict[str, Any]]:
    """Chat messages for a Qwen3-VL policy call (OpenAI-style content parts).

    Args:
        ctx: The guard's context for this call.
        platform: Picks the ``computer_use`` or ``mobile_use`` tool.
        system: Extra system text placed before the tool definition.
        coord_space: The space the policy is told to write (and the session reads):
            ``norm1000`` states a 1000x1000 screen, ``norm999`` a 999x999 one.

    Returns:
        ``[system, user]`` messages; the screenshot is a ``data:`` URL when given as bytes.

    Raises:
        ValueError: For a pixel space (the tool definition states a grid; a pixel-prompted
            policy needs its own messages).
    """
    grid = GRID_OF_SPACE.get(coord_space)
    if grid is None:
        raise ValueError(
            f"qwen_messages states a grid: coord_space must be one of {sorted(GRID_OF_SPACE)}, "
            f"got {coord_space!r}"
        )
    tool = json.dumps(action_space(space_for_platform(platform), grid), ensure_ascii=False)
    tools = f"# Tools\n\n{TOOLS_LEAD}\n<tools>\n{tool}\n</tools>\n\n{TOOL_CALL_FORMAT}"
    system_text = f"{system}\n\n{tools}".strip()
    user: list[dict[str, Any]] = []
    shot = ctx.screenshot
    if isinstance(shot, (bytes, bytearray)):
        url = "data:image/png;base64," + base64.b64encode(bytes(shot)).decode("ascii")
        user.append({"type": "image_url", "image_url": {"url": url}})
    text = ctx.task
    if ctx.history and not ctx.fresh:
        steps = "\n".join(f"Step {i + 1}: {h}" for i, h in enumerate(ctx.history))
        text += f"\n\nPrevious actions:\n{steps}"
    addendum = ctx.prompt_addendum()
    if addendum:
        text += f"\n\n{addendum}"
    user.append({"type": "text", "text": text})
    return [
        {"role": "system", "content": [{"type": "text", "text": system_text}]},
        {"role": "user", "content": user},
    ]


class GuardedQwenPolicy:
    """A Qwen3-VL tool-call policy behind the critic.

    Args:
        generate: ``generate(ctx) -> response text`` (e.g. ``qwen_messages`` with the same
            ``coord_space`` + a chat call).
        client: A ``CriticClient``.
        task: The task instruction.
        platform: Session platform.
        screen: Screen size ``(w, h)``.
        coord_space: How the policy writes coordinates (``norm1000`` for Qwen3-VL; ``norm999``
            for agents that divide by 999; ``screen_px`` / ``resized_px`` for pixel prompts).
        frame: Resized frame for ``resized_px``.
        config: Guard settings.
    """

    def __init__(
        self,
        generate: Callable[[PolicyContext], str],
        client: CriticClient,
        *,
        task: str,
        platform: str,
        screen: tuple[int, int],
        coord_space: str = "norm1000",
        frame: tuple[int, int] | None = None,
        config: GuardConfig | None = None,
    ) -> None:
        self.platform = platform
        self.screen = screen
        self.coord_space = coord_space
        self.frame = frame
        kwargs: dict[str, Any] = {"action_format": "qwen"}
        if frame is not None:
            kwargs["frame"] = frame
        self.guard = CriticGuard(
            client,
            generate,
            task=task,
            platform=platform,
            screen=screen,
            coord_space=coord_space,
            config=config,
            to_action=self.to_action,
            session_kwargs=kwargs,
        )

    @property
    def log(self) -> list[dict[str, Any]]:
        """The critic exchange of the episode."""
        return self.guard.log

    def to_action(self, response: Any) -> dict[str, Any]:
        """A response -> the API action object."""
        return action_payload(
            response,
            "qwen",
            platform=self.platform,
            screen=self.screen,
            coord_space=self.coord_space,
            frame=self.frame,
            intent=qwen_intent(response),
            # The caller executes ``actions(decision)``: this same reading, repairs included.
            executes_repair=True,
        )

    def actions(self, decision: Decision) -> list[Action] | ActionError:
        """The accepted response read as grid actions, for the caller's executor."""
        if decision.proposal is None:
            return ActionError("empty", "the guard stopped the episode")
        return parse_agent_output(
            decision.proposal,
            "qwen",
            platform=self.platform,
            width=self.screen[0],
            height=self.screen[1],
            coord_space=self.coord_space,
            frame=self.frame,
        )

    def reset(self, task: str | None = None) -> None:
        """Start a new episode."""
        self.guard.reset(task)

    def step(self, screenshot: ImageInput) -> Decision:
        """Observe, propose, critique; the caller executes ``decision.proposal``."""
        return self.guard.step(screenshot)

    def run(
        self, execute: Callable[[Any], ImageInput | None], screenshot: ImageInput, max_steps: int
    ) -> list[Decision]:
        """Drive an episode (see ``CriticGuard.run``)."""
        return self.guard.run(execute, screenshot, max_steps)
