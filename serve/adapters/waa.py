"""WindowsAgentArena: the critic inside ``agent.predict`` (a 4-tuple).

The harness (``lib_run_single.py``) calls ``response, actions, logs, computer_update_args =
agent.predict(instruction, obs)`` and runs each of ``actions`` (pyautogui code in screen
pixels, or ``WAIT`` / ``DONE`` / ``FAIL``). The wrapper keeps that interface and judges the
``actions`` list, which is what runs; the ScaleCUA agent has already turned the pixels of its
1288x812 frame into 1280x800 screen pixels there. A rejected proposal leaves no trace in the
agent's ``history`` (the ``<operation>`` lines its prompt lists).

    from serve.adapters import GuardedWAAAgent
    agent = GuardedWAAAgent(ScaleCUAAgent(...), CriticClient(url))
    agent.reset()
    response, actions, logs, update = agent.predict(instruction, obs)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from serve.adapters._common import (
    INJECT_HISTORY,
    MEMORY_ATTRS,
    FeedbackHook,
    PromptHook,
    default_prompt,
    png_size,
    scalecua_intent,
)
from serve.adapters._presets import WAA, RunnerPreset
from serve.adapters.osworld import PredictWrapper
from serve.client import CriticClient
from serve.guard import GuardConfig

WAA_STOP_ACTIONS = ("FAIL",)
"""The harness' own stop (scored right only on infeasible tasks); returned only when the guard
ends the episode."""


class GuardedWAAAgent(PredictWrapper):
    """A WindowsAgentArena agent behind the critic: same ``reset()`` and ``predict``.

    Args:
        agent: The agent (``predict(instruction, obs) -> (response, actions, logs,
            computer_update_args)``, ``reset()``).
        client: A ``CriticClient``.
        preset: Platform, screen and coordinate settings (``WAA``: windows, 1280x800, screen
            pixels). Agents whose actions are frame pixels take a preset with ``resized_px``.
        config: Guard settings (K, on_exhausted, R3, recovery).
        prompt_hook: ``(instruction, ctx) -> instruction``: how history and feedback reach the
            agent (default: appended to the instruction).
        feedback_hook: ``(agent, text) -> None``: hand them over another way instead.
        memory_attrs: The agent's memory attributes to snapshot (ScaleCUA and Navi keep
            ``history``).
        inject_history: Add the gateway's progress summary to the instruction of every step
            (HiViG's history injection; sets ``config.inject_history``). Off by default: the
            instruction is the harness' own unless the critic rejected a proposal of the step.
    """

    fmt = "osworld"

    def __init__(
        self,
        agent: Any,
        client: CriticClient,
        *,
        preset: RunnerPreset = WAA,
        config: GuardConfig | None = None,
        prompt_hook: PromptHook = default_prompt,
        feedback_hook: FeedbackHook | None = None,
        memory_attrs: Iterable[str] = MEMORY_ATTRS,
        inject_history: bool = INJECT_HISTORY,
    ) -> None:
        super().__init__(
            agent,
            client,
            platform=preset.platform,
            coord_space=preset.coord_space,
            config=config,
            prompt_hook=prompt_hook,
            feedback_hook=feedback_hook,
            memory_attrs=memory_attrs,
            inject_history=inject_history,
            # The harness unpacks four values, also from a stop before the agent answered.
            arity=4,
        )
        self.preset = preset

    def intent(self, response: Any) -> str | None:
        """The ``<operation>`` text of a ScaleCUA response (``None`` for other agents)."""
        return scalecua_intent(response)

    def predict(self, instruction: str, obs: Any, *args: Any, **kwargs: Any) -> Any:
        """The harness' ``predict``: the accepted 4-tuple, or the stop step."""
        if self.guard is None:
            # A new episode: the screen is the screenshot's, else the preset's (never
            # OSWorld's 1920x1080 default).
            shot = obs.get("screenshot") if isinstance(obs, dict) else None
            self.screen = png_size(shot) or self.preset.screen
            if self.coord_space == "resized_px":
                self.frame = self.preset.frame(self.screen)
        return super().predict(instruction, obs, *args, **kwargs)
