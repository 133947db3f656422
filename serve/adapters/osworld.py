"""Wrappers for ``predict``-style agents: OSWorld agents and ScaleCUA agents.

The harness keeps calling ``agent.predict(instruction, obs)``; the wrapper calls the wrapped
agent (once, or again after a ``bad`` verdict, with the critic's feedback appended to the
instruction) and returns the output of the proposal the guard accepted, in the agent's own shape
(a 2-tuple, or a longer tuple passed through). The agent's own episode memory (``thoughts``,
``actions``, ``history``... see ``MEMORY_ATTRS``) is snapshotted so that a rejected proposal
leaves no trace in it, an R3 reroute proposes from an empty memory, and Restore puts back the
memory from before the loop plus the accepted step.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from typing import Any

from hivig.actions import coordinate_values, first_block, parse_scalecua_calls
from hivig.run_folders import QWEN25_FACTOR
from serve.adapters._common import (
    DEFAULT_SCREEN,
    INJECT_HISTORY,
    MEMORY_ATTRS,
    VERBATIM,
    EpisodeMemory,
    FeedbackHook,
    GuardedAgent,
    PromptHook,
    action_payload,
    decide_step,
    default_prompt,
    png_size,
    runner_config,
    scalecua_intent,
    step_result,
)
from serve.client import CriticClient
from serve.guard import CriticGuard, GuardConfig

SCALECUA_FACTOR = QWEN25_FACTOR
SCALECUA_MIN_PIXELS = 3_136
SCALECUA_MAX_PIXELS = 2_109_744
"""ScaleCUA's released agents resize screenshots with Qwen2.5-VL ``smart_resize`` (factor 28)
to at most this many pixels before the model sees them."""

log = logging.getLogger(__name__)

STOP_ACTIONS = ["FAIL"]
"""The actions returned when the guard stops the episode (OSWorld's failure string). Only an
explicit setting stops (``on_exhausted: stop``, ``r3.on_failure: terminate``): OSWorld scores
``FAIL`` 1.0 on infeasible tasks, so a stop is a task outcome, not a neutral way out."""

DEFAULT_ARITY = 2
"""Length of the stop value's tuple before the agent has answered in the episode: OSWorld's
``(response, actions)``. Runners whose agents return more (OpenCUA's 3-tuple, WAA's 4-tuple) set
``arity``; once the agent has answered, its own outputs give the shape."""

_PIXEL_SPACES = ("screen_px", "resized_px", "norm999")
_MODULE_PREFIX = re.compile(r"^\s*(?:pyautogui|mobile|computer)\.", re.MULTILINE)


def _screenshot(obs: Any) -> Any:
    if isinstance(obs, dict):
        return obs.get("screenshot")
    return getattr(obs, "screenshot", None)


class PredictWrapper(GuardedAgent):
    """The shared ``reset`` / ``predict`` machinery; subclasses say how to read the output."""

    fmt = "auto"

    def __init__(
        self,
        agent: Any,
        client: CriticClient,
        *,
        platform: str = "ubuntu",
        screen: tuple[int, int] | None = None,
        coord_space: str | None = None,
        frame: tuple[int, int] | None = None,
        config: GuardConfig | None = None,
        prompt_hook: PromptHook = default_prompt,
        feedback_hook: FeedbackHook | None = None,
        memory_attrs: Iterable[str] = MEMORY_ATTRS,
        arity: int = DEFAULT_ARITY,
        inject_history: bool = INJECT_HISTORY,
    ) -> None:
        if not isinstance(arity, int) or arity < 2:
            raise ValueError(f"arity must be an int >= 2 (the agent's tuple length), got {arity!r}")
        self.agent = agent
        self.client = client
        self.arity = arity
        self.last_output: tuple[Any, ...] | None = None
        self.platform = platform
        self.screen = screen
        self.coord_space = coord_space
        self.frame = frame
        self.config = runner_config(config, inject_history)
        self.prompt_hook = prompt_hook
        self.feedback_hook = feedback_hook
        self.memory = EpisodeMemory(agent, memory_attrs)
        self.guard: CriticGuard | None = None
        self.logs: list[list[dict[str, Any]]] = []

    # -- output reading (per runner style) ---------------------------------------------

    def action_text(self, response: Any, actions: Any) -> Any:
        """The text to critique from one ``predict`` output."""
        if isinstance(actions, str):
            return actions
        if isinstance(actions, (list, tuple)) and actions:
            if all(isinstance(a, str) for a in actions):
                return "\n".join(actions)
            return json.dumps(list(actions), ensure_ascii=False, default=str)
        return response if isinstance(response, str) else json.dumps(response, default=str)

    def intent(self, response: Any) -> str | None:
        """The agent's verbal intent, when its output states one."""
        return None

    def describe(self, output: Any) -> str:
        """The agent's own action text of one output (history entries, feedback)."""
        response, actions = (output[0], output[1]) if _is_pair(output) else (output, None)
        text = self.action_text(response, actions)
        return text if isinstance(text, str) else json.dumps(text, default=str)

    def to_action(self, output: Any) -> dict[str, Any]:
        """One ``predict`` output -> the API action object."""
        response, actions = (output[0], output[1]) if _is_pair(output) else (output, None)
        return action_payload(
            self.action_text(response, actions),
            self.fmt,
            platform=self.platform,
            screen=self.screen or DEFAULT_SCREEN,
            coord_space=self.coord_space,
            frame=self.frame,
            intent=self.intent(response),
        )

    # -- the step ------------------------------------------------------------------------

    def _coords(self) -> None:
        """Settle the coordinate space once the screen size is known (subclasses)."""

    def _guard(self, instruction: str, screenshot: Any) -> CriticGuard:
        if self.guard is not None:
            return self.guard
        self.screen = self.screen or png_size(screenshot) or DEFAULT_SCREEN
        self._coords()
        kwargs: dict[str, Any] = {"action_format": self.fmt}
        if self.frame is not None:
            kwargs["frame"] = self.frame
        guard = self.open_guard(
            instruction,
            platform=self.platform,
            screen=self.screen,
            coord_space=self.coord_space or "screen_px",
            session_kwargs=kwargs,
        )
        self.logs.append(guard.log)
        self._new_episode()
        return guard

    def _new_episode(self) -> None:
        """Forget what the previous episode's outputs looked like."""
        self.last_output = None

    def predict(self, instruction: str, obs: Any, *args: Any, **kwargs: Any) -> Any:
        """The harness' ``predict``: the accepted proposal's output, in the agent's shape."""
        screenshot = _screenshot(obs)
        guard = self._guard(instruction, screenshot)
        guard.observe(screenshot)

        def call(text: str) -> Any:
            out = self.agent.predict(text, obs, *args, **kwargs)
            if _is_pair(out):
                self.last_output = out
            return out

        decision, step = decide_step(self, guard, instruction, call)
        return step_result(self.memory, decision, step, self.stop_value)

    def stop_value(self) -> tuple[Any, ...]:
        """What ``predict`` returns when the guard stops the episode (explicit settings only).

        ``("", ["FAIL"], *rest)``: the agent's tuple length (its latest output of the episode,
        else ``arity``) with every item but the actions empty, of the same kind as the agent's
        (an info/log dict is ``{}``; before the agent has answered, the extra items of OpenCUA's
        and WAA's tuples are empty dicts). Nothing of a rejected proposal is handed back: the
        harness writes these items next to the ``FAIL`` step (WAA's ``traj.jsonl``), and the
        proposal never ran.
        """
        last = self.last_output
        rest = tuple(_empty_like(v) for v in last[2:]) if last is not None else None
        if rest is None:
            rest = tuple({} for _ in range(self.arity - 2))
        return ("", list(STOP_ACTIONS), *rest)


def scalecua_frame(screen: tuple[int, int]) -> tuple[int, int]:
    """``(w, h)`` of the image a ScaleCUA agent sees for a ``screen`` of ``(w, h)`` pixels."""
    # Deferred: the image stack is not needed to wrap an agent until a frame is computed.
    from hivig.vision import smart_resize

    h, w = smart_resize(
        screen[1], screen[0], SCALECUA_FACTOR, SCALECUA_MIN_PIXELS, SCALECUA_MAX_PIXELS
    )
    return (w, h)


def _empty_like(value: Any) -> Any:
    """An empty value of ``value``'s kind (a dict, list, tuple or str), else ``None``."""
    for kind in (dict, list, tuple, str):
        if isinstance(value, kind):
            return kind()
    return None


def _is_pair(output: Any) -> bool:
    return isinstance(output, tuple) and len(output) >= 2


class GuardedOSWorldAgent(PredictWrapper):
    """An OSWorld agent behind the critic: same ``reset()`` and ``predict(instruction, obs)``.

    Actions are pyautogui code strings (screen pixels by default) or ``WAIT``/``DONE``/``FAIL``;
    several actions of one step are judged together as one proposal.

    Args:
        agent: The OSWorld agent (``predict(instruction, obs) -> (response, actions)`` or a
            3-tuple).
        client: A ``CriticClient``.
        platform: Session platform (``ubuntu`` for OSWorld, ``windows`` for WAA).
        screen: Screen size; read from the first screenshot when omitted.
        coord_space: How the agent writes coordinates (``screen_px`` by default).
        frame: Resized frame ``(w, h)`` for ``resized_px`` agents.
        config: Guard settings (K, on_exhausted, R3, recovery).
        prompt_hook: ``(instruction, ctx) -> instruction``: how history and feedback reach the
            agent (default: appended to the instruction).
        feedback_hook: ``(agent, text) -> None``: hand history and feedback to the agent
            another way (e.g. an extra user turn); the instruction then stays unchanged.
        memory_attrs: The agent's memory attributes to snapshot.
        arity: The agent's tuple length, for a stop before it has answered in the episode
            (default 2; OpenCUA's agent returns 3, WAA's 4). Stopping happens only with
            ``on_exhausted: stop`` or ``r3.on_failure: terminate``; the defaults fail open.
        inject_history: Add the gateway's progress summary to the instruction of every step
            (HiViG's history injection; sets ``config.inject_history``). Off by default: the
            instruction is the harness' own unless the critic rejected a proposal of the step.
    """

    fmt = "osworld"


class GuardedScaleCUAAgent(PredictWrapper):
    """A ScaleCUA agent behind the critic (``predict``), reading its ``<action>`` block.

    The critic judges what will run. ScaleCUA's OSWorld and WindowsAgentArena agents return the
    pyautogui code they converted from their ``<action>`` block (screen pixels), and the VM runs
    that code: with the default ``judge="auto"`` returned code is judged (in ``screen_px``),
    otherwise the response's ``<action>`` block (an agent that returns no code, e.g. one whose
    harness executes the block itself); ``judge="block"`` always judges the block. The
    ``<operation>`` text is sent as the intent.

    Coordinates are read in one space for the whole episode, never guessed per step from their
    magnitude (``click(x=960, y=540)`` and ``click(x=1200, y=540)`` must mean the same kind of
    point). The released ScaleCUA agents write pixels of the image they were shown, so the
    default is ``resized_px`` with the frame ScaleCUA's Qwen2.5-VL ``smart_resize`` gives the
    screen (``scalecua_frame``: factor 28, max 2,109,744 pixels; 1920x1080 -> 1932x1092). Pass
    ``coord_space`` (``norm01`` for data-style fractions, ``screen_px``, ...) for other agents,
    and ``frame`` for ``resized_px`` when the agent resizes differently. Arguments as
    ``GuardedOSWorldAgent``.

    An agent that writes ``[0, 1]`` fractions (``click(x=0.42, y=0.31)``) under a pixel space
    would be read as a point a pixel from the top-left corner. That is never reinterpreted
    step by step (a guess could be wrong the other way); instead a step whose coordinates are
    all fractions of ``[0, 1]`` is sent ``verbatim`` (judged as written, no marker at the
    corner), a warning is logged once per episode and ``events["coords_look_norm01"]`` counts
    the steps. Set ``coord_space="norm01"`` for such an agent.
    """

    fmt = "scalecua"
    judge = "auto"
    """What is judged: ``auto`` (the returned pyautogui code when the agent returns some, else
    the ``<action>`` block), ``block`` or ``actions``; set per wrapper with ``judge=``."""
    warned_norm01 = False
    """Whether this episode's ``[0, 1]`` warning was logged (a class default, so the wrapper
    owns the name)."""

    def __init__(self, agent: Any, client: CriticClient, *, judge: str = "auto", **kwargs: Any):
        if judge not in ("auto", "block", "actions"):
            raise ValueError(f"judge must be auto, block or actions, got {judge!r}")
        super().__init__(agent, client, **kwargs)
        self.judge = judge

    def _new_episode(self) -> None:
        super()._new_episode()
        self.warned_norm01 = False

    def to_action(self, output: Any) -> dict[str, Any]:
        """As ``GuardedOSWorldAgent``, with the ``[0, 1]`` check of the class docstring."""
        response, actions = (output[0], output[1]) if _is_pair(output) else (output, None)
        text = self.action_text(response, actions)
        space = self.coord_space or "resized_px"
        fractions = space in _PIXEL_SPACES and isinstance(text, str) and unit_fractions(text)
        if fractions:
            self._warn_norm01()
        code = executed_code(actions) if self.judge != "block" else None
        if code is not None:
            # ScaleCUA's OSWorld and WAA agents return the pyautogui code they made from the
            # block (screen pixels; ``DONE`` when their own parse failed): that code runs, so
            # it is judged, even a click its conversion put in the corner.
            payload = action_payload(
                code,
                "osworld",
                platform=self.platform,
                screen=self.screen or DEFAULT_SCREEN,
                coord_space="screen_px",
                intent=self.intent(response),
            )
            payload.setdefault("coord_space", "screen_px")
            return payload
        if fractions:
            payload: dict[str, Any] = {"raw": text, "format": self.fmt, VERBATIM: True}
            intent = self.intent(response)
            if intent:
                payload["intent"] = intent
            return payload
        return super().to_action(output)

    def _warn_norm01(self) -> None:
        if self.guard is not None:
            self.guard.events["coords_look_norm01"] += 1
        if not self.warned_norm01:
            self.warned_norm01 = True
            log.warning(
                "ScaleCUA agent wrote [0, 1] coordinates under coord_space=%s (read as pixels, "
                "next to the top-left corner); pass coord_space='norm01' if the agent uses "
                "fractions",
                self.coord_space,
            )

    def _coords(self) -> None:
        if self.coord_space is None:
            self.coord_space = "resized_px"
        if self.coord_space == "resized_px" and self.frame is None:
            self.frame = scalecua_frame(self.screen or DEFAULT_SCREEN)

    def action_text(self, response: Any, actions: Any) -> Any:
        """The ``<action>`` block of the response, else the returned actions."""
        if isinstance(response, str):
            block = first_block(response, "action")
            if block is not None and block.strip():
                return block
        return super().action_text(response, actions)

    def intent(self, response: Any) -> str | None:
        """The ``<operation>`` text."""
        return scalecua_intent(response)


def executed_code(actions: Any) -> str | None:
    """The pyautogui code of a ``predict`` output's actions (one statement block per action),
    or ``None`` when they are not code strings (empty, dicts, prose)."""
    if isinstance(actions, str):
        actions = [actions]
    if not isinstance(actions, (list, tuple)) or not actions:
        return None
    if not all(isinstance(a, str) and a.strip() for a in actions):
        return None
    if not all(a.strip() in ("WAIT", "DONE", "FAIL") or "pyautogui." in a for a in actions):
        return None
    return "\n".join(actions)


def unit_fractions(text: str) -> bool:
    """Whether every coordinate of a ScaleCUA step is within ``[0, 1]`` and one has a fraction.

    ``click(x=0.42, y=0.31)`` is; ``click(x=0, y=1)`` (pixels or fractions alike) and
    ``click(x=0.5, y=540)`` are not. Steps without coordinates are not.
    """
    block = first_block(text, "action")
    calls = parse_scalecua_calls(_MODULE_PREFIX.sub("", text if block is None else block))
    if not isinstance(calls, list):
        return False
    values = coordinate_values(calls)
    if not values or not all(0.0 <= v <= 1.0 for v in values):
        return False
    return any(v != int(v) for v in values)
