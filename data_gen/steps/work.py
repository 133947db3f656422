"""The item flowing through the stages (one trajectory with one ``StepUnit`` per step) and helpers.

A ``Work`` item is one trajectory plus one ``data_gen.step_unit.StepUnit`` per step, which the
stages fill in place; the executor stores it as JSON between stages (``WORK_CODEC``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from data_gen.annotator import Annotation, Annotator, AnnotatorRequest, Rejected
from data_gen.config import DataGenConfig
from data_gen.executor import Codec, StageStats
from data_gen.perturb import ElementIndex, GenParams, StepPlan, StepView
from data_gen.perturb.calls import primary_point
from data_gen.perturb.elements import ExpertStep, target_at
from data_gen.perturb.programmatic import NOT_CLICKED, mentions
from data_gen.step_unit import StepUnit, record_provenance, sample_origin
from hivig.actions import marks_for_tool_calls, pointer_after, space_for_platform
from hivig.messages import ImageRef, Mark
from hivig.profiles import Profile, default_profile
from hivig.prompts import PromptMessages, format_step, format_trajectory
from hivig.records import Labels, SFTRecord, record_from_messages
from hivig.trajectory import Trajectory
from hivig.vision import size_class_for_platform

T = TypeVar("T")

UNRENDERABLE_TARGET = "unrenderable_target"
"""Reason of an answer that parses but cannot become a training target (``render_*_target``
refuses it: think tags inside the reasoning, a field that would not round-trip)."""

INITIAL_SUMMARY = (
    "Progress Summary: No actions have been taken yet; the task is just starting.\n"
    "Last Action Result: None."
)
"""Previous summary of the first pair of every trajectory."""

RECORD_INVALID = "record_invalid"
"""Reason of a sample whose ``SFTRecord`` is inconsistent (``hivig.records.RecordError``: a
reserved ``<image>`` token in its text, a label the record schema refuses)."""


@dataclass
class Work:
    """One trajectory and its per-step annotation units."""

    trajectory: Trajectory
    split: str
    units: list[StepUnit] = field(default_factory=list)
    origin: dict[str, Any] = field(default_factory=dict)
    """Where the trajectory came from (``data_gen.flywheel``): empty for ScaleCUA data; for an
    agent's run ``source: run``, benchmark, task id, evaluated outcome and hard-case steps."""

    @property
    def failed_run(self) -> bool:
        """A failed run: only its diagnosed root cause becomes a (real Bad) sample."""
        return self.origin.get("outcome") == "failure"

    @property
    def id(self) -> str:
        """The trajectory id."""
        return self.trajectory.id

    def sample_origin(self, record: SFTRecord) -> dict[str, Any]:
        """The origin of one of this trajectory's samples (``step_unit.sample_origin``)."""
        return sample_origin(self.origin, record.step_index, record.kind, record.labels.verdict)


def _work_to_json(w: Work) -> dict[str, Any]:
    units = [u.to_json(w.sample_origin) for u in w.units]
    out = {"trajectory": w.trajectory.to_json(), "split": w.split, "units": units}
    return {**out, "origin": w.origin} if w.origin else out


def _work_from_json(obj: dict[str, Any]) -> Work:
    traj = Trajectory.from_json(obj["trajectory"])
    units = [StepUnit.from_json(u) for u in obj["units"]]
    return Work(traj, obj["split"], units, obj.get("origin") or {})


WORK_CODEC: Codec[Work] = Codec(_work_to_json, _work_from_json)


def sample_id(trajectory_id: str, index: int) -> str:
    """Id of a step's samples: ``<trajectory id>:<step index, 3 digits>``."""
    return f"{trajectory_id}:{index:03d}"


# --------------------------------------------------------------------------------------------
# Run context


class LoopThread:
    """One event loop in a daemon thread for every annotator stage of a process.

    HTTP clients bind their connection pools to the loop that first uses them, so all stages
    must share one loop rather than each calling ``asyncio.run``.
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def run_all(self, coros: list[Coroutine[Any, Any, Any]], limit: int | None = None) -> None:
        """Run coroutines concurrently on the loop and wait for all of them.

        Args:
            coros: The coroutines (each one is awaited exactly once).
            limit: At most this many run at a time; ``None`` starts them all at once.
        """

        async def bounded(coro: Coroutine[Any, Any, Any], slots: asyncio.Semaphore) -> None:
            async with slots:
                await coro

        async def gather() -> None:
            if limit is None:
                await asyncio.gather(*coros)
                return
            slots = asyncio.Semaphore(limit)
            await asyncio.gather(*(bounded(c, slots) for c in coros))

        self.run(gather())

    def close(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@dataclass
class Context:
    """Everything the stages share within one process."""

    cfg: DataGenConfig
    corpus: Path
    annotator: Annotator
    elements: ElementIndex
    plan: dict[str, StepPlan]
    params: GenParams
    loop: LoopThread
    profile: Profile = field(default_factory=default_profile)
    """The critic profile the samples are written in."""
    history_pairs: dict[str, int] = field(default_factory=dict)
    """Leading pairs of each trajectory's history chain that a planned sample needs (the
    export's history:critique cap, planned); a trajectory not named needs all of them."""

    @property
    def critic_profile(self) -> Profile | None:
        """The profile for the critic's prompt builders: ``None`` for hivig's own (the builders'
        package templates, so every existing prompt id stays as it was)."""
        return None if self.profile.is_default else self.profile

    @property
    def drag_arrows(self) -> bool:
        """Whether a drag that starts at the pointer is marked with an arrow."""
        return self.profile.frame.drag_arrows

    @property
    def seed(self) -> int:
        """Run seed."""
        return self.cfg.seed

    def run_all(self, coros: list[Coroutine[Any, Any, Any]]) -> None:
        """Run a stage's coroutines, as many at a time as the annotator has requests in flight.

        Starting them all at once would build every prompt of the shard before the first
        request goes out (the loop runs each coroutine up to its first wait); in slots, a
        coroutine builds its prompt when a request slot frees up, overlapping the other
        requests' network wait.
        """
        self.loop.run_all(coros, limit=max(1, self.annotator.jobs_in_flight))

    async def annotate_or_drop(
        self,
        stats: StageStats,
        item_id: str,
        request: AnnotatorRequest,
        validate: Callable[[str, str | None], Any],
    ) -> Annotation[Any]:
        """Annotate with validation retries; count the retries, and on failure record the drop
        (with the raw answers) under ``item_id``. The caller checks ``ok`` and, on failure,
        reads the reason from the result itself."""
        result = await self.annotator.annotate(request, validate)
        stats.add("llm_retries", result.retries)
        # Answers (paid now or earlier, from the cache) and the server's token usage: what the
        # stage's samples cost, the same on a rerun.
        stats.add("calls", result.attempts)
        if result.prompt_tokens or result.completion_tokens:
            stats.add("prompt_tokens", result.prompt_tokens)
            stats.add("completion_tokens", result.completion_tokens)
        if not result.ok:
            stats.drop(item_id, result.reason, result.message, result.raw)
        return result

    def sample(
        self,
        work: Work,
        step_index: int,
        messages: PromptMessages,
        target: str,
        *,
        id: str,
        labels: Labels,
        hashes: list[str],
    ) -> SFTRecord:
        """The ``SFTRecord`` of an annotator-written target for step ``step_index`` of
        ``work`` (``labels.verdict`` set: a critique sample; else a history sample).

        Raises:
            RecordError: The record is inconsistent (the stage drops it as
                ``RECORD_INVALID``).
        """
        traj = work.trajectory
        kind = "history" if labels.verdict is None else "critique"
        origin = sample_origin(work.origin, step_index, kind, labels.verdict)
        return record_from_messages(
            list(messages),
            target,
            id=id,
            kind=kind,
            platform=traj.platform,
            prompt_version=messages.prompt_id,
            trajectory_id=traj.id,
            episode_key=traj.episode_key,
            step_index=step_index,
            split=work.split,
            labels=labels,
            provenance=record_provenance(
                origin,
                self.annotator.model,
                "offline" if self.annotator.is_offline else "endpoint",
                hashes,
            ),
        )


# --------------------------------------------------------------------------------------------
# Trajectory helpers


def space_of(traj: Trajectory) -> str:
    """``computer_use`` or ``mobile_use``."""
    return space_for_platform(traj.platform)


def image(traj: Trajectory, path: str, marks: list[Mark] | tuple[Mark, ...] = ()) -> ImageRef:
    """A screenshot reference with the platform's marker size class."""
    return ImageRef(path, tuple(marks), size_class_for_platform(traj.platform))


def calls_of(traj: Trajectory, index: int) -> list[dict[str, Any]]:
    """The step's actions as argument dicts."""
    return [a.to_arguments() for a in traj.steps[index].actions]


def step_marks(
    traj: Trajectory, index: int, tool_calls: str, drag_arrows: bool = True
) -> list[Mark]:
    """Markers of a step given as tool-call text (the executed step's or a perturbed one).

    Rendered tool calls drop where a drag starts, so the pointer the earlier steps left (the
    parsers' rule, as ingest tracked it) is passed along: a drag that opens a step keeps its
    arrow, as it does when serving tracks the pointer over the history. Without
    ``drag_arrows`` (a profile trained that way) such a drag is left unmarked.
    """
    pointer = pointer_after(a for step in traj.steps[:index] for a in step.actions)
    return marks_for_tool_calls(tool_calls, pointer=pointer if drag_arrows else None)


def step_text(traj: Trajectory, index: int, mask_intent: bool = False) -> str:
    """``format_step`` of an executed step."""
    step = traj.steps[index]
    return format_step(step.intent, step.actions, space_of(traj), mask_intent=mask_intent)


def render_or_reject(render: Callable[..., str], *args: Any) -> str | Rejected:
    """A ``render_*_target`` result, or the refusal as a ``Rejected`` (retried, then dropped)."""
    try:
        return render(*args)
    except ValueError as e:
        return Rejected(UNRENDERABLE_TARGET, str(e))


def step_prompt_args(traj: Trajectory, index: int) -> tuple[str, str, str, ImageRef]:
    """``(task, platform, past trajectory, unmarked screenshot)``: how every step prompt starts."""
    return (
        traj.task,
        traj.platform,
        past_trajectory(traj, index),
        image(traj, traj.steps[index].screenshot),
    )


def past_trajectory(traj: Trajectory, index: int) -> str:
    """``format_trajectory`` of the steps before ``index`` (past steps keep their intents)."""
    return format_trajectory([step_text(traj, k) for k in range(index)])


def is_terminal(calls: list[dict[str, Any]]) -> bool:
    """Whether the step ends the episode (terminate or answer)."""
    return any(c.get("action") in ("terminate", "answer") for c in calls)


def step_view(traj: Trajectory, index: int, elements: ElementIndex) -> StepView:
    """The generator view of one step."""
    steps = traj.steps
    step = steps[index]
    nxt = steps[index + 1] if index + 1 < len(steps) else None
    return StepView(
        sample_id=sample_id(traj.id, index),
        platform=traj.platform,
        space=space_of(traj),
        task=traj.task,
        intent=step.intent or "",
        calls=tuple(calls_of(traj, index)),
        is_final=nxt is None,
        next_intent=(nxt.intent or "") if nxt is not None else "",
        next_calls=tuple(calls_of(traj, index + 1)) if nxt is not None else (),
        answered_before=any(
            c.get("action") == "answer" for k in range(index) for c in calls_of(traj, k)
        ),
        elements=elements.get(step.screenshot),
        earlier_elements=tuple(elements.get(steps[k].screenshot) for k in range(index)),
        next_elements=elements.get(nxt.screenshot) if nxt is not None else (),
        earlier_intents=tuple(steps[k].intent or "" for k in range(index)),
        earlier_calls=tuple(tuple(calls_of(traj, k)) for k in range(index)),
        final_intent=(steps[-1].intent or "")
        if is_terminal(calls_of(traj, len(steps) - 1))
        else "",
        partial_screens=any(elements.is_partial(steps[k].screenshot) for k in range(index + 1)),
        screenshot=step.screenshot,
        habit_boxes=_habit_boxes(traj, index, elements),
        habit_ghosts=elements.habit_ghosts(step.screenshot),
        habit_steps=_habit_steps(traj, index, elements),
    )


def expert_step(
    traj: Trajectory, index: int, elements: ElementIndex, split: str
) -> ExpertStep | None:
    """The step as a layout-habit ghost elsewhere: one point action on a labelled element its
    intent names, not a clock or a title bar; ``None`` for any other step."""
    calls = calls_of(traj, index)
    hit = primary_point(calls)
    if hit is None or len(calls) != 1 or is_terminal(calls):
        return None
    step = traj.steps[index]
    x, y = hit[1]["coordinate"]
    el = target_at(elements.get(step.screenshot), x, y)
    intent = step.intent or ""
    if el is None or not el.label or el.role in NOT_CLICKED or not mentions(el.label, intent):
        return None
    return ExpertStep(
        traj.episode_key, split, step.screenshot, (x, y), el.label, el.role, intent,
        json.dumps(calls),
    )  # fmt: skip


def note_expert_steps(elements: ElementIndex, works: list[Work]) -> None:
    """Record in ``elements`` the expert steps a layout-habit ghost may copy (``expert_step``;
    see ``ElementIndex.habit_steps``) and every screenshot's split. Failed agent runs are no
    expert's."""
    splits = {s.screenshot: w.split for w in works for s in w.trajectory.steps}
    elements.note_steps(
        (
            s
            for w in works
            if not w.failed_run
            for k in range(len(w.trajectory.steps))
            if (s := expert_step(w.trajectory, k, elements, w.split)) is not None
        ),
        splits,
    )


def _habit_steps(traj: Trajectory, index: int, elements: ElementIndex) -> tuple:
    mine = expert_step(traj, index, elements, elements.split_of(traj.steps[index].screenshot))
    if mine is None:
        return ()
    return tuple((s.label, s.intent, s.calls) for s in elements.habit_steps(mine))


def _habit_boxes(traj: Trajectory, index: int, elements: ElementIndex) -> tuple:
    """Where the expert's target usually sits on the corpus' other screens (see StepView)."""
    hit = primary_point(calls_of(traj, index))
    if hit is None:
        return ()
    shot = traj.steps[index].screenshot
    el = target_at(elements.get(shot), *hit[1]["coordinate"])
    return () if el is None or not el.label else elements.boxes_elsewhere(el.label, shot)


def critique_candidate(traj: Trajectory, index: int) -> bool:
    """Steps that can become critique samples: every step with a next screen, and a final step
    that ends the episode (its transition is the end of the task)."""
    return index + 1 < len(traj.steps) or is_terminal(calls_of(traj, index))
