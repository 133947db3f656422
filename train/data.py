"""From data_gen's SFT records to packed micro-batches, per rank and resumable.

Flow: records (``<data>/dataset/records/<split>/*.parquet``, data_gen's layout) →
history/critique mix → per-sample encoding (canonical frames with markers via ``hivig.vision``,
tokens/labels/positions via ``hivig.models.qwen_vl``) → token lengths → seeded order → pack plan
→ optimizer steps × ranks → a ``DataLoader`` whose workers encode and collate whole packs.

The plan is a pure function of (lengths, seed, epoch, world, accumulation), so every rank computes
the same plan and takes its own packs, and a resumed run skips exactly the steps already done.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from hivig.distributed import rank_and_world
from hivig.logging import get_logger
from train.collate import IGNORE_INDEX, PackedBatch, collate_pack
from train.packing import group_into_steps, plan_packs

log = get_logger(__name__)

Encoder = Callable[[Any], Any]


def _identity(x: Any) -> Any:
    # Module-level (not a lambda) so worker processes can unpickle it under any start method.
    return x


@dataclass
class Sample:
    """One training sample before encoding: its id, kind and what the encoder needs."""

    id: str
    """Stable sample id (from the record)."""
    kind: str
    """``history`` or ``critique``."""
    payload: Any
    """The record (or, in tests, a ready message list) handed to the encoder."""


@dataclass
class Quarantine:
    """Samples that could not be encoded, with the reason; written next to the run's outputs."""

    entries: list[dict[str, str]] = field(default_factory=list)
    """``{"id": ..., "reason": ..., "message": ...}`` per sample."""

    def add(self, sample_id: str, reason: str, message: str) -> None:
        """Record one excluded sample."""
        self.entries.append({"id": sample_id, "reason": reason, "message": message})

    def write(self, path: str | Path) -> None:
        """Write JSONL (one entry per line); nothing is written when empty."""
        if self.entries:
            lines = "".join(json.dumps(e) + "\n" for e in self.entries)
            Path(path).write_text(lines, encoding="utf-8")

    def counts(self) -> dict[str, int]:
        """``dropped_<reason>`` counters."""
        out: dict[str, int] = {}
        for e in self.entries:
            out[f"dropped_{e['reason']}"] = out.get(f"dropped_{e['reason']}", 0) + 1
        return out


# ------------------------------------------------------------------------------------------------
# Records and mixing


def load_samples(data_dir: str | Path, split: str, max_samples: int = 0) -> list[Sample]:
    """Read ``<data_dir>/dataset/records/<split>`` as ``Sample``s (empty if the split is absent)."""
    from hivig.records import read_records, records_dir

    split_dir = records_dir(data_dir) / split
    if not split_dir.is_dir():
        return []
    samples = [Sample(id=str(r.id), kind=str(r.kind), payload=r) for r in read_records(split_dir)]
    return samples[:max_samples] if max_samples else samples


def mix_kinds(samples: Sequence[Sample], history_fraction: float, seed: int) -> list[Sample]:
    """Subsample the more abundant kind so history samples make up ``history_fraction``.

    ``-1`` keeps everything. The kind that limits the ratio is kept whole; the other is
    subsampled with a seeded RNG, and the original order is preserved.
    """
    if history_fraction < 0:
        return list(samples)
    hist = [i for i, s in enumerate(samples) if s.kind == "history"]
    crit = [i for i, s in enumerate(samples) if s.kind != "history"]
    f = history_fraction
    if f in (0.0, 1.0):
        keep = set(crit if f == 0.0 else hist)
    else:
        # Largest (h, c) with h <= |hist|, c <= |crit| and h / (h + c) = f.
        h = min(len(hist), int(len(crit) * f / (1 - f)))
        c = min(len(crit), int(h * (1 - f) / f)) if h else 0
        rng = random.Random(seed)
        keep = set(rng.sample(hist, h)) | set(rng.sample(crit, c))
    return [s for i, s in enumerate(samples) if i in keep]


# ------------------------------------------------------------------------------------------------
# Encoding and lengths


def _counts(encoded: Any) -> tuple[int, int]:
    """(tokens, supervised labels) of an encoded sample."""
    get = encoded.get if isinstance(encoded, dict) else lambda k: getattr(encoded, k)
    labels = torch.as_tensor(get("labels"))
    return int(torch.as_tensor(get("input_ids")).numel()), int((labels != IGNORE_INDEX).sum())


class _EncodeDataset(Dataset):
    def __init__(self, samples: Sequence[Sample], encoder: Encoder):
        self.samples, self.encoder = samples, encoder

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[int, int, int, str, str]:
        s = self.samples[i]
        try:
            return i, *_counts(self.encoder(s.payload)), "", ""
        except (ValueError, OSError, KeyError, TypeError) as e:
            # Bad records become quarantine entries with the reason, never a crash.
            return i, -1, 0, getattr(e, "reason", type(e).__name__), str(e)[:500]


def compute_token_counts(
    samples: Sequence[Sample], encoder: Encoder, quarantine: Quarantine, num_workers: int = 0
) -> tuple[list[int], list[int]]:
    """Token length and supervised-label count of every sample.

    Encodes each sample once with the same encoder training uses, so the packer's lengths are
    exact and the loss normaliser ``N`` of every step is known
    from the plan. A sample that fails to encode gets length -1 and a quarantine entry.
    """
    lengths, supervised = [-1] * len(samples), [0] * len(samples)
    loader = DataLoader(
        _EncodeDataset(samples, encoder),
        batch_size=None,
        num_workers=num_workers,
        collate_fn=_identity,
        generator=torch.Generator(),  # leaves the global RNG stream alone
    )
    for i, n, sup, reason, message in loader:
        lengths[i], supervised[i] = n, sup
        if n < 0:
            quarantine.add(samples[i].id, reason, message)
    return lengths, supervised


def compute_lengths(
    samples: Sequence[Sample], encoder: Encoder, quarantine: Quarantine, num_workers: int = 0
) -> list[int]:
    """Token length of every sample (-1 for a quarantined one); see ``compute_token_counts``."""
    return compute_token_counts(samples, encoder, quarantine, num_workers)[0]


def lengths_key(samples: Sequence[Sample], *context: Any) -> str:
    """Content hash of the samples (ids, prompts, images, marks, targets) and encoding settings."""
    h = hashlib.sha256()
    for part in (*context, *(repr(s.payload) for s in samples)):
        h.update(repr(part).encode("utf-8"))
    return h.hexdigest()


def load_cached_lengths(path: str | Path, key: str) -> dict[str, Any] | None:
    """The cached ``{"lengths", "eval_lengths", "quarantine"}`` if written for ``key``, else None.

    Encoding every sample for its length costs minutes on a large set; a restarted job reuses
    the numbers as long as the data and the frame are unchanged.
    """
    path = Path(path)
    if not path.is_file():
        return None
    cached = json.loads(path.read_text(encoding="utf-8"))
    return cached if cached.get("key") == key else None


def save_cached_lengths(path: str | Path, key: str, payload: dict[str, Any]) -> None:
    """Write the length cache atomically (temp file + rename)."""
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, **payload}), encoding="utf-8")
    tmp.replace(path)


def _sharded_counts(
    samples: list[Sample], encoder: Encoder, quarantine: Quarantine, workers: int
) -> tuple[list[int], list[int]]:
    """Each rank encodes a 1/W slice; counts (and quarantine entries) are gathered on all ranks."""
    rank, world = rank_and_world()
    mine = list(range(rank, len(samples), world))
    local = Quarantine()
    lens, sups = compute_token_counts([samples[i] for i in mine], encoder, local, workers)
    parts = [(mine, lens, sups, local.entries)]
    if world > 1 and dist.is_initialized():
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, parts[0])
        parts = gathered
    lengths, supervised = [-1] * len(samples), [0] * len(samples)
    for idx, part_lens, part_sups, entries in parts:
        for i, n, sup in zip(idx, part_lens, part_sups, strict=True):
            lengths[i], supervised[i] = n, sup
        quarantine.entries.extend(entries)
    return lengths, supervised


@dataclass
class TokenCounts:
    """Per-sample token counts of both splits; -1 length marks a quarantined sample."""

    lengths: list[int]
    """Training sample lengths, in tokens."""
    supervised: list[int]
    """Supervised labels per training sample (the loss normaliser's summands)."""
    eval_lengths: list[int]
    """Held-out sample lengths, in tokens."""
    quarantine: Quarantine
    """Samples of either split that failed to encode."""


def token_counts(
    samples: list[Sample],
    eval_samples: list[Sample],
    encoder: Encoder,
    *,
    cache: Path,
    key_context: tuple[Any, ...],
    workers: int,
) -> TokenCounts:
    """Token counts of both splits, from the cache or computed by all ranks together."""
    key = lengths_key([*samples, *eval_samples], *key_context)
    cached = load_cached_lengths(cache, key)
    if cached is not None:
        quarantine = Quarantine(list(cached["quarantine"]))
        return TokenCounts(
            cached["lengths"], cached["supervised"], cached["eval_lengths"], quarantine
        )
    quarantine = Quarantine()
    lengths, supervised = _sharded_counts(samples, encoder, quarantine, workers)
    eval_lengths, _ = _sharded_counts(eval_samples, encoder, quarantine, workers)
    counts = TokenCounts(lengths, supervised, eval_lengths, quarantine)
    if rank_and_world()[0] == 0:
        cache.parent.mkdir(parents=True, exist_ok=True)
        found = {
            "lengths": lengths,
            "supervised": supervised,
            "eval_lengths": eval_lengths,
            "quarantine": quarantine.entries,
        }
        save_cached_lengths(cache, key, found)
    return counts


# ------------------------------------------------------------------------------------------------
# Plans


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """Visiting order of one epoch; identical on every rank for a given (seed, epoch)."""
    order = list(range(n))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order


@dataclass
class EpochPlan:
    """The packs of one epoch and their assignment to optimizer steps and ranks."""

    packs: list[list[int]]
    """Sample indices per pack."""
    steps: list[list[list[int]]]
    """``steps[s][rank]`` = pack indices of that rank's micro-batches in step ``s``."""
    counts: dict[str, int]
    """``packs``, ``samples``, ``dropped_too_long``, ``dropped_partial_step``, ``fill_permille``."""
    too_long: list[int] = field(default_factory=list)
    """Samples longer than the budget (dropped, never truncated)."""


def plan_fingerprint(plan: EpochPlan) -> str:
    """Hash of the packs and their step/rank assignment: what a saved data position refers to."""
    blob = json.dumps([plan.packs, plan.steps], separators=(",", ":"))
    return hashlib.sha256(blob.encode("ascii")).hexdigest()[:16]


def quarantine_too_long(
    quarantine: Quarantine,
    samples: Sequence[Sample],
    lengths: Sequence[int],
    plan: EpochPlan,
    budget: int,
) -> None:
    """Record every over-budget sample of ``plan`` by id, with reason ``too_long``."""
    for i in plan.too_long:
        quarantine.add(
            samples[i].id, "too_long", f"{lengths[i]} tokens > dataset.token_budget {budget}"
        )


def derive_grad_accum(
    mean_samples_per_pack: float, world: int, global_batch_samples: int, grad_accum: int
) -> int:
    """Packs per rank per step: explicit, or enough to reach ``global_batch_samples``."""
    if grad_accum > 0:
        return grad_accum
    per_step = max(mean_samples_per_pack, 1e-9) * world
    return max(1, round(global_batch_samples / per_step))


def plan_epoch(
    lengths: Sequence[int],
    *,
    budget: int,
    seed: int,
    epoch: int,
    world: int,
    grad_accum: int,
    shuffle: bool = True,
    strategy: str = "best_fit",
    max_per_pack: int = 0,
    window: int = 1024,
) -> EpochPlan:
    """Pack one epoch and split it into ``grad_accum`` packs per rank per step.

    Samples with a negative length (quarantined) are skipped; over-budget ones are dropped and
    counted as ``too_long``; packs that do not fill a whole last step are counted as
    ``dropped_partial_step``.
    """
    order = [i for i in epoch_order(len(lengths), seed, epoch, shuffle) if lengths[i] >= 0]
    plan = plan_packs(
        lengths, budget, order=order, strategy=strategy, max_per_pack=max_per_pack, window=window
    )
    steps = group_into_steps(len(plan.packs), world, grad_accum)
    used = len(steps) * world * grad_accum
    counts = {
        "packs": len(plan.packs),
        "samples": plan.num_samples,
        "dropped_too_long": len(plan.too_long),
        "dropped_partial_step": sum(len(p) for p in plan.packs[used:]),
        "fill_permille": int(1000 * plan.fill),
    }
    return EpochPlan(packs=plan.packs, steps=steps, counts=counts, too_long=list(plan.too_long))


# ------------------------------------------------------------------------------------------------
# Loading


class PackDataset(Dataset):
    """Item ``k`` = the ``k``-th micro-batch of this rank: its samples encoded and collated."""

    def __init__(
        self,
        samples: Sequence[Sample],
        packs: Sequence[Sequence[int]],
        encoder: Encoder,
        pixel_dtype: torch.dtype | None = None,
    ):
        self.samples, self.packs, self.encoder = samples, list(packs), encoder
        self.pixel_dtype = pixel_dtype

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, k: int) -> PackedBatch:
        chosen = [self.samples[i] for i in self.packs[k]]
        encoded = []
        for s in chosen:
            e = self.encoder(s.payload)
            if isinstance(e, dict):
                e = {**e, "kind": s.kind}
            else:
                e.kind = s.kind
            encoded.append(e)
        return collate_pack(encoded, [s.id for s in chosen], self.pixel_dtype)


def step_supervised(plan: EpochPlan, step: int, supervised: Sequence[int]) -> tuple[int, list[int]]:
    """Supervised tokens of optimizer step ``step``: all ranks together and per rank.

    Known from the plan on every rank, so the normaliser ``N`` needs no collective and the
    micro-batches can stream through the loader instead of being fetched up front.
    """
    per_rank = [
        sum(supervised[i] for j in packs for i in plan.packs[j]) for packs in plan.steps[step]
    ]
    return sum(per_rank), per_rank


def rank_packs(plan: EpochPlan, rank: int, start_step: int) -> list[list[int]]:
    """This rank's packs from ``start_step`` on, flattened in micro-step order."""
    return [plan.packs[j] for step in plan.steps[start_step:] for j in step[rank]]


def build_loader(
    samples: Sequence[Sample],
    packs: Sequence[Sequence[int]],
    encoder: Encoder,
    *,
    num_workers: int,
    prefetch_factor: int,
    pin_memory: bool,
    seed: int = 0,
    pixel_dtype: torch.dtype | None = None,
) -> DataLoader:
    """A loader yielding ``PackedBatch``es in plan order; workers encode whole packs.

    The loader draws its workers' base seed from its own generator seeded with ``seed``, never
    from the global torch RNG: creating an iterator must not move the RNG stream a resumed run
    has just restored (dropout masks would differ from the uninterrupted run). Torch seeds each
    worker's ``random``, ``numpy`` and ``torch`` from that base seed and the worker id.
    ``pixel_dtype`` is the vision tower's dtype (``collate_pack``).
    """
    generator = torch.Generator()
    generator.manual_seed(seed)
    extra: dict[str, Any] = {}
    if num_workers > 0:
        extra["prefetch_factor"] = prefetch_factor
    return DataLoader(
        PackDataset(samples, packs, encoder, pixel_dtype),
        batch_size=None,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=pin_memory,
        collate_fn=_identity,
        generator=generator,
        **extra,
    )
