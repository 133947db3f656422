"""AndroidWorld: the agent owns the environment, so the critic sits inside ``step(goal)``.

``GuardedAndroidWorldAgent.step(goal)`` observes the device screen, then runs the wrapped agent's
own ``step`` with its ``env`` swapped for a proxy. The proxy's ``execute_action`` is where the
agent hands over its chosen action: the guard reviews it there; an accepted action is executed
on the real environment, a rejected one is not, and the agent's step is run again (its memory
rolled back, the critic's feedback appended to the goal) up to K times. A goal-status report
(``complete`` / ``infeasible``), which the agents return without calling ``execute_action``, is
read from the step's data and reviewed the same way, as a terminate action.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from serve.adapters._common import (
    MEMORY_ATTRS,
    NO_ACTION,
    EpisodeMemory,
    FeedbackHook,
    GuardedAgent,
    PromptHook,
    action_payload,
    default_prompt,
    png_size,
    prompt_for,
    rgb_png,
)
from serve.client import CriticClient
from serve.guard import CriticGuard, GuardConfig, Review

log = logging.getLogger(__name__)


def action_dict(action: Any) -> Any:
    """An AndroidWorld ``JSONAction`` (or dict, or JSON text) as a plain dict."""
    if isinstance(action, (dict, str)):
        return action
    if hasattr(action, "json_str"):
        try:
            return json.loads(action.json_str())
        except (TypeError, ValueError):
            pass
    if dataclasses.is_dataclass(action) and not isinstance(action, type):
        return dataclasses.asdict(action)
    return dict(vars(action)) if hasattr(action, "__dict__") else str(action)


def default_screenshot(env: Any) -> bytes:
    """PNG of the current device screen (``env.get_state().pixels``)."""
    state = env.get_state(wait_to_stabilize=False)
    return rgb_png(state.pixels)


@dataclasses.dataclass
class StoppedResult:
    """The step result when the guard ends the episode before the agent acts (the shape of
    AndroidWorld's ``AgentInteractionResult``)."""

    done: bool = True
    data: dict[str, Any] = dataclasses.field(default_factory=dict)


class _EnvProxy:
    """The agent's ``env`` during a guarded step: reviews the first ``execute_action``."""

    def __init__(self, env: Any, wrapper: GuardedAndroidWorldAgent) -> None:
        self._env = env
        self._wrapper = wrapper
        self.review: Review | None = None
        self.executed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def execute_action(self, action: Any, *args: Any, **kwargs: Any) -> Any:
        if self.executed or self.review is not None and self.review.stop:
            # Later calls within one agent step (rare) run as they are.
            return self._env.execute_action(action, *args, **kwargs) if self.executed else None
        guard = self._wrapper.guard
        review = guard.review(action)
        self.review = review
        if not review.accept:
            return None  # rejected: nothing happens on the device
        self.executed = True
        guard.commit(review)
        return self._env.execute_action(review.proposal, *args, **kwargs)


class GuardedAndroidWorldAgent(GuardedAgent):
    """An AndroidWorld agent behind the critic, exposing the agent's own ``step(goal)``.

    Args:
        agent: The AndroidWorld agent (``agent.env``, ``step(goal) -> AgentInteractionResult``,
            ``reset(go_home)``).
        client: A ``CriticClient``.
        screen: Device screen size; read from the first screenshot when omitted.
        coord_space: How the agent's actions write coordinates (device pixels by default).
        config: Guard settings.
        prompt_hook: ``(goal, ctx) -> goal``: how history and feedback reach the agent.
        feedback_hook: ``(agent, text) -> None``: hand them over another way instead.
        memory_attrs: The agent's memory attributes to snapshot (M3A/T3A keep ``history``).
        screenshot: ``env -> PNG bytes`` (default: ``env.get_state().pixels`` encoded).
    """

    def __init__(
        self,
        agent: Any,
        client: CriticClient,
        *,
        screen: tuple[int, int] | None = None,
        coord_space: str = "screen_px",
        config: GuardConfig | None = None,
        prompt_hook: PromptHook = default_prompt,
        feedback_hook: FeedbackHook | None = None,
        memory_attrs: Iterable[str] = MEMORY_ATTRS,
        screenshot: Callable[[Any], bytes] = default_screenshot,
    ) -> None:
        self.agent = agent
        self.client = client
        self.screen = screen
        self.coord_space = coord_space
        self.config = config or GuardConfig()
        self.prompt_hook = prompt_hook
        self.feedback_hook = feedback_hook
        self.memory = EpisodeMemory(agent, memory_attrs)
        self.screenshot = screenshot
        self.guard: CriticGuard | None = None

    def to_action(self, action: Any) -> dict[str, Any]:
        """A ``JSONAction`` -> the API action object."""
        return action_payload(
            action_dict(action),
            "androidworld",
            platform="android",
            screen=self.screen or (1080, 2400),
            coord_space=self.coord_space,
        )

    def _guard(self, goal: str, shot: bytes) -> CriticGuard:
        if self.guard is None:
            self.screen = self.screen or png_size(shot) or (1080, 2400)
            self.guard = CriticGuard(
                self.client,
                lambda ctx: None,  # the agent proposes inside its own step
                task=goal,
                platform="android",
                screen=self.screen,
                coord_space=self.coord_space,
                config=self.config,
                to_action=self.to_action,
                session_kwargs={"action_format": "androidworld"},
                describe=lambda action: json.dumps(action_dict(action), default=str),
            )
            self.memory.begin()
        return self.guard

    def step(self, goal: str) -> Any:
        """The agent's ``step``, with every action it executes reviewed first."""
        env = self.agent.env
        shot = self.screenshot(env)
        guard = self._guard(goal, shot)
        guard.observe(shot)
        if guard.terminating:
            guard.abandon()
            return StoppedResult(data={"guard": "r3_failed"})
        self.memory.sync(guard)
        start = self.memory.step(guard.step_idx)
        result = None
        proxy = _EnvProxy(env, self)
        # The guard's rulings end the loop within N reroute proposals followed (on_failure:
        # continue) by K + 1 normal ones; the bound only guards against an agent that never
        # calls execute_action.
        bound = self.config.r3.reroute_attempts + self.config.max_reproposals + 2
        idx = guard.step_idx
        for _ in range(bound):
            proxy.review, proxy.executed = None, False
            ctx = guard.context()
            # A rejected proposal leaves no trace in the agent; a reroute that failed within
            # this step puts back the memory from before the loop.
            start = self.memory.rebase(guard, idx, start)
            if ctx.mode == "reroute":
                self.memory.fresh()  # R3 reset: task and screen only
            self.agent.env = proxy
            try:
                text = prompt_for(self.agent, goal, ctx, self.prompt_hook, self.feedback_hook)
                result = self.agent.step(text)
            finally:
                self.agent.env = env
            review = proxy.review
            if review is None and not proxy.executed:
                # M3A/T3A report the goal status without calling execute_action: that report
                # is the step's action, judged as terminate.
                status = status_action(result, self.agent)
                if status is not None:
                    review = guard.review(status)
                    if review.accept:
                        guard.commit(review)
                        return result
            if review is None or proxy.executed:
                break
            if review.stop:
                guard.abandon("stopped")
                return _mark_done(result)
        if not proxy.executed:
            # Nothing ran on the device (the agent reported the goal status, or kept proposing
            # rejected actions): the next observe says so.
            guard.commit(Review(True, None, dict(NO_ACTION), None, "no_action"))
        return result


def status_action(result: Any, agent: Any) -> dict[str, Any] | None:
    """The status action (``complete`` / ``infeasible``) an agent step ended with, if any.

    Read from the step's ``result.data["action_output_json"]``, else from the agent's last
    history entry (where M3A and T3A keep the same step data); ``None`` for anything else.
    """
    data = getattr(result, "data", None)
    candidates = [data.get("action_output_json")] if isinstance(data, dict) else []
    history = getattr(agent, "history", None)
    if isinstance(history, list) and history and isinstance(history[-1], dict):
        candidates.append(history[-1].get("action_output_json"))
    for value in candidates:
        if value is None:
            continue
        action = action_dict(value)
        if isinstance(action, str):
            try:
                action = json.loads(action)
            except ValueError:
                continue
        if isinstance(action, dict) and action.get("action_type") == "status":
            return {k: v for k, v in action.items() if v is not None}
    return None


def _mark_done(result: Any) -> Any:
    """``result`` with ``done = True`` (the guard stopped the episode)."""
    if result is None:
        return result
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        try:
            return dataclasses.replace(result, done=True)
        except (TypeError, ValueError):
            pass
    try:
        result.done = True
    except AttributeError:
        log.warning("cannot mark the agent's step result as done")
    return result
