"""The corpus-wide plan: which dimension each step's Bad sample gets, and which samples are masked.

The plan is a pure function of the trajectories, the element sidecar, the config and the run
seed, so every shard computes the same plan (cheaply: no annotator calls) and takes its own rows.
Doing the assignment globally is what lets a target distribution hold even for dimensions that
only a few steps can express (a sign flip needs a scroll): steps with the fewest options are
assigned first, each to the eligible dimension furthest below its target.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from data_gen.executor import sample_seed, unit_float
from data_gen.perturb.base import BadStep, StepView
from data_gen.perturb.programmatic import PROGRAMMATIC, GenParams
from data_gen.perturb.properties import violation
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
        good: The step's Good sample is part of the Good:Bad ratio (Goods of steps with a Bad
            first, so pairs stay together).
        repeat_of: The step is the same step (same screenshot, intent and calls) as this
            earlier one of another instruction variant; it gets no critique samples, Good or
            Bad, so de-duplication keeps pairs whole.
        candidates: For an annotator-family dimension, every dimension feasible at the step
            (either family), by the target distribution's deficit (``dimension`` first): the
            annotator picks the most plausible error among them. Empty for programmatic
            dimensions, which are constructed exactly.
    """

    critique: bool
    dimension: str | None
    good_masked: bool
    bad_masked: bool
    good: bool = True
    candidates: tuple[str, ...] = ()
    repeat_of: str | None = None


def generator_rng(seed: int, sample_id: str, dimension: str) -> random.Random:
    """The RNG a generator gets for one sample and dimension (planning and generation agree)."""
    return random.Random(sample_seed(seed, sample_id, f"perturb:{dimension}"))


def eligible_dimensions(view: StepView, seed: int, params: GenParams, offline: bool) -> list[str]:
    """Dimensions this step can honestly express.

    Programmatic dimensions ask their generator. Annotator dimensions are open to any step when a
    model writes them; the offline annotator can only write what its drafter can construct.
    """
    out = []
    for dim, gen in PROGRAMMATIC.items():
        bad = gen(view, generator_rng(seed, view.sample_id, dim), params)
        if bad is not None and violation(view, bad) is None:
            out.append(dim)
    for dim in ANNOTATOR_DIMENSIONS:
        if not offline:
            out.append(dim)
            continue
        draft = DRAFTERS[dim](view, generator_rng(seed, view.sample_id, dim))
        if draft is not None and violation(view, draft_step(dim, view, draft)) is None:
            out.append(dim)
    return out


def draft_step(dimension: str, view: StepView, draft: tuple) -> BadStep:
    """The ``BadStep`` an offline draft becomes (for its property check before planning)."""
    intent, calls, _, note = draft
    return BadStep(dimension, "annotator", "annotator", intent, "", tuple(calls), note=note)


def wordless(view: StepView, dimension: str, seed: int, params: GenParams) -> bool:
    """Whether the planned Bad step has no intent (its pair is shown as tool calls only)."""
    gen = PROGRAMMATIC.get(dimension)
    if gen is None:
        return False
    bad = gen(view, generator_rng(seed, view.sample_id, dimension), params)
    return bad is not None and not bad.intent.strip()


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


def repeated_steps(views: Iterable[StepView]) -> dict[str, str]:
    """``{sample id: kept sample id}`` for steps repeating an earlier one exactly.

    Instruction variants of an episode share screenshots and often whole steps; a critique
    pair of the same screenshot and step is one sample for the critic whatever the task's
    wording, so only the smallest sample id of each group is planned (Good and Bad alike).
    """
    first: dict[tuple[Any, ...], str] = {}
    out: dict[str, str] = {}
    for v in sorted(views, key=lambda v: v.sample_id):
        key = (v.screenshot, v.intent, repr(v.calls))
        if not v.screenshot:
            continue
        if key in first:
            out[v.sample_id] = first[key]
        else:
            first[key] = v.sample_id
    return out


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
    max_ratio: float = float("inf"),
    good_bad_ratio: float = 0.0,
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
        max_ratio: No dimension above this multiple of its target share (surplus steps get
            no Bad, or another feasible dimension with room).
        good_bad_ratio: Good samples per Bad sample (0 keeps every Good).

    Returns:
        ``{sample_id: StepPlan}``.

    Raises:
        UnreachableDimensionError: ``unreachable`` is ``error`` and a dimension with positive
            weight has no eligible step.
    """
    views = sorted(views, key=lambda v: v.sample_id)
    repeats = repeated_steps(views)
    keep_rate = _platform_keep(views, platform_weights)
    kept = [
        v
        for v in views
        if v.sample_id not in repeats
        and unit_float(seed, v.sample_id, "platform") < keep_rate[v.platform]
    ]
    with_bad = [v for v in kept if unit_float(seed, v.sample_id, "bad_share") < bad_share]
    shares = target_shares(dimension_weights, min_share)
    assigned, options = _assign(with_bad, shares, seed, params, offline, unreachable, max_ratio)
    goods = _goods(kept, assigned, seed, good_bad_ratio)
    by_id = {v.sample_id: v for v in kept}
    forced = {s for s, d in assigned.items() if wordless(by_id[s], d, seed, params)}
    masked = _masking(kept, assigned, goods, forced, seed, intent_mask_rate, maskable)
    counts = Counter(assigned.values())
    total = max(1, sum(counts.values()))
    kept_ids = {v.sample_id for v in kept}
    plan: dict[str, StepPlan] = {}
    for v in views:
        sid = v.sample_id
        dim = assigned.get(sid)
        candidates: tuple[str, ...] = ()
        if dim in ANNOTATOR_DIMENSIONS:
            # Every dimension feasible here, programmatic ones included (the authors' annotator
            # is shown several and picks the most plausible): the model's pick is checked
            # against that dimension's property like any other Bad.
            others = [
                d
                for d in options.get(sid, [])
                # A masked step hides the intent: only dimensions that survive masking.
                if d != dim and (sid not in masked or maskable.get(d, False))
            ]
            # By deficit against the final counts: the least served dimension first.
            others.sort(key=lambda d: counts[d] / total - shares.get(d, 0.0))
            candidates = (dim, *others)
        plan[sid] = StepPlan(
            critique=sid in kept_ids,
            repeat_of=repeats.get(sid),
            dimension=dim,
            good_masked=sid in masked,
            bad_masked=dim is not None and sid in masked,
            good=sid in goods,
            candidates=candidates,
        )
    return plan


def _assign(
    views: list[StepView],
    shares: Mapping[str, float],
    seed: int,
    params: GenParams,
    offline: bool,
    unreachable: str,
    max_ratio: float = float("inf"),
) -> tuple[dict[str, str], dict[str, list[str]]]:
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
    # The caps hold among the dimensions the corpus can express at all: a dimension with no
    # step is reported (above), and its share goes to the others rather than shrinking all.
    mass = sum(s for d, s in shares.items() if d in reachable) or 1.0
    shares = {d: s / mass for d, s in shares.items() if d in reachable}
    target = {d: s * total for d, s in shares.items()}
    platform = {v.sample_id: v.platform for v in views}
    counts: Counter[str] = Counter()
    filled: Counter[tuple[str, str]] = Counter()
    out: dict[str, str] = {}
    for sid in order:
        if not options[sid]:
            continue
        p = platform[sid]
        # First a dimension this platform has no sample of yet (filled from the front of one
        # order, a rare dimension would otherwise go wholly to the platform whose steps have
        # the fewest options), then the largest relative deficit; the per-sample hash breaks
        # ties reproducibly.
        best = max(
            options[sid],
            key=lambda d, p=p, sid=sid: (
                filled[d, p] == 0,
                (target[d] - counts[d]) / target[d],
                sample_seed(seed, sid, d),
            ),
        )
        out[sid] = best
        counts[best] += 1
        filled[best, p] += 1
    _cap(out, options, shares, seed, max_ratio)
    counts = Counter(out.values())
    missing = [d for d in shares if counts[d] == 0]
    if missing:
        log.warning("no step of this corpus can express: %s", ", ".join(missing))
    return out, options


def _cap(
    out: dict[str, str],
    options: Mapping[str, list[str]],
    shares: Mapping[str, float],
    seed: int,
    max_ratio: float,
) -> None:
    """Bring every dimension to at most ``max_ratio`` times its share of the Bad samples.

    Steps that only a few dimensions can use pile onto those (every step can end too early;
    every call can be malformed). A surplus sample moves to another feasible dimension with
    room, or, when none has room, the step keeps only its Good sample. Removing samples lowers
    the total and with it every cap, so this repeats until no dimension is over.
    """
    if max_ratio == float("inf"):
        return
    by_dim: dict[str, list[str]] = {}
    for sid, d in sorted(out.items(), key=lambda kv: sample_seed(seed, kv[0], "cap")):
        by_dim.setdefault(d, []).append(sid)
    while True:
        n = sum(len(v) for v in by_dim.values())
        # At least one: on a small corpus one sample of a dimension is not "too many".
        cap = {d: max(1, math.floor(max_ratio * s * n + 1e-9)) for d, s in shares.items()}
        over = [d for d, sids in by_dim.items() if len(sids) > cap[d] + 1e-9]
        if not over:
            return
        worst = max(over, key=lambda d: (len(by_dim[d]) / max(cap[d], 1e-9), d))
        sid = by_dim[worst].pop()
        room = [
            e
            for e in options[sid]
            if e != worst and len(by_dim.get(e, [])) + 1 <= cap[e] and shares.get(e, 0) > 0
        ]
        if room:
            new = min(room, key=lambda e: (len(by_dim.get(e, [])) / cap[e], e))
            by_dim.setdefault(new, []).append(sid)
            out[sid] = new
        else:
            del out[sid]


def _goods(views: list[StepView], assigned: Mapping[str, str], seed: int, ratio: float) -> set[str]:
    """Steps whose Good sample is kept: ``ratio`` Goods per Bad, paired steps first."""
    ids = [v.sample_id for v in views]
    if ratio <= 0 or not assigned:
        return set(ids)  # no Bad to pair with: a ratio says nothing, every Good stays
    quota = round(ratio * len(assigned))
    ranked = sorted(ids, key=lambda s: (s not in assigned, sample_seed(seed, s, "good_keep")))
    return set(ranked[:quota])


def _masking(
    views: list[StepView],
    assigned: Mapping[str, str],
    goods: set[str],
    forced: set[str],
    seed: int,
    rate: float,
    maskable: Mapping[str, bool],
) -> set[str]:
    """Steps whose samples hide the intent, Good and Bad together.

    Masking is decided per step, never per sample, so it cannot correlate with the label:
    a step's Good and Bad are masked together or not at all. Steps whose Bad needs the intent
    are never masked; steps whose Bad has no words (``forced``) always are; the others are
    drawn by hash until ``rate`` of all critique samples are masked.
    """
    size = {
        v.sample_id: (v.sample_id in goods) + (v.sample_id in assigned)
        for v in views
        if v.sample_id in goods or v.sample_id in assigned
    }
    total = sum(size.values())
    masked = {s for s in forced if s in size}
    done = sum(size[s] for s in masked)
    quota = round(rate * total)
    allowed = [
        s
        for s in size
        if s not in masked and (s not in assigned or maskable.get(assigned[s], False))
    ]
    for s in sorted(allowed, key=lambda s: sample_seed(seed, s, "intent_mask")):
        if done >= quota:
            break
        masked.add(s)
        done += size[s]
    if done < quota:
        log.warning(
            "intent mask rate %.2f unreachable: only %d of %d samples are maskable",
            rate,
            done,
            total,
        )
    return masked
