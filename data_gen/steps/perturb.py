"""Stage 4: perturbation into Bad steps, one planned dimension per step.

Unit: a planned Bad sample (steps with a transition whose plan names a dimension). Programmatic
dimensions are constructed exactly by their generator; annotator dimensions are requested from the
annotator with every dimension feasible at the step as candidates, the planned one first (the plan
orders them by the distribution's deficit), and validated: the dimension must be one offered and
true by its property check, the calls must parse in the platform's
action space (except for Action Formulation Error, whose point is a broken call), and the Bad
step must differ from the expert's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from data_gen.annotator import AnnotatorRequest, Rejected
from data_gen.executor import StageStats
from data_gen.perturb import DRAFTERS, PROGRAMMATIC, BadStep, StepView, generator_rng
from data_gen.perturb.calls import parse_calls, render_calls
from data_gen.perturb.programmatic import ACTION_FORMULATION
from data_gen.perturb.properties import violation
from data_gen.steps.work import (
    Context,
    Work,
    sample_id,
    step_prompt_args,
    step_text,
    step_view,
)
from hivig.actions import ActionError, action_from_arguments
from hivig.contracts import ContractError, PerturbationOutput, parse_perturbation
from hivig.prompts import build_perturbation_messages, format_raw_step
from hivig.taxonomy import lookup_dimension

_ACTION_LINE = re.compile(r"^\s*\**\s*Action\s*\**\s*:\s*(.*)$", re.IGNORECASE)
_FIRST_CALL = re.compile(r"<tool_call>", re.IGNORECASE)


def split_proposed_step(step: str) -> tuple[str, str]:
    """``(intent, calls text)`` of an ``Action: ...`` line followed by ``<tool_call>`` blocks."""
    m = _FIRST_CALL.search(step)
    head, calls = (step[: m.start()], step[m.start() :]) if m else (step, "")
    intent = ""
    for line in head.splitlines():
        hit = _ACTION_LINE.match(line)
        if hit:
            intent = hit.group(1).strip()
            break
    return intent, calls.strip()


def perturbation_validator(
    view: StepView, dimension: str | Sequence[str]
) -> Callable[[str, str | None], tuple[PerturbationOutput, str, str, Any] | Rejected]:
    """Validator of annotator perturbations for one step and the offered dimension(s).

    The answer's calls are re-rendered by the one canonical renderer (``render_calls``): the
    critic must not be able to tell an annotator-written Bad step from a Good one by the
    model's own JSON formatting (key order, spacing, float digits). Only an Action Formulation
    Error keeps its raw text, because the malformed text is the error. The Bad step must also
    pass its dimension's property check (``perturb.properties``).
    """
    offered = [dimension] if isinstance(dimension, str) else list(dimension)
    expected = {lookup_dimension(d) for d in offered}

    def validate(
        text: str, reasoning: str | None
    ) -> tuple[PerturbationOutput, str, str, Any] | Rejected:
        parsed = parse_perturbation(text, reasoning)
        if isinstance(parsed, ContractError):
            return Rejected(parsed.reason, parsed.message)
        if parsed.dimension not in expected:
            return Rejected(
                "dimension_mismatch",
                f"offered {', '.join(offered)}, got {parsed.dimension.name}",
            )
        intent, calls_text = split_proposed_step(parsed.rejected_proposed_step)
        intent = " ".join(intent.split())
        calls = parse_calls(calls_text)
        if isinstance(calls, ActionError):
            if parsed.dimension is ACTION_FORMULATION:  # an unparseable call by design
                return parsed, intent, calls_text, None
            return Rejected("bad_tool_call", str(calls))
        for call in calls:
            if isinstance(action_from_arguments(call, view.space), ActionError):
                return Rejected("wrong_action_space", f"{call.get('action')!r} not in {view.space}")
        if calls == list(view.calls):
            return Rejected("no_divergence", "the Bad step equals the expert step")
        canonical = render_calls(calls, view.space)
        bad = BadStep(
            parsed.dimension.name, "annotator", "annotator", intent, canonical, tuple(calls)
        )
        why = violation(view, bad)
        if why is not None:
            return Rejected(PROPERTY_VIOLATED, f"{parsed.dimension.name}: {why}")
        return parsed, intent, canonical, calls

    return validate


PROPERTY_VIOLATED = "property_violated"
"""Drop reason of a Bad step that is not true to its dimension (``perturb.properties``)."""


class PerturbStep:
    """Bad-step generation for the planned dimension of each step."""

    name = "perturb"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def run(self, items: list[Work], stats: StageStats) -> list[Work]:
        """Generate every planned Bad step of the shard."""
        self.ctx.run_all([self.step(w, k, stats) for w in items for k in range(len(w.units))])
        return items

    async def step(self, work: Work, k: int, stats: StageStats) -> None:
        """The Bad step planned for step ``k``, if any (once its transition is there)."""
        plan = self.ctx.plan.get(sample_id(work.id, k))
        if work.units[k].transition is None or plan is None or not plan.critique:
            return
        if plan.dimension is None:
            stats.add("no_bad_planned")
            return
        await self._one(work, k, plan.dimension, stats)

    async def _one(self, work: Work, k: int, dimension: str, stats: StageStats) -> None:
        ctx, traj = self.ctx, work.trajectory
        sid = sample_id(traj.id, k)
        stats.seen()
        view = step_view(traj, k, ctx.elements)
        rng = generator_rng(ctx.seed, sid, dimension)
        if dimension in PROGRAMMATIC:
            bad = PROGRAMMATIC[dimension](view, rng, ctx.params)
            if bad is None:
                stats.drop(sid, "generator_not_applicable", dimension)
                return
            why = violation(view, bad)
            if why is not None:  # a generator bug; counted, never trained on
                stats.drop(sid, PROPERTY_VIOLATED, f"{dimension}: {why}")
                return
        else:
            bad = await self._annotated(work, k, view, dimension, rng, stats)
            if bad is None:
                return
        work.units[k].bad = bad
        stats.add(f"dim:{bad.dimension}")
        stats.kept()

    async def _annotated(
        self, work: Work, k: int, view: StepView, dimension: str, rng: Any, stats: StageStats
    ) -> BadStep | None:
        ctx, traj = self.ctx, work.trajectory
        sid = sample_id(traj.id, k)
        oracle: dict[str, Any] = {"dimension": dimension}
        if ctx.annotator.is_offline:
            draft = DRAFTERS[dimension](view, rng)
            if draft is None:
                stats.drop(sid, "generator_not_applicable", dimension)
                return None
            intent, calls, thought, note = draft
            oracle.update(
                thought=thought,
                note=note,
                bad_step_text=format_raw_step(intent, render_calls(calls, view.space)),
            )
        # The annotator picks the most plausible error among the dimensions feasible here,
        # offered by the target distribution's deficit (the plan's choice first).
        plan = ctx.plan[sid]
        offered = list(plan.candidates) or [dimension]
        dims = [lookup_dimension(d) for d in offered]
        messages = build_perturbation_messages(
            *step_prompt_args(traj, k),
            traj.steps[k].think or "",
            step_text(traj, k),
            [d for d in dims if d is not None],
        )
        request = AnnotatorRequest(self.name, list(messages), oracle)
        result = await ctx.annotate_or_drop(
            stats, sid, request, perturbation_validator(view, offered)
        )
        if not result.ok:
            return None
        parsed, intent, calls_text, calls = result.value
        return BadStep(
            dimension=parsed.dimension.name,
            method="annotator",
            generator="annotator",
            intent=intent,
            text=calls_text,
            calls=None if calls is None else tuple(calls),
            thought=parsed.rejected_thought,
            note=oracle.get("note", parsed.rejected_thought),
            extra={"request_hashes": result.request_hashes, "prompt_version": messages.prompt_id},
        )
