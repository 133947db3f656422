"""The stages of one shard run together: each item moves on as soon as what it needs is done.

Run one after another, behind a barrier each, the stages leave the annotator idle at every
barrier while the slowest item of a stage finishes, and the history chains (one summary at a
time per trajectory) run alone at the end of their stage. Here every trajectory runs as one
task: its history chain beside its steps, and each step through transition, perturbation,
judge and rationale in turn. All requests share the annotator's one concurrency budget, where
the request with the longest path of requests still to follow it goes first (a history chain's
early pairs, a step's transition; ``data_gen.annotator.priority``), so the run does not end
waiting on one long path while the slots stand idle.

What each stage does, counts and drops is unchanged: the stages keep their own counters, and
the executor commits them in order once the shard is done (``Executor.run_shard``).
"""

from __future__ import annotations

import asyncio
import dataclasses

from data_gen.executor import StageStats
from data_gen.progress import stage_bars
from data_gen.steps.history import HistoryStep
from data_gen.steps.judge import JudgeStep
from data_gen.steps.perturb import PerturbStep
from data_gen.steps.rationale import RationaleStep
from data_gen.steps.transitions import TransitionsStep, unplanned_reason
from data_gen.steps.work import Context, Work, sample_id

UNIT_FIELDS = {
    "transitions": ("transition",),
    "history": ("history",),
    "perturb": ("bad",),
    "judge": ("judge",),
    "rationale": ("critique",),
}
"""The ``StepUnit`` fields each stage writes (see ``data_gen.step_unit``)."""


def planned_items(ctx: Context, items: list[Work]) -> dict[str, int]:
    """Items each stage will see for ``items``, from the plan (before any answer: a Bad the
    perturbation or the judge drops never reaches the later stages, so those may see fewer)."""
    out = dict.fromkeys(UNIT_FIELDS, 0)
    for w in items:
        if w.failed_run:  # only its real Bad: judged, then a rationale
            real = sum(1 for u in w.units if u.bad is not None)
            out["judge"] += real
            out["rationale"] += real
            continue
        out["history"] += ctx.history_pairs.get(w.id, len(w.units) - 1)
        for k in range(len(w.units)):
            if unplanned_reason(ctx.plan, w, k) is not None:
                continue
            out["transitions"] += 1
            plan = ctx.plan[sample_id(w.id, k)]
            bads = plan.dimension is not None
            out["perturb"] += bads
            out["judge"] += bads
            out["rationale"] += bads + (plan.good and plan.repeat_of is None)
    return out


class StreamedStages:
    """The five annotation stages as one flow per trajectory (``Executor.run_shard``'s
    ``flow``)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.transitions = TransitionsStep(ctx)
        self.history = HistoryStep(ctx)
        self.perturb = PerturbStep(ctx)
        self.judge = JudgeStep(ctx)
        self.rationale = RationaleStep(ctx)

    def run(self, items: list[Work], stats: dict[str, StageStats]) -> list[Work]:
        """Run the stages named in ``stats`` (the unfinished ones) over ``items``."""
        with stage_bars(stats, planned_items(self.ctx, items)):
            self.ctx.loop.run(self._shard(items, stats))
        return items

    def view(self, item: Work, later: list[str]) -> Work:
        """The item as it leaves a stage: without what the ``later`` stages wrote."""
        cleared = dict.fromkeys((f for name in later for f in UNIT_FIELDS.get(name, ())), None)
        units = [dataclasses.replace(u, **cleared) for u in item.units]
        return dataclasses.replace(item, units=units)

    async def _shard(self, items: list[Work], stats: dict[str, StageStats]) -> None:
        # Trajectories enter a window as wide as the annotator's jobs in flight: each brings
        # several requests at once, so the request slots stay full, while the prompts of the
        # whole shard are never built (and held) before the first request goes out.
        window = asyncio.Semaphore(max(1, self.ctx.annotator.jobs_in_flight))

        async def one(work: Work) -> None:
            async with window:
                await self._trajectory(work, stats)

        # A failure in one trajectory stops the others before it is raised: nothing keeps
        # changing the items and counters while the caller unwinds.
        tasks = [asyncio.ensure_future(one(w)) for w in items]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _trajectory(self, work: Work, stats: dict[str, StageStats]) -> None:
        jobs = [self._step(work, k, stats) for k in range(len(work.units))]
        if "history" in stats:
            jobs.append(self.history.chain(work, stats["history"]))
        await asyncio.gather(*jobs)

    async def _step(self, work: Work, k: int, stats: dict[str, StageStats]) -> None:
        for name, stage in (
            ("transitions", self.transitions),
            ("perturb", self.perturb),
            ("judge", self.judge),
            ("rationale", self.rationale),
        ):
            if name in stats:
                await stage.step(work, k, stats[name])
