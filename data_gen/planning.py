"""The corpus-wide plan of a run: which step gets which samples, checked before any request.

The plan is built from the whole corpus in every shard (``data_gen.perturb.plan_corpus``), so
all shards agree on it whatever the shard count; ``check_plan`` refuses one that already
misses the dimension distribution the export is held to, and ``plan_history`` caps the history
chains to what the export will keep.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from data_gen.config import DataGenConfig
from data_gen.export import chains_within, out_of_bounds
from data_gen.perturb import ElementIndex, GenParams, StepPlan, plan_corpus
from data_gen.perturb.plan import target_shares
from data_gen.steps.work import (
    Work,
    critique_candidate,
    note_expert_steps,
    sample_id,
    step_view,
)
from hivig.taxonomy import DIMENSIONS


def build_plan(
    cfg: DataGenConfig, works: list[Work], elements: ElementIndex, offline: bool
) -> dict[str, StepPlan]:
    """The corpus-wide perturbation and masking plan (identical in every shard).

    Records the corpus' expert steps in ``elements`` first (``note_expert_steps``: Visual
    Hallucination's layout-habit ghosts), so the views the stages build later from the same
    index are the ones planned here.
    """
    note_expert_steps(elements, works)
    # A failed run's only sample is its real Bad, which the plan neither perturbs nor pairs.
    views = [
        step_view(w.trajectory, k, elements)
        for w in works
        if not w.failed_run
        for k in range(len(w.trajectory.steps))
        if critique_candidate(w.trajectory, k)
    ]
    p = cfg.perturb
    plan = plan_corpus(
        views,
        seed=cfg.seed,
        params=gen_params(cfg),
        offline=offline,
        dimension_weights=p.weights_by_name(),
        min_share=p.min_share,
        bad_share=p.bad_share,
        platform_weights=p.platform_weights,
        intent_mask_rate=cfg.rationale.intent_mask_rate,
        maskable={d.name: d.maskable for d in DIMENSIONS},
        unreachable=p.unreachable_dimension,
        max_ratio=p.max_dimension_ratio,
        good_bad_ratio=p.good_bad_ratio,
    )
    return keep_hard_goods(plan, works)


class PlanOffTargetError(ValueError):
    """The plan itself misses the dimension distribution the export is held to."""


def check_plan(cfg: DataGenConfig, plan: dict[str, StepPlan], works: list[Work] = ()) -> None:
    """Refuse, before any request is paid for, a plan whose Bad samples already miss the
    distribution the export will be held to (``perturb.min_dimension_ratio`` and
    ``max_dimension_ratio`` times each target share, with ``unreachable_dimension=error``).

    Raises:
        PlanOffTargetError: Naming the dimensions, their planned and target shares, and the fix.
    """
    p = cfg.perturb
    if p.unreachable_dimension != "error":
        return
    counts = Counter(s.dimension for s in plan.values() if s.dimension is not None)
    # A failed run's real Bad is exported beside the planned ones (``data_gen.flywheel``).
    counts.update(
        u.bad.dimension for w in works if w.failed_run for u in w.units if u.bad is not None
    )
    total = sum(counts.values())
    targets = target_shares(p.weights_by_name(), p.min_share)
    rows = {
        d: {"target": round(t, 4), "achieved": round(counts[d] / total, 4) if total else 0.0}
        for d, t in targets.items()
    }
    off = out_of_bounds(rows, p.min_dimension_ratio, p.max_dimension_ratio)
    if off:
        raise PlanOffTargetError(
            "the plan already misses the dimension distribution, before any request ("
            + "; ".join(
                f"{d}: {r['achieved']:.3f} planned vs {r['target']:.3f}" for d, r in off.items()
            )
            + "); give those dimensions the weight this corpus can carry, or set "
            "perturb.unreachable_dimension=warn to accept it"
        )


def plan_history(
    cfg: DataGenConfig, works: list[Work], plan: dict[str, StepPlan]
) -> dict[str, int]:
    """Leading history pairs per trajectory that the export will keep, planned before any is
    paid for: ``export.history_critique_ratio`` times the planned critique samples, taken in
    whole chains as the export takes them (``data_gen.export.mix_surplus``). Identical in every
    shard (the plan is corpus-wide). Empty when the ratio is 0 (every pair is kept)."""
    ratio = cfg.export.history_critique_ratio
    if ratio <= 0:
        return {}
    critiques = sum(1 for w in works if w.failed_run) + sum(
        (p.good and p.repeat_of is None) + (p.dimension is not None)
        for p in plan.values()
        if p.critique
    )
    chains = {w.id: list(range(len(w.trajectory.steps) - 1)) for w in works if not w.failed_run}
    kept = chains_within(chains, round(ratio * critiques), cfg.seed)
    return {tid: len(kept.get(tid, ())) for tid in chains}


def keep_hard_goods(plan: dict[str, StepPlan], works: list[Work]) -> dict[str, StepPlan]:
    """The plan with the Good of every hard-case step of a successful run kept (the recorded
    critic called it Bad), whatever the Good:Bad ratio would have left out."""
    for w in works:
        for k in (w.origin.get("hard_cases") or {}) if not w.failed_run else ():
            sid = sample_id(w.id, int(k))
            step = plan.get(sid)
            if step is not None and step.critique and step.repeat_of is None and not step.good:
                plan[sid] = dataclasses.replace(step, good=True)
    return plan


def gen_params(cfg: DataGenConfig) -> GenParams:
    """Generator knobs from the config."""
    return GenParams(cfg.perturb.near_miss_margin, cfg.perturb.scroll_shrink)
