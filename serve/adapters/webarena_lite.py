"""WebArenaLiteV2 (ScaleCUA evaluation): the critic inside ``agent.predict``.

The harness loop (``agent_run.py``) calls ``info, code = agent.predict(instruction=...,
observation=obs)`` and hands ``code`` (a list of ``{"name", "parameters"}`` dicts in screen
pixels) to Playwright. The wrapper keeps that interface. What the critic judges is ``code``
itself (the ``webarena_code`` format of ``hivig.actions``, screen pixels), never a re-parse of
the ``<action>`` text (the agent's own parse may differ from ours, and ``code`` is what runs).
A rejected proposal leaves no trace in ``previous_operations_list`` (the agent's step history).

    from serve.adapters import GuardedWebArenaLiteAgent
    agent = GuardedWebArenaLiteAgent(OpenCUANativeAgent(...), CriticClient(url))
    # OpenCUAAgenticWorkflow: GuardedWebArenaLiteAgent(workflow, client,
    #                                                  feedback_hook=planner_feedback)
    agent.reset()
    info, code = agent.predict(instruction=query, observation=env.get_obs())
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

from serve.adapters._common import (
    INJECT_HISTORY,
    MEMORY_ATTRS,
    EpisodeMemory,
    FeedbackHook,
    GuardedAgent,
    PromptHook,
    action_payload,
    decide_step,
    default_prompt,
    png_size,
    runner_config,
    step_result,
)
from serve.adapters._presets import WEBARENA_LITE, RunnerPreset
from serve.client import CriticClient
from serve.guard import CriticGuard, GuardConfig

WEBARENA_MEMORY_ATTRS = (
    *MEMORY_ATTRS,
    "previous_operations_list",
    "planner.messages",
    "step_count",
)
"""The native agent keeps its step history in ``previous_operations_list`` (and rewrites
``messages`` each step); ``OpenCUAAgenticWorkflow`` keeps its conversation in
``planner.messages`` and counts steps in ``step_count`` (at 0 it writes the instruction into
its system prompt)."""


def planner_feedback(agent: Any, text: str) -> None:
    """``feedback_hook`` for ``OpenCUAAgenticWorkflow``: the guard's text as a user turn.

    The workflow reads ``instruction`` only at its first step (into its planner's system
    prompt), so feedback appended to the instruction would never reach it later; it goes into
    the planner's conversation instead, before the turn the agent adds for the step. The
    wrapper's memory snapshots include ``planner.messages``, so the turn a rejected proposal
    was given is removed again before the next proposal.
    """
    agent.planner.messages.append({"role": "user", "content": [{"type": "text", "text": text}]})


STOP_CODE = ({"name": "terminate", "parameters": {"status": "failure", "info": ""}},)
"""The harness' own stop: a ``terminate`` call (the loop reads ``code[0]["parameters"]``, so
OSWorld's ``["FAIL"]`` would crash it). Returned only when the guard ends the episode."""

STOP_INFO = {
    "thought": "",
    "operation": "The critic guard ended the episode.",
    "actions": 'terminate(status="failure", info="")',
}
"""The ``info`` of the stop step, as ``result.json`` records it."""


def code_text(code: Any) -> str:
    """A ``code`` list as ScaleCUA call lines in screen pixels (what the critic reads).

    ``[{"name": "click", "parameters": {"x": 640.0, "y": 360.0, "clicks": 2, ...}}]`` ->
    ``click(x=640.0, y=360.0, clicks=2, ...)``; missing values (``None``, ``(None, None)``) are
    left out. Anything that is not a list of such dicts comes back as JSON text.
    """
    if not isinstance(code, (list, tuple)) or not all(isinstance(c, dict) for c in code):
        return json.dumps(code, ensure_ascii=False, default=str)
    lines = []
    for call in code:
        params = call.get("parameters")
        params = params if isinstance(params, dict) else {}
        if call.get("name") == "hotkey":
            keys = params.get("args") or params.get("keys") or []
            args = ", ".join(repr(str(k)) for k in (keys if isinstance(keys, list) else [keys]))
        else:
            args = ", ".join(f"{k}={_literal(v)}" for k, v in params.items() if not _missing(v))
        lines.append(f"{call.get('name')}({args})")
    return "\n".join(lines)


def _missing(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(v is None for v in value)
    return value is None


def _literal(value: Any) -> str:
    # Playwright code carries coordinate pairs as tuples; the call syntax writes lists.
    return repr(list(value) if isinstance(value, tuple) else value)


def _pair(output: Any) -> tuple[Any, Any]:
    if isinstance(output, tuple) and len(output) == 2:
        return output[0], output[1]
    return None, output


class GuardedWebArenaLiteAgent(GuardedAgent):
    """A WebArenaLiteV2 agent behind the critic: same ``reset()`` and keyword ``predict``.

    Args:
        agent: The agent (``predict(instruction=..., observation=...) -> (info, code)``,
            ``reset()``).
        client: A ``CriticClient``.
        preset: Platform, screen and frame settings (``WEBARENA_LITE``: web, 1280x720).
        config: Guard settings (K, on_exhausted, R3, recovery).
        prompt_hook: ``(instruction, ctx) -> instruction``: how history and feedback reach the
            agent (default: appended to the instruction it formats into its prompt).
        feedback_hook: ``(agent, text) -> None``: hand them over another way instead.
        memory_attrs: The agent's memory attributes to snapshot.
        inject_history: Add the gateway's progress summary to the instruction of every step
            (HiViG's history injection; sets ``config.inject_history``). Off by default: the
            instruction is the harness' own unless the critic rejected a proposal of the step.
    """

    def __init__(
        self,
        agent: Any,
        client: CriticClient,
        *,
        preset: RunnerPreset = WEBARENA_LITE,
        config: GuardConfig | None = None,
        prompt_hook: PromptHook = default_prompt,
        feedback_hook: FeedbackHook | None = None,
        memory_attrs: Iterable[str] = WEBARENA_MEMORY_ATTRS,
        inject_history: bool = INJECT_HISTORY,
    ) -> None:
        self.agent = agent
        self.client = client
        self.preset = preset
        self.config = runner_config(config, inject_history)
        self.prompt_hook = prompt_hook
        self.feedback_hook = feedback_hook
        self.memory = EpisodeMemory(agent, memory_attrs)
        self.guard: CriticGuard | None = None
        self.logs: list[list[dict[str, Any]]] = []

    def to_action(self, output: Any) -> dict[str, Any]:
        """One ``(info, code)`` output -> the API action object (``code`` is judged)."""
        info, code = _pair(output)
        operation = info.get("operation") if isinstance(info, dict) else None
        return action_payload(
            list(code) if isinstance(code, (list, tuple)) else code_text(code),
            "webarena_code",
            platform=self.preset.platform,
            screen=self.preset.screen,
            coord_space=self.preset.coord_space,
            frame=self.preset.frame() if self.preset.coord_space == "resized_px" else None,
            intent=operation.strip() if isinstance(operation, str) and operation.strip() else None,
        )

    def describe(self, output: Any) -> str:
        """The agent's own words for one output (its operation, else the code)."""
        info, code = _pair(output)
        operation = info.get("operation") if isinstance(info, dict) else None
        return operation if isinstance(operation, str) and operation else code_text(code)

    def _guard(self, instruction: str, screenshot: Any) -> CriticGuard:
        if self.guard is not None:
            return self.guard
        size = png_size(screenshot)
        if size is not None and size != self.preset.screen:
            self.preset = self.preset.with_screen(size)
        kwargs: dict[str, Any] = {"action_format": "webarena_code"}
        if self.preset.coord_space == "resized_px":
            kwargs["frame"] = self.preset.frame()
        guard = self.open_guard(
            instruction,
            platform=self.preset.platform,
            screen=self.preset.screen,
            coord_space=self.preset.coord_space,
            session_kwargs=kwargs,
        )
        self.logs.append(guard.log)
        return guard

    def predict(self, instruction: str, observation: Any, **kwargs: Any) -> Any:
        """The harness' ``predict``: the accepted ``(info, code)``, or the stop step."""
        screenshot = observation.get("screenshot") if isinstance(observation, dict) else None
        guard = self._guard(instruction, screenshot)
        guard.observe(screenshot)

        def call(text: str) -> Any:
            # Keyword arguments, as the harness calls agents.
            return self.agent.predict(instruction=text, observation=observation, **kwargs)

        decision, step = decide_step(self, guard, instruction, call)
        return step_result(self.memory, decision, step, _stop_step)


def _stop_step() -> tuple[dict[str, Any], list[Any]]:
    """The harness' stop step: its info and code (fresh copies, the harness may alter them)."""
    return dict(STOP_INFO), copy.deepcopy(list(STOP_CODE))
