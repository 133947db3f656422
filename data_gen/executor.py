"""A small datatrove-style executor: sharded, atomic, resumable, and accounting for every record.

    python -m data_gen run --config configs/data_gen/demo.yaml corpus=C out=O  # all
    python -m data_gen run --config configs/data_gen/default.yaml corpus=C out=O --shard 3/16

Layout under ``out/``::

    work/<shard>/<stage>.jsonl          stage output of one shard (temp file + rename)
    exclusions/<shard>/<stage>.jsonl    dropped items with reason and raw annotator responses
    completions/<shard>/<stage>.json    completion marker with the stage counters

A marker is written only after its output and exclusions, so a marker always means "done"; a
rerun skips every (shard, stage) that has one. Shards split the corpus by a hash of the trajectory
id, and every random choice uses a seed derived from a sample id, so the merged output is the
same whatever the shard count.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from hivig.files import dumps_jsonl, loads_jsonl, write_atomic
from hivig.logging import get_logger

log = get_logger(__name__)

T = TypeVar("T")


class ShardError(ValueError):
    """A malformed ``--shard`` value."""


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count``: the trajectories whose id hashes to ``index`` mod ``count``."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ShardError(f"shard must be i/N with 0 <= i < N, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """Parse ``"i/N"``."""
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError as e:
            raise ShardError(f"shard must look like i/N, got {text!r}") from e
        return cls(index, count)

    @property
    def name(self) -> str:
        """Folder name, sortable: ``00003-of-00016``."""
        return f"{self.index:05d}-of-{self.count:05d}"

    def owns(self, key: str) -> bool:
        """Whether the trajectory with id ``key`` belongs to this shard."""
        return stable_int(key) % self.count == self.index


def stable_int(*parts: object) -> int:
    """A 64-bit integer from a SHA-256 of the parts; stable across processes and machines."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def sample_seed(run_seed: int, sample_id: str, purpose: str) -> int:
    """The seed of one random decision about one sample (never a shared RNG stream)."""
    return stable_int(run_seed, sample_id, purpose)


def unit_float(run_seed: int, sample_id: str, purpose: str) -> float:
    """A uniform number in [0, 1) fixed by the run seed, the sample id and the decision."""
    return sample_seed(run_seed, sample_id, purpose) / 2**64


# --------------------------------------------------------------------------------------------
# Counters and exclusions


@dataclass
class StageStats:
    """Counters of one stage: ``in``, ``kept``, ``dropped_<reason>``, ``llm_retries`` and more.

    Invariant checked at the end of every stage: ``in == kept + sum(dropped_*)``.
    """

    stage: str
    counts: Counter[str] = field(default_factory=Counter)
    exclusions: list[dict[str, Any]] = field(default_factory=list)

    def seen(self, n: int = 1) -> None:
        """Count items entering the stage."""
        self.counts["in"] += n

    def kept(self, n: int = 1) -> None:
        """Count items leaving the stage."""
        self.counts["kept"] += n

    def add(self, key: str, n: int = 1) -> None:
        """Count anything else (``llm_retries``, ``cache_hits``, labels such as ``no_change``)."""
        self.counts[key] += n

    def drop(
        self,
        item_id: str,
        reason: str,
        message: str = "",
        raw: list[str] | None = None,
    ) -> None:
        """Count a drop and record it, with the raw annotator responses, in the exclusion file."""
        self.counts[f"dropped_{reason}"] += 1
        self.exclusions.append(
            {
                "stage": self.stage,
                "id": item_id,
                "reason": reason,
                "message": message,
                "raw_responses": list(raw or []),
            }
        )

    def dropped_total(self) -> int:
        """Sum of all ``dropped_*`` counters."""
        return sum(v for k, v in self.counts.items() if k.startswith("dropped_"))

    def check(self) -> None:
        """Raise if ``in != kept + sum(dropped)`` (an item vanished or was counted twice)."""
        if self.counts["in"] != self.counts["kept"] + self.dropped_total():
            raise AssertionError(
                f"stage {self.stage}: counters do not balance: {dict(self.counts)}"
            )


def merge_counts(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Sum counter dicts key by key (shard counters -> run counters), keys sorted."""
    total: Counter[str] = Counter()
    for part in parts:
        total.update(part)
    return dict(sorted(total.items()))


def summary_table(counters: dict[str, dict[str, int]]) -> str:
    """A plain-text per-stage table of counters, for the log at the end of every stage."""
    lines = []
    for stage, counts in counters.items():
        parts = [f"{k}={v}" for k, v in counts.items()]
        lines.append(f"{stage:<12} " + " ".join(parts))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Steps and the executor


class StageIncomplete(RuntimeError):
    """A stage had items fail with a temporary error; it was left unfinished for a rerun."""


class PipelineStep(Protocol[T]):
    """One stage: items in, items out, counting every item kept or dropped in ``stats``."""

    name: str

    def run(self, items: list[T], stats: StageStats) -> list[T]:
        """Process one shard's items."""
        ...


class Flow(Protocol[T]):
    """Several stages run together, each item passing to its next stage as soon as it can."""

    def run(self, items: list[T], stats: dict[str, StageStats]) -> list[T]:
        """Run the stages named in ``stats`` (in step order) over one shard's items."""
        ...

    def view(self, item: T, later: list[str]) -> T:
        """The item as it leaves a stage, without what the ``later`` stages added."""
        ...


@dataclass
class Codec(Generic[T]):
    """How the executor stores the items flowing between steps."""

    to_json: Callable[[T], dict[str, Any]]
    from_json: Callable[[dict[str, Any]], T]


class Executor(Generic[T]):
    """Runs the steps over one shard with atomic outputs, completion markers and resume.

    Args:
        out_dir: Run output directory.
        steps: Stages in order.
        codec: Serialisation of the items between stages.
        retry_reasons: Drop reasons that mean "try again later" (an endpoint outage). A stage
            with any such drop is not committed, so the next run of the shard retries it
            instead of keeping a temporary failure as a permanent drop.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        steps: list[PipelineStep[T]],
        codec: Codec[T],
        retry_reasons: frozenset[str] = frozenset(),
    ):
        self.out = Path(out_dir)
        self.steps = steps
        self.codec = codec
        self.retry_reasons = retry_reasons

    def output_path(self, shard: Shard, stage: str) -> Path:
        """Where a stage's output for a shard lives."""
        return self.out / "work" / shard.name / f"{stage}.jsonl"

    def marker_path(self, shard: Shard, stage: str) -> Path:
        """Completion marker of a stage for a shard."""
        return self.out / "completions" / shard.name / f"{stage}.json"

    def exclusion_path(self, shard: Shard, stage: str) -> Path:
        """Exclusion file of a stage for a shard."""
        return self.out / "exclusions" / shard.name / f"{stage}.jsonl"

    def is_done(self, shard: Shard, stage: str | None = None) -> bool:
        """Whether ``stage`` (default: the last stage) has a completion marker for ``shard``."""
        return self.marker_path(shard, stage or self.steps[-1].name).exists()

    def load_output(self, shard: Shard, stage: str | None = None) -> list[T]:
        """Read a finished stage's output for a shard."""
        path = self.output_path(shard, stage or self.steps[-1].name)
        return [self.codec.from_json(r) for r in loads_jsonl(path.read_text(encoding="utf-8"))]

    def load_counters(self, shard: Shard) -> dict[str, dict[str, int]]:
        """The counters of every finished stage of a shard, in stage order."""
        out: dict[str, dict[str, int]] = {}
        for step in self.steps:
            marker = self.marker_path(shard, step.name)
            if marker.exists():
                out[step.name] = json.loads(marker.read_text(encoding="utf-8"))["counts"]
        return out

    def run_shard(self, shard: Shard, items: list[T], flow: Flow[T] | None = None) -> list[T]:
        """Run every unfinished stage of ``shard``; finished stages are loaded, not recomputed.

        Without ``flow`` the stages run one after another. With it, the unfinished stages run
        together through the flow, and are then committed in order, each with its own
        counters and with the items as that stage left them.

        Raises:
            StageIncomplete: A stage dropped items for a reason in ``retry_reasons``; it and
                the later stages stay unfinished.
        """
        # Stages are committed in order; after the first unfinished one nothing is trusted (a
        # marker past a gap was written from an input that is being recomputed).
        first = next(
            (i for i, step in enumerate(self.steps) if not self.is_done(shard, step.name)),
            len(self.steps),
        )
        done, todo = self.steps[:first], self.steps[first:]
        for step in done:
            log.info("shard %s: %s already complete, skipping", shard.name, step.name)
        if done:
            items = self.load_output(shard, done[-1].name)
        if flow is None:
            for step in todo:
                items = self._run_one(shard, step, items)
            return items
        return self._run_flow(shard, todo, items, flow)

    def _run_one(self, shard: Shard, step: PipelineStep[T], items: list[T]) -> list[T]:
        stats = StageStats(step.name)
        started = time.perf_counter()
        items = step.run(items, stats)
        stats.check()
        self._refuse_temporary_drops(shard, step.name, stats)
        self._commit(shard, step.name, items, stats)
        self._log_done(shard, stats, time.perf_counter() - started)
        return items

    def _run_flow(
        self, shard: Shard, todo: list[PipelineStep[T]], items: list[T], flow: Flow[T]
    ) -> list[T]:
        if not todo:
            return items
        stats = {step.name: StageStats(step.name) for step in todo}
        started = time.perf_counter()
        items = flow.run(items, stats)
        names = [step.name for step in todo]
        for i, name in enumerate(names):
            stats[name].check()
            self._refuse_temporary_drops(shard, name, stats[name])
            self._commit(shard, name, [flow.view(x, names[i + 1 :]) for x in items], stats[name])
            self._log_done(shard, stats[name], time.perf_counter() - started)
        return items

    def _log_done(self, shard: Shard, stats: StageStats, seconds: float) -> None:
        log.info(
            "shard %s: %s done in %.1fs\n%s",
            shard.name,
            stats.stage,
            seconds,
            summary_table({stats.stage: dict(sorted(stats.counts.items()))}),
        )

    def _refuse_temporary_drops(self, shard: Shard, stage: str, stats: StageStats) -> None:
        temporary = Counter(
            e["reason"] for e in stats.exclusions if e["reason"] in self.retry_reasons
        )
        if temporary:
            raise StageIncomplete(
                f"shard {shard.name}: {stage} left unfinished, {sum(temporary.values())} items "
                f"failed with temporary errors ({dict(sorted(temporary.items()))}); run the "
                "same command again to retry them (answers already received are cached)"
            )

    def _commit(self, shard: Shard, stage: str, items: list[T], stats: StageStats) -> None:
        # Output and exclusions first, marker last: a marker therefore implies both files.
        write_atomic(
            self.output_path(shard, stage), dumps_jsonl(self.codec.to_json(i) for i in items)
        )
        # Sorted: items finish in whatever order the endpoint answers them.
        rows = sorted(stats.exclusions, key=lambda r: (r["id"], r["reason"], r["message"]))
        write_atomic(self.exclusion_path(shard, stage), dumps_jsonl(rows))
        marker = {"stage": stage, "shard": shard.name, "counts": dict(sorted(stats.counts.items()))}
        write_atomic(self.marker_path(shard, stage), json.dumps(marker, sort_keys=True) + "\n")

    def merged_exclusions(self, shards: list[Shard]) -> list[dict[str, Any]]:
        """Exclusions of all shards and stages, in a shard-count-independent order."""
        rows: list[dict[str, Any]] = []
        for shard in shards:
            for step in self.steps:
                path = self.exclusion_path(shard, step.name)
                if path.exists():
                    rows.extend(loads_jsonl(path.read_text(encoding="utf-8")))
        order = {step.name: i for i, step in enumerate(self.steps)}
        return sorted(rows, key=lambda r: (order.get(r["stage"], 99), r["id"], r["reason"]))
