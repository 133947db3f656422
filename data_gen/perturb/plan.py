"""The corpus-wide plan: which dimension each step's Bad sample gets, and which samples are masked.

The plan is a pure function of the trajectories, the element sidecar, the config and the run
seed, so every shard computes the same plan (cheaply: no annotator calls) and takes its own rows.
Doing the assignment globally is what lets a target distribution hold even for dimensions that
only a few steps can express (a sign flip needs a scroll): steps with the fewest options are
assigned first, each to the eligible dimension furthest below its target.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from data_gen.executor import sample_seed, unit_float
from data_gen.perturb.base import StepView
from data_gen.perturb.programmatic import PROGRAMMATIC, GenParams
from data_gen.perturb.semantic import ANNOTATOR_DIMENSIONS, DRAFTERS
from hivig.logging import get_logger

log = get_logger(__name__)


class UnreachableDimensionError(ValueError):
    """Dimensions with a positive target weight that no step of the corpus can express."""

    def __init__(self, dimensions: list[str]) -> None:
        super().__init__(
            "no step of this corpus can express: "
            + ", ".join(dimensions)
            + " (element-based dimensions need element boxes: an elements sidecar or grounding);"
            " give them weight 0, or set perturb.unreachable_dimension=warn to plan the others"
        )
        self.dimensions = dimensions


@dataclass(frozen=True)
class StepPlan:
    """What the pipeline will do with one step's critique samples.

    Attributes:
        critique: False when platform balancing leaves the step out of the critique task.
        dimension: Planned Bad dimension; ``None`` means Good only.
        good_masked: The Good sample hides the intent.
        bad_masked: The Bad sample hides the intent (never for dimensions that need it).
    """

    critique: bool
    dimension: str | None
    good_masked: bool
    bad_masked: bool


def generator_rng(seed: int, sample_id: str, dimension: str) -> random.Random:
    """The RNG a generator gets for one sample and dimension (planning and generation agree)."""
    return random.Random(sample_seed(seed, sample_id, f"perturb:{dimension}"))


def eligible_dimensions(view: StepView, seed: int, params: GenParams, offline: bool) -> list[str]:
    """Dimensions this step can honestly express.

    Programmatic dimensions ask their generator. Annotator dimensions are open to any step when a
    model writes them; the offline annotator can only write what its drafter can construct.
    """
    out = [
        dim
        for dim, gen in PROGRAMMATIC.items()
        if gen(view, generator_rng(seed, view.sample_id, dim), params) is not None
    ]
    for dim in ANNOTATOR_DIMENSIONS:
        if not offline or DRAFTERS[dim](view, generator_rng(seed, view.sample_id, dim)) is not None:
            out.append(dim)
    return out


def target_shares(weights: Mapping[str, float], min_share: float) -> dict[str, float]:
    """Normalised shares with every positive-weight dimension lifted to at least ``min_share``."""
    positive = {d: w for d, w in weights.items() if w > 0}
    if not positive:
        return {}
    floored: set[str] = set()
    while True:
        free = 1.0 - min_share * len(floored)
        rest = {d: w for d, w in positive.items() if d not in floored}
        total = sum(rest.values())
        shares = {d: free * w / total for d, w in rest.items()}
        low = {d for d, s in shares.items() if s < min_share}
        if not low:
            return {**shares, **{d: min_share for d in floored}}
        floored |= low


def _platform_keep(views: list[StepView], weights: Mapping[str, float]) -> dict[str, float]:
    natural = Counter(v.platform for v in views)
    if not weights:
        return dict.fromkeys(natural, 1.0)
    total_w = sum(weights.get(p, 0.0) for p in natural) or 1.0
    n = len(views)
    ratio = {p: (weights.get(p, 0.0) / total_w) / (natural[p] / n) for p in natural}
    top = max(ratio.values()) or 1.0
    return {p: r / top for p, r in ratio.items()}


def plan_corpus(
    views: Iterable[StepView],
    *,
    seed: int,
    params: GenParams,
    offline: bool,
    dimension_weights: Mapping[str, float],
    min_share: float,
    bad_share: float,
    platform_weights: Mapping[str, float],
    intent_mask_rate: float,
    maskable: Mapping[str, bool],
    unreachable: str = "warn",
) -> dict[str, StepPlan]:
    """Plan every critique step of the corpus.

    Args:
        views: One view per critique step (all shards).
        seed: Run seed.
        params: Generator knobs.
        offline: Whether the offline annotator writes the annotator dimensions.
        dimension_weights: Target distribution over dimensions (relative weights).
        min_share: Floor on each dimension's share.
        bad_share: Share of steps that get a Bad sample.
        platform_weights: Target platform mix (empty keeps the natural mix).
        intent_mask_rate: Share of all critique samples whose intent is hidden.
        maskable: Per dimension, whether its samples may be masked.
        unreachable: ``error`` raises when a positive-weight dimension has no eligible step;
            ``warn`` logs it.

    Returns:
        ``{sample_id: StepPlan}``.

    Raises:
        UnreachableDimensionError: ``unreachable`` is ``error`` and a dimension with positive
            weight has no eligible step.
    """
    views = sorted(views, key=lambda v: v.sample_id)
    keep_rate = _platform_keep(views, platform_weights)
    kept = [v for v in views if unit_float(seed, v.sample_id, "platform") < keep_rate[v.platform]]
    with_bad = [v for v in kept if unit_float(seed, v.sample_id, "bad_share") < bad_share]
    shares = target_shares(dimension_weights, min_share)
    assigned = _assign(with_bad, shares, seed, params, offline, unreachable)
    masked = _masking(kept, assigned, seed, intent_mask_rate, maskable)
    kept_ids = {v.sample_id for v in kept}
    plan: dict[str, StepPlan] = {}
    for v in views:
        sid = v.sample_id
        dim = assigned.get(sid)
        plan[sid] = StepPlan(
            critique=sid in kept_ids,
            dimension=dim,
            good_masked=f"{sid}:good" in masked,
            bad_masked=dim is not None and f"{sid}:bad" in masked,
        )
    return plan


def _assign(
    views: list[StepView],
    shares: Mapping[str, float],
    seed: int,
    params: GenParams,
    offline: bool,
    unreachable: str,
) -> dict[str, str]:
    options = {
        v.sample_id: [d for d in eligible_dimensions(v, seed, params, offline) if d in shares]
        for v in views
    }
    reachable = {d for opts in options.values() for d in opts}
    missing = [d for d in shares if d not in reachable]
    if missing and unreachable == "error":
        raise UnreachableDimensionError(missing)
    order = sorted(options, key=lambda s: (len(options[s]), sample_seed(seed, s, "assign_order")))
    total = sum(1 for s in order if options[s])
    target = {d: s * total for d, s in shares.items()}
    counts: Counter[str] = Counter()
    out: dict[str, str] = {}
    for sid in order:
        if not options[sid]:
            continue
        # Largest relative deficit first; the per-sample hash breaks ties reproducibly.
        best = max(
            options[sid],
            key=lambda d: ((target[d] - counts[d]) / target[d], sample_seed(seed, sid, d)),
        )
        out[sid] = best
        counts[best] += 1
    missing = [d for d in shares if counts[d] == 0]
    if missing:
        log.warning("no step of this corpus can express: %s", ", ".join(missing))
    return out


def _masking(
    views: list[StepView],
    assigned: Mapping[str, str],
    seed: int,
    rate: float,
    maskable: Mapping[str, bool],
) -> set[str]:
    samples = [f"{v.sample_id}:good" for v in views]
    samples += [f"{v.sample_id}:bad" for v in views if v.sample_id in assigned]
    allowed = [
        s
        for s in samples
        if s.endswith(":good") or maskable.get(assigned[s.rsplit(":", 1)[0]], False)
    ]
    quota = round(rate * len(samples))
    if quota > len(allowed):
        log.warning(
            "intent mask rate %.2f unreachable: only %d of %d samples are maskable",
            rate,
            len(allowed),
            len(samples),
        )
    ranked = sorted(allowed, key=lambda s: sample_seed(seed, s, "intent_mask"))
    return set(ranked[:quota])
