"""Inspection of candidate steps with a critic backend.

Each candidate is shown to the critic exactly as the gateway shows a proposed step: the task,
the history so far (the macro summary when the trace has one, else the numbered earlier steps),
the before-screenshot carrying the action's marker, and the step text. Optionally the history
task runs on the before/after pair and its ``Last Action Result`` becomes the step's outcome
summary. Outputs are parsed with the critic's contracts; an unparseable answer or a backend
error is recorded and the step falls back to its cheap signals.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from hivig.actions import in_space, marks_for_actions, pointer_after, space_for_platform
from hivig.backends import BackendError, InferenceBackend, Sampling
from hivig.config import FrameConfig
from hivig.contracts import ContractError, CritiqueOutput, parse_critique, parse_history
from hivig.logging import get_logger
from hivig.messages import ChatMessage, ImageRef
from hivig.prompts import (
    PromptError,
    build_critique_messages,
    build_history_messages,
    format_raw_step,
    format_step,
    format_trajectory,
)
from hivig.vision import ImageError, materialise
from serve.diagnose.run import Run, RunStep

logger = get_logger(__name__)

HISTORY_STEPS = 12
"""Earlier steps listed in the critique prompt when no macro summary is recorded (the latest)."""

NO_TASK = "(the task instruction was not recorded)"
INITIAL_SUMMARY = "No action has been taken yet."


@dataclass
class Inspection:
    """What the critic said about one step.

    Attributes:
        step: The step.
        status: ``ok`` (parsed), ``unparseable``, ``backend_error`` or ``no_screenshot``.
        verdict: ``Good`` / ``Bad`` when parsed.
        dimension: The error dimension name of a Bad verdict.
        explanation: The critic's explanation.
        reason: Why the output was not used (contract or backend reason), else ``None``.
        outcome: The history task's ``Last Action Result`` for the step, when it parsed.
        outcome_status: ``ok``, ``unparseable``, ``backend_error``, ``skipped``.
        raw_output: The critique's raw text, capped (for the report).
    """

    step: int
    status: str
    verdict: str | None = None
    dimension: str | None = None
    explanation: str | None = None
    reason: str | None = None
    outcome: str | None = None
    outcome_status: str = "skipped"
    raw_output: str | None = None

    def to_json(self) -> dict[str, object]:
        """JSON form."""
        return dict(self.__dict__)


def step_text(run: Run, step: RunStep) -> str:
    """The step as the critic reads it: the ``Action:`` line and canonical tool calls.

    Falls back to the raw action text when the actions cannot be rendered in the platform's
    space (an unparseable action is judged as written, never dropped).
    """
    space = space_for_platform(run.platform)
    if step.actions and all(in_space(a, space) for a in step.actions):
        return format_step(step.intent, step.actions, space)
    raw = step.raw if step.raw.strip() else "(empty action)"
    return format_raw_step(step.intent, raw)


def history_text(run: Run, step: RunStep) -> str:
    """The critique prompt's history for ``step``: the last summary, else the earlier steps."""
    earlier = [s for s in run.steps if s.step < step.step]
    if earlier and earlier[-1].progress_summary:
        prev = earlier[-1]
        text = f"Progress Summary: {prev.progress_summary}"
        if prev.last_action_result:
            text += f"\nLast Action Result: {prev.last_action_result}"
        return text
    return format_trajectory([step_text(run, s) for s in earlier[-HISTORY_STEPS:]])


def step_marks(run: Run, step: RunStep) -> tuple:
    """The markers of a step's actions, drags starting where the earlier steps left the pointer."""
    if not step.actions:
        return ()
    pointer = None
    for s in run.steps:
        if s.step >= step.step:
            break
        pointer = pointer_after(s.actions or [], pointer)
    return tuple(marks_for_actions(step.actions, pointer=pointer))


class Inspector:
    """Runs the critic (and optionally the history task) on candidate steps."""

    def __init__(
        self,
        backend: InferenceBackend,
        *,
        frame: FrameConfig | None = None,
        sampling: Sampling | None = None,
        use_history: bool = True,
    ) -> None:
        """Wrap a backend.

        Args:
            backend: Any ``InferenceBackend``.
            frame: Pixel budget the backend expects (its processor's); the defaults otherwise.
            sampling: Sampling of every request; greedy with 1024 new tokens by default.
            use_history: Also run the history task on each step's before/after pair.
        """
        self.backend = backend
        self.frame = frame or FrameConfig()
        self.sampling = sampling or Sampling(temperature=0.0, max_tokens=1024)
        self.use_history = use_history

    def _materialise(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        return materialise(
            messages,
            ".",
            min_pixels=self.frame.min_pixels,
            max_pixels=self.frame.max_pixels,
            factor=self.frame.factor,
        )

    async def _generate(self, messages: list[ChatMessage]) -> tuple[str, str | None, bool]:
        gen = await self.backend.generate(self._materialise(messages), self.sampling)
        return gen.text, gen.reasoning, gen.finish_reason == "length"

    async def inspect(self, run: Run, step: RunStep) -> Inspection:
        """Critique one step (and describe its outcome when enabled); never raises on bad output.

        Args:
            run: The run.
            step: The candidate step.

        Returns:
            The inspection, with ``status`` saying whether the critic's answer can be used.
        """
        if step.before is None:
            return Inspection(step.step, "no_screenshot", reason="no before-screenshot")
        task = run.task or NO_TASK
        try:
            text = step_text(run, step)
            image = ImageRef(str(step.before.resolve()), step_marks(run, step))
            messages = build_critique_messages(
                task, run.platform, history_text(run, step), image, text
            )
            out, reasoning, truncated = await self._generate(messages)
        except BackendError as e:
            return Inspection(step.step, "backend_error", reason=f"{e.root_reason}: {e}"[:300])
        except (ImageError, PromptError) as e:
            return Inspection(step.step, "no_screenshot", reason=str(e)[:300])
        parsed = parse_critique(out, reasoning)
        result = _inspection(step.step, parsed, out)
        if truncated and result.status != "ok":
            result.reason = f"truncated at the token limit ({result.reason})"
        if self.use_history and step.after is not None:
            await self._outcome(run, step, (step.before, step.after), text, result)
        return result

    async def _outcome(
        self, run: Run, step: RunStep, shots: tuple[Path, Path], text: str, result: Inspection
    ) -> None:
        earlier = [s for s in run.steps if s.step < step.step]
        previous = earlier[-1].progress_summary if earlier else None
        messages = build_history_messages(
            run.task or NO_TASK,
            run.platform,
            previous or INITIAL_SUMMARY,
            ImageRef(str(shots[0].resolve())),
            ImageRef(str(shots[1].resolve())),
            text,
        )
        try:
            out, reasoning, _ = await self._generate(messages)
        except BackendError as e:
            result.outcome_status = f"backend_error: {e.root_reason}"
            return
        except ImageError as e:
            result.outcome_status = f"no_screenshot: {e.reason}"
            return
        parsed = parse_history(out, reasoning)
        if isinstance(parsed, ContractError):
            result.outcome_status = f"unparseable: {parsed.reason}"
        else:
            result.outcome, result.outcome_status = parsed.last_result, "ok"

    async def inspect_all(self, run: Run, steps: list[RunStep]) -> list[Inspection]:
        """Inspect several steps concurrently (the backend bounds what is in flight)."""
        return list(await asyncio.gather(*(self.inspect(run, s) for s in steps)))


def _inspection(step: int, parsed: CritiqueOutput | ContractError, raw: str) -> Inspection:
    capped = raw if len(raw) <= 4000 else raw[:3997] + "..."
    if isinstance(parsed, ContractError):
        logger.info("step %d: critic output unparseable (%s)", step, parsed.reason)
        return Inspection(step, "unparseable", reason=parsed.reason, raw_output=capped)
    return Inspection(
        step,
        "ok",
        verdict=parsed.verdict,
        dimension=parsed.dimension.name if parsed.dimension else None,
        explanation=parsed.explanation,
        raw_output=capped,
    )
