"""AndroidWorld: the agent owns the environment, so the critic sits inside ``step(goal)``.

``GuardedAndroidWorldAgent.step(goal)`` observes the device screen, then runs the wrapped agent's
own ``step`` with its ``env`` swapped for a proxy. The proxy's ``execute_action`` is where the
agent hands over its actions: they are buffered, not run. The commands one agent step issues
(ScaleCUA's agent taps and then types in one step) are reviewed together as ONE proposal, when
the step ends or as soon as the agent reads the screen again (``get_state``: M3A and T3A look at
the result of their action within the step, to summarise it, so their one action must have run
by then). An accepted proposal's commands run in order on the real environment; on a rejection
nothing runs, the agent's memory is rolled back and its step is run again with the critic's
feedback appended to the goal, up to K times. A goal-status report (``complete`` /
``infeasible``), which the agents return without calling ``execute_action``, is read from the
step's data and reviewed the same way, as a terminate action.

While buffered, ``execute_action`` returns ``None``: AndroidWorld's own ``execute_action``
returns nothing, and the agents ignore the value.

Replay keeps the agent's timing. The agents pause between their commands and before they read
the screen again (ScaleCUA's agent sleeps after each command; M3A sleeps
``wait_after_action_seconds`` and then ``transition_pause`` before its "after" screenshot).
Those pauses pass while the commands are still buffered, so the time from each buffered
command to the next one (and from the last one to the next ``get_state``, or to the end of the
step) is recorded and waited again after that command when the accepted batch runs: a type
lands after the tap has focused the field, and the screen the agent summarises has settled.

An actuation error during replay is logged, counted (``guard.events["command_error"]``) and
the remaining commands still run: every upstream agent wraps ``execute_action`` in a ``try``
that logs the failure and carries on, so the unwrapped agent would have swallowed it too (the
wrapper cannot tell whether a call was inside such a ``try``; it assumes so). What an agent
would have written about the error in its memory (M3A's "some error happened" summary) is lost:
the error happens after the agent's step has moved on.

Index actions (M3A/T3A: ``{"action_type": "click", "index": N}``) are resolved for the critic
from the UI elements of the state the agent read this step: actuation taps the centre of
``ui_elements[N].bbox_pixels``, so the critic judges that point and the marker sits on the
element. A ``scroll`` with an index swipes inside the element's box (from its centre to the
edge the view moves towards; index 0 means the whole screen, as in actuation) and is judged as
that swipe. The agent's own action is what runs. An index without such an element stays raw
text.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from serve.adapters._common import (
    INJECT_HISTORY,
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
    runner_config,
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
    # JSONAction leaves unset fields None and serialises without them: so do these.
    if dataclasses.is_dataclass(action) and not isinstance(action, type):
        return {k: v for k, v in dataclasses.asdict(action).items() if v is not None}
    if hasattr(action, "__dict__"):
        return {k: v for k, v in vars(action).items() if v is not None}
    return str(action)


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


@dataclasses.dataclass(frozen=True)
class StepCommands:
    """The commands one agent step issued, reviewed together as one proposal.

    Attributes:
        actions: The agent's own actions, in order (what runs on the device).
        judged: What the critic reads of each: index actions resolved to the element's centre.
        calls: The ``(args, kwargs)`` each ``execute_action`` call was made with.
        pauses: Seconds the agent let pass after each command (until its next command, its
            next screen read, or the end of its step); waited again after it on replay.
    """

    actions: tuple[Any, ...]
    judged: tuple[Any, ...]
    calls: tuple[tuple[tuple[Any, ...], dict[str, Any]], ...] = ()
    pauses: tuple[float, ...] = ()


@dataclasses.dataclass(frozen=True)
class ElementScroll:
    """A ``scroll`` with an index as actuation performs it: a swipe inside the element's box
    (device pixels), judged as that swipe."""

    action: dict[str, Any]
    start: tuple[int, int]
    end: tuple[int, int]

    def scalecua(self) -> str:
        """The swipe in ScaleCUA's call syntax (device pixels)."""
        (x0, y0), (x1, y1) = self.start, self.end
        return f"swipe(from_coord=[{x0}, {y0}], to_coord=[{x1}, {y1}])"


@dataclasses.dataclass
class _Run:
    """One run of the agent's step: what it proposed, what it returned, its memory after."""

    proposal: Any
    result: Any
    memory: dict[str, Any]


class _EnvProxy:
    """The agent's ``env`` during one run of its step: buffers ``execute_action`` calls and
    has them reviewed as one proposal (see the module docstring)."""

    def __init__(self, env: Any, wrapper: GuardedAndroidWorldAgent) -> None:
        self._env = env
        self._wrapper = wrapper
        self.pending: list[tuple[Any, Any, tuple[Any, ...], dict[str, Any], float]] = []
        self.state: Any = None
        """The last state the agent read in this run (its UI elements resolve index actions)."""
        self.review: Review | None = None
        self.batch: StepCommands | None = None
        """This run's proposal, once reviewed."""
        self.executed = False
        self.closed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def get_state(self, *args: Any, **kwargs: Any) -> Any:
        # The agent is about to look at the screen: what it issued so far must have run.
        self.settle()
        self.state = self._env.get_state(*args, **kwargs)
        return self.state

    def execute_action(self, action: Any, *args: Any, **kwargs: Any) -> None:
        if self.closed:
            return None  # this run's proposal was rejected: nothing more of it runs
        if self.executed:
            # A command after the agent read the result of its accepted ones (no harness agent
            # does this): run as issued, counted, since the step's review is over.
            self._wrapper.guard.events["unreviewed_command"] += 1
            log.warning("a command after the step's accepted proposal runs unreviewed")
            self._env.execute_action(action, *args, **kwargs)
            return None
        judged = action_dict(action)
        if isinstance(judged, dict) and judged.get("index") is not None:
            judged = resolve_index(judged, self._observed(), self._wrapper.screen)
        self.pending.append((action, judged, args, kwargs, time.monotonic()))
        return None

    def _observed(self) -> Any:
        # The agent chose from the state it read this run; one that never read it through
        # ``env`` (a cached state) is resolved against the screen as it is now.
        if self.state is None:
            self.state = self._env.get_state(wait_to_stabilize=False)
        return self.state

    def settle(self) -> None:
        """Review the buffered commands as one proposal; run them all on accept."""
        if not self.pending or self.closed or self.executed:
            return
        guard = self._wrapper.guard
        # Called as the agent reads the screen or ends its step: the time since its last
        # command is the pause it meant to leave before that.
        stamps = [p[4] for p in self.pending] + [time.monotonic()]
        batch = StepCommands(
            tuple(p[0] for p in self.pending),
            tuple(p[1] for p in self.pending),
            tuple((p[2], p[3]) for p in self.pending),
            tuple(max(0.0, b - a) for a, b in zip(stamps, stamps[1:], strict=False)),
        )
        self.pending = []
        self.batch = batch
        review = guard.review(batch)
        self.review = review
        if not review.accept:
            self.closed = True  # rejected (or the episode stops): nothing runs on the device
            return
        guard.commit(review)
        self.executed = True
        if isinstance(review.proposal, StepCommands):
            # ``execute_first`` may pick an earlier run's batch; a status report runs nothing.
            self.replay(review.proposal)

    def replay(self, run: StepCommands) -> None:
        """Run ``run``'s commands in order on the real environment, with the agent's pauses."""
        pauses = run.pauses or (0.0,) * len(run.actions)
        for action, (args, kwargs), pause in zip(run.actions, run.calls, pauses, strict=True):
            try:
                self._env.execute_action(action, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the agents' own try logs it and goes on
                self._wrapper.guard.events["command_error"] += 1
                log.warning("an accepted command failed on the device (%s); continuing", exc)
            if pause > 0:
                time.sleep(pause)


def resolve_index(action: Any, state: Any, screen: tuple[int, int] | None = None) -> Any:
    """An index action as actuation performs it, for the critic.

    AndroidWorld's actuation of ``click``, ``long_press`` and ``input_text`` (tap, then type)
    with ``index`` taps the centre of ``state.ui_elements[index].bbox_pixels``: those come back
    with ``x``/``y`` there. A ``scroll`` with ``index`` swipes inside that box (see
    ``element_scroll``) and comes back as an ``ElementScroll``. Anything else (no index,
    explicit ``x``/``y``, an index out of range, an element without a box) comes back
    unchanged and is judged as the agent wrote it.
    """
    if not isinstance(action, dict) or action.get("x") is not None:
        return action
    index = action.get("index")
    if isinstance(index, str) and index.strip().isdigit():
        index = int(index)
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        return action
    if action.get("action_type") == "scroll":
        scroll = element_scroll(action, index, state, screen)
        return action if scroll is None else scroll
    elements = getattr(state, "ui_elements", None)
    if not isinstance(elements, (list, tuple)) or index >= len(elements):
        return action
    centre = bbox_centre(getattr(elements[index], "bbox_pixels", None))
    if centre is None:
        return action
    resolved = {k: v for k, v in action.items() if k != "index" and v is not None}
    resolved["x"], resolved["y"] = centre
    return resolved


def element_scroll(
    action: dict[str, Any], index: int, state: Any, screen: tuple[int, int] | None
) -> ElementScroll | None:
    """The swipe actuation makes for ``scroll`` at ``index``, or ``None`` when unknown.

    Actuation tests ``if action.index:``, so index 0 scrolls the whole screen; another index
    scrolls inside its element's box clipped to the screen. The finger starts at the box's
    centre and moves to the edge the content comes from (``down``: the top edge).
    """
    direction = action.get("direction")
    if direction not in ("up", "down", "left", "right") or screen is None:
        return None
    w, h = screen
    if index == 0:
        x0, y0, x1, y1 = 0, 0, w, h
    else:
        elements = getattr(state, "ui_elements", None)
        if not isinstance(elements, (list, tuple)) or index >= len(elements):
            return None
        box = getattr(elements[index], "bbox_pixels", None)
        if bbox_centre(box) is None:
            return None
        x0, y0 = max(float(box.x_min), 0), max(float(box.y_min), 0)
        x1, y1 = min(float(box.x_max), w), min(float(box.y_max), h)
    # Actuation floors the centre and truncates every point to whole pixels.
    cx, cy = int((x0 + x1) // 2), int((y0 + y1) // 2)
    ends = {"down": (cx, y0), "up": (cx, y1), "right": (x0, cy), "left": (x1, cy)}
    end = (int(ends[direction][0]), int(ends[direction][1]))
    clean = {k: v for k, v in action.items() if v is not None}
    return ElementScroll(clean, (cx, cy), end)


def bbox_centre(box: Any) -> tuple[int, int] | None:
    """Centre of an AndroidWorld ``BoundingBox(x_min, x_max, y_min, y_max)`` in whole pixels
    (actuation truncates it the same way), or ``None`` for anything else."""
    try:
        x0, x1 = float(box.x_min), float(box.x_max)
        y0, y1 = float(box.y_min), float(box.y_max)
    except (AttributeError, TypeError, ValueError):
        return None
    if not (x1 >= x0 and y1 >= y0):
        return None
    return int((x0 + x1) / 2), int((y0 + y1) / 2)


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
        inject_history: Add the gateway's progress summary to the goal of every step
            (HiViG's history injection; sets ``config.inject_history``). Off by default: the
            goal is the harness' own unless the critic rejected a proposal of the step.
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
        inject_history: bool = INJECT_HISTORY,
    ) -> None:
        self.agent = agent
        self.client = client
        self.screen = screen
        self.coord_space = coord_space
        self.config = runner_config(config, inject_history)
        self.prompt_hook = prompt_hook
        self.feedback_hook = feedback_hook
        self.memory = EpisodeMemory(agent, memory_attrs)
        self.screenshot = screenshot
        self.guard: CriticGuard | None = None

    def to_action(self, proposal: Any) -> dict[str, Any]:
        """A step's commands (or one action) -> ONE API action object.

        Every command that parses: their tool calls together, in order; otherwise the judged
        actions as raw JSON (one object, or a list for several).
        """
        judged = proposal.judged if isinstance(proposal, StepCommands) else (proposal,)
        payloads = [self._payload(a) for a in judged]
        if len(payloads) == 1:
            return payloads[0]
        if all(p["format"] == "qwen" for p in payloads):
            return {
                "raw": "\n".join(p["raw"] for p in payloads),
                "format": "qwen",
                "coord_space": "norm1000",
            }
        raw = json.dumps([_as_written(a) for a in judged], ensure_ascii=False, default=str)
        return {"raw": raw, "format": "androidworld"}

    def _payload(self, action: Any) -> dict[str, Any]:
        screen = self.screen or (1080, 2400)
        if isinstance(action, ElementScroll):
            # AndroidWorld's JSON has no swipe between two points: ScaleCUA's call has, in
            # device pixels (actuation's own coordinates).
            got = action_payload(
                action.scalecua(), "scalecua", platform="android", screen=screen,
                coord_space="screen_px",
            )  # fmt: skip
            if got["format"] == "qwen":
                return got
            action = action.action
        return action_payload(
            action_dict(action),
            "androidworld",
            platform="android",
            screen=screen,
            coord_space=self.coord_space,
        )

    def describe(self, proposal: Any) -> str:
        """The agent's own actions as text (history entries, feedback)."""
        actions = proposal.actions if isinstance(proposal, StepCommands) else (proposal,)
        return "; ".join(json.dumps(action_dict(a), default=str) for a in actions)

    def _guard(self, goal: str, shot: bytes) -> CriticGuard:
        if self.guard is not None:
            return self.guard
        self.screen = self.screen or png_size(shot) or (1080, 2400)
        # The agent proposes inside its own step; the guard's policy is set per step.
        return self.open_guard(
            goal,
            platform="android",
            screen=self.screen,
            coord_space=self.coord_space,
            session_kwargs={"action_format": "androidworld"},
        )

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
        runs: list[_Run] = []
        proxy = _EnvProxy(env, self)  # one per run of the agent's step
        # The guard's rulings end the loop within N reroute proposals followed (on_failure:
        # continue) by K + 1 normal ones; the bound only guards against an agent that never
        # calls execute_action.
        bound = self.config.r3.reroute_attempts + self.config.max_reproposals + 2
        idx = guard.step_idx
        for _ in range(bound):
            proxy = _EnvProxy(env, self)
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
            proxy.settle()  # the commands issued since the agent last read the screen
            run = _Run(proxy.batch, result, self.memory.take())
            runs.append(run)
            review = proxy.review
            if review is None and not proxy.executed:
                # M3A/T3A report the goal status without calling execute_action: that report
                # is the step's action, judged as terminate.
                status = status_action(result, self.agent)
                if status is not None:
                    run.proposal = status
                    review = guard.review(status)
                    if review.accept:
                        guard.commit(review)
                        if isinstance(review.proposal, StepCommands):
                            proxy.replay(review.proposal)  # execute_first: an earlier batch
                        return self._chosen(review, runs)
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
        return self._chosen(proxy.review, runs)

    def _chosen(self, review: Review | None, runs: list[_Run]) -> Any:
        """The result of the run whose proposal was executed, with that run's memory.

        ``execute_first`` executes an earlier run's proposal after later runs changed the
        agent's memory: the memory and the result handed back are that run's, so they describe
        what ran on the device.
        """
        chosen = next(
            (r for r in runs if review is not None and r.proposal is review.proposal), None
        )
        if chosen is None or chosen is runs[-1]:
            return runs[-1].result if runs else None
        self.memory.put(chosen.memory)
        return chosen.result


def _as_written(action: Any) -> Any:
    """A judged command as the agent wrote it (an ``ElementScroll``: its scroll)."""
    return action.action if isinstance(action, ElementScroll) else action_dict(action)


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
