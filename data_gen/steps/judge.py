"""Stage 5: the double-blind judge.

Unit: a generated Bad step. The judge sees the expert step and the Bad step as candidates A and B
in an order drawn from the sample's seed (and the dimension list in a per-sample order, against
position bias). It must prefer the expert and name the injected dimension; otherwise the Bad
sample is dropped with the reason. When it prefers the Bad step, the expert step is doubtful too
and its Good sample is vetoed (dropped in the rationale stage, counted there).

A real Bad (a failed run's diagnosed root-cause step, ``data_gen.flywheel``) goes the same way,
with diagnose's correction as the other candidate: it is kept only when the judge prefers the
correction and names the diagnosed dimension.
"""

from __future__ import annotations

import random
from typing import Any

from data_gen.annotator import AnnotatorRequest, Rejected
from data_gen.executor import StageStats, sample_seed, unit_float
from data_gen.flywheel import REAL_METHOD
from data_gen.perturb import BadStep
from data_gen.step_unit import JudgeVerdict
from data_gen.steps.work import (
    Context,
    Work,
    sample_id,
    step_prompt_args,
    step_text,
)
from hivig.contracts import ContractError, JudgeOutput, parse_judge
from hivig.prompts import build_judge_messages, format_intent_step, format_raw_step
from hivig.taxonomy import DIMENSIONS

NO_CORRECTION = "Take a different step that makes progress toward the goal."
"""The alternative shown against a real Bad whose diagnosis proposed no correction."""


def validate_judge(text: str, reasoning: str | None) -> JudgeOutput | Rejected:
    """Contract check of a judge answer (separate reasoning is passed on, never scanned)."""
    parsed = parse_judge(text, reasoning)
    if isinstance(parsed, ContractError):
        return Rejected(parsed.reason, parsed.message)
    return parsed


class JudgeStep:
    """Double-blind filter of Bad steps."""

    name = "judge"

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def run(self, items: list[Work], stats: StageStats) -> list[Work]:
        """Judge every Bad step of the shard."""
        self.ctx.run_all([self.step(w, k, stats) for w in items for k in range(len(w.units))])
        return items

    async def step(self, work: Work, k: int, stats: StageStats) -> None:
        """Judge step ``k``'s Bad step, if it has one."""
        if work.units[k].bad is not None:
            await self._one(work, k, stats)

    async def _one(self, work: Work, k: int, stats: StageStats) -> None:
        ctx, traj = self.ctx, work.trajectory
        unit = work.units[k]
        sid = sample_id(traj.id, k)
        bad = unit.bad
        assert bad is not None  # step() judges only steps with a Bad
        stats.seen()
        if not ctx.cfg.judge.enabled:
            unit.judge = JudgeVerdict(accepted=True, skipped=True)
            stats.add("unjudged")
            stats.kept()
            return
        expert_slot = "A" if unit_float(ctx.seed, sid, "judge_order") < 0.5 else "B"
        expert = self._alternative(traj, k, bad)
        other = format_raw_step(bad.intent, bad.text)
        a, b = (expert, other) if expert_slot == "A" else (other, expert)
        order = list(DIMENSIONS)
        random.Random(sample_seed(ctx.seed, sid, "judge_dimension_order")).shuffle(order)
        messages = build_judge_messages(
            *step_prompt_args(traj, k),
            a,
            b,
            dimension_order=order,
        )
        oracle = {"expert_slot": expert_slot, "dimension": bad.dimension, "note": bad.note}
        request = AnnotatorRequest(self.name, list(messages), oracle)
        result = await ctx.annotate_or_drop(stats, sid, request, validate_judge)
        if not result.ok:
            unit.judge = JudgeVerdict(accepted=False, reason=result.reason)
            return
        out = result.value
        reason = self._reject_reason(out, expert_slot, bad)
        unit.judge = JudgeVerdict(
            accepted=reason is None,
            vetoes_good=out.better_candidate != expert_slot,
            expert_slot=expert_slot,
            better=out.better_candidate,
            dimension=None if out.dimension is None else out.dimension.name,
            prompt_version=messages.prompt_id,
            request_hashes=tuple(result.request_hashes),
        )
        if reason is not None:
            stats.drop(sid, reason, f"judge: {unit.judge.to_json()}", result.raw)
            return
        stats.kept()

    @staticmethod
    def _alternative(traj: Any, k: int, bad: BadStep) -> str:
        """The candidate the Bad step is judged against: the expert's executed step, or for a
        real Bad (the agent's own root-cause step) the correction its diagnosis proposes."""
        if bad.method != REAL_METHOD:
            return step_text(traj, k)
        # A correction is words, not a call: shown as the ``Action:`` line alone.
        return format_intent_step(bad.extra.get("correction") or NO_CORRECTION)

    def _reject_reason(self, out: JudgeOutput, expert_slot: str, bad: BadStep) -> str | None:
        if out.better_candidate != expert_slot:
            return "judge_preferred_perturbed"
        if out.dimension is None:
            return "judge_invalid"
        if self.ctx.cfg.judge.require_dimension_match and out.dimension.name != bad.dimension:
            return "judge_dimension_mismatch"
        return None
