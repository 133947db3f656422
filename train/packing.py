"""Bin-packing of samples into padding-free rows of at most ``budget`` LLM tokens.

Pure Python over token lengths, so the plan is cheap, deterministic and identical on every rank.
Samples longer than the budget are rejected and counted as
``too_long``; nothing is ever truncated, because a cut inside an image run breaks the
feature/token match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class PackPlan:
    """The packs of one epoch, as lists of sample indices, plus what was left out and why."""

    packs: list[list[int]]
    """Each pack is a list of sample indices in the order they are concatenated."""
    too_long: list[int] = field(default_factory=list)
    """Samples whose length alone exceeds the budget (dropped, never truncated)."""
    budget: int = 0
    """Token budget per pack."""
    tokens: int = 0
    """Total tokens of the packed samples."""

    @property
    def fill(self) -> float:
        """Mean fraction of the budget each pack uses (1.0 = every row full)."""
        return self.tokens / (len(self.packs) * self.budget) if self.packs else 0.0

    @property
    def num_samples(self) -> int:
        """Samples placed in packs."""
        return sum(len(p) for p in self.packs)


def plan_packs(
    lengths: Sequence[int],
    budget: int,
    *,
    order: Sequence[int] | None = None,
    strategy: str = "best_fit",
    max_per_pack: int = 0,
    window: int = 1024,
) -> PackPlan:
    """Group samples into packs whose summed length is at most ``budget``.

    Args:
        lengths: Token length of every sample (text + visual tokens).
        budget: Maximum tokens per pack.
        order: Sample indices in visiting order (a seeded shuffle); default ``0..n-1``.
        strategy: ``best_fit``: best-fit-decreasing within consecutive windows of ``window``
            samples (tight packs, order kept across windows); ``first_fit``: each sample goes to
            the first open pack of the window with room, samples keep their visiting order.
        max_per_pack: Upper bound on samples per pack (0 = none).
        window: Samples planned together; bounds memory and keeps the shuffle's mixing.

    Returns:
        A ``PackPlan``; every index of ``order`` is either in a pack or in ``too_long``.

    Raises:
        ValueError: Non-positive budget/window or an unknown strategy.
    """
    if budget <= 0 or window <= 0:
        raise ValueError("budget and window must be positive")
    if strategy not in ("best_fit", "first_fit"):
        raise ValueError(f"unknown packing strategy {strategy!r}")
    order = list(range(len(lengths))) if order is None else list(order)
    cap = max_per_pack if max_per_pack > 0 else len(order) + 1
    plan = PackPlan(packs=[], budget=budget)
    for start in range(0, len(order), window):
        chunk = []
        for i in order[start : start + window]:
            if lengths[i] > budget:
                plan.too_long.append(i)
            else:
                chunk.append(i)
        if strategy == "best_fit":
            # Stable sort: ties keep their shuffled order, so the plan is reproducible.
            chunk.sort(key=lambda i: -lengths[i])
        plan.packs.extend(_fill(chunk, lengths, budget, cap, best=strategy == "best_fit"))
    plan.tokens = sum(lengths[i] for p in plan.packs for i in p)
    return plan


def _fill(
    items: list[int], lengths: Sequence[int], budget: int, cap: int, *, best: bool
) -> list[list[int]]:
    packs: list[list[int]] = []
    room: list[int] = []
    for i in items:
        n = lengths[i]
        fits = [k for k in range(len(packs)) if room[k] >= n and len(packs[k]) < cap]
        if not fits:
            packs.append([i])
            room.append(budget - n)
            continue
        # Best fit: the pack left with the least room; first fit: the oldest pack with room.
        k = min(fits, key=lambda j: (room[j], j)) if best else fits[0]
        packs[k].append(i)
        room[k] -= n
    return packs


def pad_to_longest_efficiency(lengths: Sequence[int], batch_size: int) -> float:
    """Real tokens / allocated tokens when consecutive batches are padded to their longest.

    This is the cost model of the original release (batch 2, pad to longest), used as the
    baseline the packer is benchmarked against.
    """
    real = allocated = 0
    for start in range(0, len(lengths), batch_size):
        batch = lengths[start : start + batch_size]
        real += sum(batch)
        allocated += max(batch) * len(batch)
    return real / allocated if allocated else 0.0


def group_into_steps(num_packs: int, world: int, packs_per_rank: int) -> list[list[list[int]]]:
    """Assign packs to optimizer steps and ranks: ``steps[s][rank]`` lists pack indices.

    Pack ``j`` of a step goes to rank ``j % world`` so ranks see disjoint packs and the union
    over ranks is the same whatever ``world`` is. A trailing partial step is dropped (its packs
    are counted by the caller) so every step has the same number of micro-batches on every rank,
    which DeepSpeed's accumulation boundary requires.
    """
    per_step = world * packs_per_rank
    steps = []
    for start in range(0, num_packs - per_step + 1, per_step):
        ids = list(range(start, start + per_step))
        steps.append([ids[r::world] for r in range(world)])
    return steps
