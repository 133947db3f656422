"""Offline critic benchmark: score one or two backends on held-out critique and history samples.

python -m train.benchmark --data DATA --backend oracle --out DIR
python -m train.benchmark --data DATA --compare transformers:CKPT_A transformers:CKPT_B --out DIR
python -m train.benchmark --data DATA --backend openai:http://HOST:8000/v1@MODEL --out DIR

Every record is turned into the prompt training and serving use (``hivig.records.record_messages``
then ``hivig.vision.materialise``), answered by the backend, and parsed with the one contract
parser of its task (``hivig.contracts.parse_critique`` / ``parse_history``). The ``oracle``
backend answers with the record's own target; it scores 100 % on every metric, which checks the
scoring itself. Metric definitions are in ``docs/evaluation.md``.

Outputs in ``--out``: ``metrics.json`` (every figure, per backend), ``report.md`` (the backends
side by side), ``confusion.png`` (verdict/dimension and transition confusion matrices),
``predictions/<backend>.jsonl`` (one line per sample: truth, prediction, raw answer) and the
run description (``config.yaml``, ``run_info.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shlex
import statistics
import sys
import time
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from hivig.backends import BackendError, InferenceBackend, Sampling, split_reasoning
from hivig.checkpoint_files import CheckpointError, read_frame
from hivig.config import BackendConfig, ConfigError, FrameConfig, write_run_description
from hivig.contracts import ContractError, parse_critique, parse_history
from hivig.logging import configure_logging, get_logger
from hivig.records import (
    RecordError,
    SFTRecord,
    read_image_root,
    read_records,
    record_messages,
    records_dir,
)
from hivig.taxonomy import DIMENSIONS
from hivig.vision import ImageError, exact_fingerprint, load_image, materialise

log = get_logger("train.benchmark")  # also under `python -m`, where __name__ is __main__

__all__ = [
    "Answer",
    "BackendPredictor",
    "BenchmarkConfig",
    "BenchmarkError",
    "OraclePredictor",
    "Predictor",
    "compute_metrics",
    "load_benchmark_records",
    "main",
    "predict_all",
    "render_report",
    "run_benchmark",
    "score_sample",
    "transition_class",
    "true_transitions",
    "write_confusion_png",
]

CHANGED = "changed"
NO_CHANGE = "no_change"
TRANSITIONS: tuple[str, ...] = (CHANGED, NO_CHANGE)
GOOD = "Good"
UNPARSED = "Unparsed"
"""Prediction column of the confusion matrices for answers that failed (parse or backend)."""
DIMENSION_NAMES: tuple[str, ...] = tuple(d.name for d in DIMENSIONS)
VERDICT_LABELS: tuple[str, ...] = (GOOD, *DIMENSION_NAMES)
"""Rows of the critique confusion matrix: Good, then each Bad dimension."""


class BenchmarkError(ValueError):
    """A user mistake (bad data path, backend spec, output folder); the message names the fix."""


@dataclass
class BenchmarkConfig:
    """The resolved benchmark settings (written to ``config.yaml`` next to the outputs)."""

    data: str = ""
    """A data_gen output folder, its ``dataset/records`` folder, a split folder or one shard."""
    split: str = ""
    """Split to score; empty: ``test`` for dataset folders, every record of a split folder."""
    backends: list[str] = field(default_factory=list)
    """Backend specs: ``oracle``, ``transformers:CKPT_DIR``, ``openai:URL[@MODEL]``."""
    out: str = ""
    """Output folder."""
    limit: int = 0
    """Score at most this many records (0: all), critique and history interleaved."""
    max_tokens: int = 2048
    """Maximum new tokens per answer."""
    temperature: float = 0.0
    """Sampling temperature (0: greedy)."""
    seed: int | None = None
    """Sampling seed, where the backend honours one."""
    concurrency: int = 8
    """Requests in flight per backend."""
    timeout_s: float = 300.0
    """Per-request timeout of HTTP backends, in seconds."""
    min_pixels: int = 0
    """Canonical-frame lower bound; 0: the checkpoint's processor budget, else the default."""
    max_pixels: int = 0
    """Canonical-frame upper bound; 0: the checkpoint's processor budget, else the default."""
    image_root: str = ""
    """Where relative image paths resolve; empty: the records' manifest."""
    device: str = ""
    """Device of in-process models; empty: CUDA when available, else CPU."""


# ---------------------------------------------------------------------------------------------
# Data


def _records_root(path: Path) -> Path:
    """The folder holding the split sub-folders (and the manifest) for a data path."""
    nested = records_dir(path)
    return nested if nested.is_dir() else path


def load_benchmark_records(
    data: str | os.PathLike[str], split: str = "", image_root: str | os.PathLike[str] = ""
) -> tuple[list[SFTRecord], Path, str]:
    """Read the records to score and where their image paths resolve.

    Args:
        data: A data_gen output folder, its records folder (one sub-folder per split), a folder
            of ``part-*.parquet`` shards or a single shard.
        split: Split to keep. Empty: ``test`` for folders with split sub-folders, and every
            record of a shard folder or file. Given with a shard folder: records whose ``split``
            field matches.
        image_root: Override of the image root; empty: the manifest next to the records (in
            the folder or up to two levels above), else the folder itself.

    Returns:
        ``(records, image_root, split)``, ``split`` as resolved (``""``: every record).

    Raises:
        BenchmarkError: The path is missing, holds no shards, or the split has no records.
    """
    src = Path(data)
    if not src.exists():
        raise BenchmarkError(f"--data {src}: no such file or folder (pass a data_gen output)")
    if src.is_dir() and not any(src.glob("part-*.parquet")):
        root = _records_root(src)
        chosen = split or "test"
        shard_dir = root / chosen
        if not shard_dir.is_dir():
            have = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
            raise BenchmarkError(
                f"--data {src}: no '{chosen}' split folder under {root} (found: "
                f"{', '.join(have) or 'none'}); pass a data_gen output folder or --split"
            )
        records = _read(shard_dir)
        manifest_dirs = [root]
    else:
        chosen = split
        records = _read(src)
        if split:
            records = [r for r in records if r.split == split]
        base = src if src.is_dir() else src.parent
        manifest_dirs = [base, base.parent, base.parent.parent]
    if not records:
        where = f"split '{chosen}' of {src}" if chosen else str(src)
        raise BenchmarkError(f"--data: no records in {where}; pick another --split")
    return records, _image_root(image_root, manifest_dirs), chosen


def _read(path: Path) -> list[SFTRecord]:
    try:
        return read_records(path)
    except RecordError as e:
        raise BenchmarkError(f"--data: {e}") from e


def _image_root(override: str | os.PathLike[str], candidates: Sequence[Path]) -> Path:
    if override:
        return Path(override)
    for folder in candidates:
        try:
            root = read_image_root(folder)
        except RecordError as e:
            raise BenchmarkError(f"--data: {e}") from e
        if root is not None:
            return root
    return candidates[0]


def select_records(records: Sequence[SFTRecord], limit: int) -> list[SFTRecord]:
    """At most ``limit`` records (0: all), taking critique and history samples in turn.

    Alternating keeps both tasks represented when a small limit meets records grouped by
    trajectory; within a kind the stored order is kept, so the choice is deterministic.
    """
    if limit <= 0 or limit >= len(records):
        return list(records)
    queues = {kind: deque(r for r in records if r.kind == kind) for kind in ("critique", "history")}
    chosen: list[SFTRecord] = []
    while len(chosen) < limit and any(queues.values()):
        for kind in ("critique", "history"):
            if queues[kind] and len(chosen) < limit:
                chosen.append(queues[kind].popleft())
    return chosen


# ---------------------------------------------------------------------------------------------
# Ground truth of history samples

# Text in quotes is the step's own intent or a UI label ("'Keep unchanged' was clicked") and
# says nothing about the result, so it is removed before the result is classified.
_QUOTED = re.compile(r"(?<!\w)'.*?'(?!\w)|\"[^\"]*\"|“[^”]*”|‘[^’]*’")
_NO_CHANGE = re.compile(
    r"\bno\s+(?:visible\s+|observable\s+|apparent\s+|noticeable\s+)?"
    r"(?:change|changes|effect|response|reaction|difference)\b"
    r"|\b(?:did|does|do)\s*(?:not|n't)\s+(?:visibly\s+)?"
    r"(?:change|respond|react|happen|take\s+effect|have\s+(?:any|an|a\s+visible)\s+effect)\b"
    r"|\bunchanged\b"
    r"|\b(?:remain|remains|remained|stay|stays|stayed)\s+(?:visually\s+)?"
    r"(?:the\s+same|as\s+(?:it\s+was|before)|identical)\b"
    r"|\bnothing\s+(?:happened|changed|visible\s+changed)\b"
    r"|\bsilent(?:ly)?\s+fail",
    re.IGNORECASE,
)


def transition_class(last_result: str) -> str:
    """``no_change`` when a ``Last Action Result`` says the screen did not change, else ``changed``.

    The rule (documented in ``docs/evaluation.md``): quoted text is dropped, then the result is
    ``no_change`` when it contains a no-effect phrase (``no visible change``, ``did not
    respond``, ``unchanged``, ``remained the same``, ``nothing happened``, ``silently failed``,
    ...), and ``changed`` otherwise.

    Args:
        last_result: The ``Last Action Result:`` field of a history answer.

    Returns:
        ``changed`` or ``no_change``.
    """
    return NO_CHANGE if _NO_CHANGE.search(_QUOTED.sub(" ", last_result)) else CHANGED


def _resolve(ref_path: str, image_root: Path) -> Path:
    path = Path(ref_path)
    return path if path.is_absolute() else image_root / path


def _fingerprint(path: Path) -> str | ImageError:
    try:
        return exact_fingerprint(load_image(path))
    except ImageError as e:
        return e


def true_transitions(
    records: Sequence[SFTRecord], image_root: Path, *, progress: bool = False
) -> tuple[dict[str, str | None], dict[str, str]]:
    """The real transition of each history sample, and the records whose images are unreadable.

    A history sample shows the screen before (first image) and after (second image) the step;
    the transition is ``no_change`` when both decode to identical pixels (same size, same RGB
    values: ``hivig.vision.exact_fingerprint``), else ``changed``. Every image of every record is
    decoded once here, so a record with a missing or corrupt screenshot is left out for all
    backends alike instead of counting against the ones that look at images.

    Args:
        records: The records to score.
        image_root: Where relative image paths resolve.
        progress: Show a tqdm bar (stderr).

    Returns:
        ``(transitions, skipped)``: record id → transition (``None`` for critique samples), and
        record id → ``image_<reason>`` for the records to leave out.
    """
    paths = sorted({ref.path for record in records for ref in record.images})
    # Decoding is most of the cost and PIL releases the GIL while it decodes.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        digests_of = pool.map(lambda p: _fingerprint(_resolve(p, image_root)), paths)
        bar = tqdm(digests_of, total=len(paths), desc="images", unit="image", disable=not progress)
        prints = dict(zip(paths, bar, strict=True))
    transitions: dict[str, str | None] = {}
    skipped: dict[str, str] = {}
    for record in records:
        digests = [prints[ref.path] for ref in record.images]
        bad = next((d for d in digests if isinstance(d, ImageError)), None)
        if bad is not None:
            skipped[record.id] = f"image_{bad.reason}"
            continue
        if record.kind == "history":
            if len(digests) < 2:
                skipped[record.id] = "history_without_two_images"
                continue
            transitions[record.id] = NO_CHANGE if digests[0] == digests[-1] else CHANGED
        else:
            transitions[record.id] = None
    return transitions, skipped


# ---------------------------------------------------------------------------------------------
# Predictors


@dataclass(frozen=True)
class Answer:
    """One backend answer, or why there is none.

    Attributes:
        text: The answer with the reasoning split off (``""`` on failure).
        reasoning: The reasoning, ``None`` when there was none.
        error: ``None``, or ``backend_<reason>`` / ``image_<reason>`` when no answer came back.
        finish_reason: ``stop``, ``length``, ... (``""`` on failure).
        latency_s: Seconds the answer took.
        completion_tokens: Generated tokens (0 when not reported).
    """

    text: str
    reasoning: str | None = None
    error: str | None = None
    finish_reason: str = "stop"
    latency_s: float = 0.0
    completion_tokens: int = 0


class Predictor(Protocol):
    """Answers one record's prompt; ``name`` labels it in the outputs."""

    name: str

    async def predict(self, record: SFTRecord) -> Answer:
        """The answer to ``record``'s prompt (failures as ``Answer.error``, never raised)."""
        ...

    async def aclose(self) -> None:
        """Release what the predictor holds."""
        ...


class OraclePredictor:
    """Replays each record's own target: the reference that must score 100 %.

    The target goes through the backends' reasoning split (``split_reasoning``) and then the same
    parsing and scoring as any model answer, so a metric it does not get right is a bug in the
    benchmark or a label that contradicts the data.
    """

    def __init__(self, name: str = "oracle") -> None:
        self.name = name

    async def predict(self, record: SFTRecord) -> Answer:
        """The record's target as an answer."""
        reasoning, text = split_reasoning(record.target)
        return Answer(text=text, reasoning=reasoning)

    async def aclose(self) -> None:
        """Nothing to release."""


class BackendPredictor:
    """Answers with an ``InferenceBackend`` on the prompt training and serving use.

    Args:
        backend: The backend (HTTP client or in-process model).
        sampling: Sampling parameters sent with every request.
        frame: Canonical-frame budget the images are resized to.
        image_root: Where relative image paths resolve.
        name: Label in the outputs.
    """

    def __init__(
        self,
        backend: InferenceBackend,
        sampling: Sampling,
        frame: FrameConfig,
        image_root: Path,
        name: str,
    ) -> None:
        self.backend = backend
        self.sampling = sampling
        self.frame = frame
        self.image_root = image_root
        self.name = name

    def _messages(self, record: SFTRecord) -> list[Any]:
        f = self.frame
        prompt = record_messages(record)[:-1]  # system + user; the target is the answer key
        return materialise(
            prompt,
            self.image_root,
            min_pixels=f.min_pixels,
            max_pixels=f.max_pixels,
            factor=f.factor,
        )

    async def predict(self, record: SFTRecord) -> Answer:
        """Materialise the frames (in a thread), generate, and report failures as errors."""
        start = time.perf_counter()
        try:
            messages = await asyncio.to_thread(self._messages, record)
        except ImageError as e:
            return Answer("", error=f"image_{e.reason}", finish_reason="")
        try:
            gen = await self.backend.generate(messages, self.sampling)
        except BackendError as e:
            log.debug("%s: %s failed: %s", self.name, record.id, e)
            return Answer(
                "",
                error=f"backend_{e.reason}",
                finish_reason="",
                latency_s=time.perf_counter() - start,
            )
        return Answer(
            text=gen.text,
            reasoning=gen.reasoning,
            finish_reason=gen.finish_reason,
            latency_s=gen.latency_s,
            completion_tokens=gen.usage.completion_tokens,
        )

    async def aclose(self) -> None:
        """Close the backend if it holds connections."""
        aclose = getattr(self.backend, "aclose", None)
        if aclose is not None:
            await aclose()


async def predict_all(
    predictor: Predictor,
    records: Sequence[SFTRecord],
    *,
    concurrency: int = 8,
    progress: bool = False,
) -> list[Answer]:
    """Answer every record with at most ``concurrency`` requests in flight, in record order."""
    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(records), desc=predictor.name, unit="sample", disable=not progress)

    async def one(record: SFTRecord) -> Answer:
        async with gate:
            answer = await predictor.predict(record)
        bar.update(1)
        return answer

    try:
        return list(await asyncio.gather(*(one(r) for r in records)))
    finally:
        bar.close()


# ---------------------------------------------------------------------------------------------
# Scoring


def score_sample(record: SFTRecord, answer: Answer, transition: str | None) -> dict[str, Any]:
    """One prediction row: the truth, the parsed prediction, whether it is right, the raw answer.

    Args:
        record: The sample.
        answer: The backend's answer.
        transition: The sample's true transition (history samples), from ``true_transitions``.

    Returns:
        A JSON-ready row (``predictions/<backend>.jsonl``). ``failure`` is ``None`` or
        ``contract_<reason>`` / ``backend_<reason>`` / ``image_<reason>``; a failed answer is
        never right.
    """
    row: dict[str, Any] = {
        "id": record.id,
        "kind": record.kind,
        "platform": record.platform,
        "intent_masked": record.labels.intent_masked,
        "split": record.split,
    }
    failure = answer.error
    parsed: Any = None
    if failure is None:
        parse = parse_critique if record.kind == "critique" else parse_history
        parsed = parse(answer.text, answer.reasoning)
        if isinstance(parsed, ContractError):
            failure, parsed = f"contract_{parsed.reason}", None
    if record.kind == "critique":
        truth = {"verdict": record.labels.verdict, "dimension": record.labels.error_dimension}
        pred = None
        if parsed is not None:
            pred = {
                "verdict": parsed.verdict,
                "dimension": parsed.dimension.name if parsed.dimension else None,
            }
        row["truth"], row["pred"] = truth, pred
        row["correct"] = pred is not None and pred["verdict"] == truth["verdict"]
        row["dimension_correct"] = pred is not None and truth["verdict"] == "Bad" and pred == truth
    else:
        target = parse_history(record.target)
        target_class = (
            None if isinstance(target, ContractError) else transition_class(target.last_result)
        )
        row["truth"] = {"transition": transition, "target_transition": target_class}
        row["pred"] = (
            None
            if parsed is None
            else {
                "transition": transition_class(parsed.last_result),
                "last_result": parsed.last_result,
            }
        )
        row["correct"] = row["pred"] is not None and row["pred"]["transition"] == transition
    row.update(
        failure=failure,
        finish_reason=answer.finish_reason,
        latency_s=round(answer.latency_s, 4),
        completion_tokens=answer.completion_tokens,
        text=answer.text,
        reasoning=answer.reasoning,
    )
    return row


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _failure_counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    return dict(sorted(Counter(r["failure"] for r in rows if r["failure"]).items()))


def _rate(rows: Sequence[dict[str, Any]], prefix: str) -> float | None:
    return _ratio(sum(1 for r in rows if (r["failure"] or "").startswith(prefix)), len(rows))


def _bad_detection(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Bad as the positive class; a failed answer predicts neither Good nor Bad."""

    def pred_bad(r: dict[str, Any]) -> bool:
        return r["pred"] is not None and r["pred"]["verdict"] == "Bad"

    tp = sum(1 for r in rows if r["truth"]["verdict"] == "Bad" and pred_bad(r))
    fp = sum(1 for r in rows if r["truth"]["verdict"] == "Good" and pred_bad(r))
    fn = sum(1 for r in rows if r["truth"]["verdict"] == "Bad" and not pred_bad(r))
    tn = sum(
        1
        for r in rows
        if r["truth"]["verdict"] == "Good" and r["pred"] is not None and not pred_bad(r)
    )
    return {
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "f1": _ratio(2 * tp, 2 * tp + fp + fn),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
    }


def _critique_group(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    bad = [r for r in rows if r["truth"]["verdict"] == "Bad"]
    detection = _bad_detection(rows)
    return {
        "n": len(rows),
        "n_bad": len(bad),
        "verdict_accuracy": _ratio(sum(r["correct"] for r in rows), len(rows)),
        "bad_precision": detection["precision"],
        "bad_recall": detection["recall"],
        "bad_f1": detection["f1"],
        "dimension_accuracy": _ratio(sum(r["dimension_correct"] for r in bad), len(bad)),
    }


def _confusion(rows: Sequence[dict[str, Any]], labels: Sequence[str], key: Any) -> dict[str, Any]:
    columns = [*labels, UNPARSED]
    matrix = [[0] * len(columns) for _ in labels]
    for r in rows:
        truth = key(r["truth"])
        pred = UNPARSED if r["pred"] is None else key(r["pred"])
        if truth in labels and pred in columns:
            matrix[labels.index(truth)][columns.index(pred)] += 1
    return {"rows": list(labels), "columns": columns, "matrix": matrix}


def _verdict_label(part: dict[str, Any]) -> str:
    return GOOD if part["verdict"] == GOOD else str(part["dimension"])


def _critique_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    parsed = [r for r in rows if r["pred"] is not None]
    bad = [r for r in rows if r["truth"]["verdict"] == "Bad"]
    detected = [r for r in bad if r["pred"] is not None and r["pred"]["verdict"] == "Bad"]
    per_dimension = {}
    for name in DIMENSION_NAMES:
        of_dim = [r for r in bad if r["truth"]["dimension"] == name]
        predicted = [r for r in parsed if r["pred"]["dimension"] == name]
        per_dimension[name] = {
            "n": len(of_dim),
            "accuracy": _ratio(sum(r["dimension_correct"] for r in of_dim), len(of_dim)),
            "detected_bad": _ratio(
                sum(1 for r in of_dim if r["pred"] and r["pred"]["verdict"] == "Bad"), len(of_dim)
            ),
            "predicted": len(predicted),
        }
    platforms = sorted({r["platform"] for r in rows})
    return {
        **_critique_group(rows),
        "parsed": len(parsed),
        "parse_failure_rate": _rate(rows, "contract_"),
        "backend_error_rate": _rate(rows, "backend_"),
        "verdict_accuracy_parsed": _ratio(sum(r["correct"] for r in parsed), len(parsed)),
        "dimension_accuracy_detected": _ratio(
            sum(r["dimension_correct"] for r in detected), len(detected)
        ),
        "bad": _bad_detection(rows),
        "per_dimension": per_dimension,
        "per_platform": {
            p: _critique_group([r for r in rows if r["platform"] == p]) for p in platforms
        },
        "intent": {
            "masked": _critique_group([r for r in rows if r["intent_masked"]]),
            "unmasked": _critique_group([r for r in rows if not r["intent_masked"]]),
        },
        "failures": _failure_counts(rows),
        "confusion": _confusion(rows, VERDICT_LABELS, _verdict_label),
    }


def _history_group(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    parsed = [r for r in rows if r["pred"] is not None]
    return {
        "n": len(rows),
        "well_formed_rate": _ratio(len(parsed), len(rows)),
        "last_result_agreement": _ratio(sum(r["correct"] for r in rows), len(rows)),
    }


def _history_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    parsed = [r for r in rows if r["pred"] is not None]
    labelled = [r for r in rows if r["truth"]["target_transition"] is not None]
    platforms = sorted({r["platform"] for r in rows})
    return {
        **_history_group(rows),
        "parsed": len(parsed),
        "parse_failure_rate": _rate(rows, "contract_"),
        "backend_error_rate": _rate(rows, "backend_"),
        "last_result_agreement_parsed": _ratio(sum(r["correct"] for r in parsed), len(parsed)),
        "per_transition": {
            t: _history_group([r for r in rows if r["truth"]["transition"] == t])
            for t in TRANSITIONS
        },
        # A property of the data, not of the backend: how often the label's own Last Action
        # Result agrees with the pixels (the oracle's agreement can be no higher).
        "target_agreement": _ratio(
            sum(r["truth"]["target_transition"] == r["truth"]["transition"] for r in labelled),
            len(labelled),
        ),
        "per_platform": {
            p: _history_group([r for r in rows if r["platform"] == p]) for p in platforms
        },
        "intent": {
            "masked": _history_group([r for r in rows if r["intent_masked"]]),
            "unmasked": _history_group([r for r in rows if not r["intent_masked"]]),
        },
        "failures": _failure_counts(rows),
        "confusion": _confusion(rows, TRANSITIONS, lambda part: part["transition"]),
    }


def compute_metrics(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every figure of one backend from its prediction rows (``score_sample``).

    Ratios are in [0, 1] and ``None`` where their denominator is empty (no Bad sample, no Bad
    prediction, ...). Definitions: ``docs/evaluation.md``.

    Returns:
        ``{"n", "critique": {...}, "history": {...}, "truncated", "latency_s_median",
        "completion_tokens_mean"}``.
    """
    critique = [r for r in rows if r["kind"] == "critique"]
    history = [r for r in rows if r["kind"] == "history"]
    answered = [r for r in rows if not (r["failure"] or "").startswith(("backend_", "image_"))]
    latencies = [r["latency_s"] for r in answered]
    return {
        "n": len(rows),
        "critique": _critique_metrics(critique),
        "history": _history_metrics(history),
        "truncated": sum(1 for r in rows if r["finish_reason"] == "length"),
        "latency_s_median": statistics.median(latencies) if latencies else None,
        "completion_tokens_mean": (
            statistics.fmean(r["completion_tokens"] for r in answered) if answered else None
        ),
    }


# ---------------------------------------------------------------------------------------------
# Running


@dataclass
class BackendResult:
    """One backend's rows and metrics."""

    name: str
    spec: str
    rows: list[dict[str, Any]]
    metrics: dict[str, Any]


async def _answer(
    predictor: Predictor, records: Sequence[SFTRecord], concurrency: int, progress: bool
) -> list[Answer]:
    try:
        return await predict_all(predictor, records, concurrency=concurrency, progress=progress)
    finally:
        await predictor.aclose()


def run_benchmark(
    records: Sequence[SFTRecord],
    predictor: Predictor,
    transitions: dict[str, str | None],
    *,
    spec: str = "",
    concurrency: int = 8,
    progress: bool = False,
) -> BackendResult:
    """Answer and score ``records`` (those in ``transitions``) with one predictor.

    Args:
        records: The records; those missing from ``transitions`` (unreadable images) are left out.
        predictor: Oracle or backend predictor (closed afterwards).
        transitions: ``true_transitions``' first result.
        spec: The backend spec, recorded with the metrics.
        concurrency: Requests in flight.
        progress: Show a tqdm bar.

    Returns:
        The prediction rows and metrics.
    """
    scored = [r for r in records if r.id in transitions]
    answers = asyncio.run(_answer(predictor, scored, concurrency, progress))
    rows = [score_sample(r, a, transitions[r.id]) for r, a in zip(scored, answers, strict=True)]
    return BackendResult(predictor.name, spec, rows, compute_metrics(rows))


# ---------------------------------------------------------------------------------------------
# Backend specs


@dataclass(frozen=True)
class BackendSpec:
    """A parsed ``--backend`` value."""

    kind: str
    target: str = ""
    model: str = ""

    @property
    def label(self) -> str:
        """Short name for tables and file names."""
        if self.kind == "oracle":
            return "oracle"
        if self.kind == "transformers":
            return f"transformers:{Path(self.target).name or self.target}"
        return f"openai:{self.model or self.target}"


_OPENAI_SPEC = re.compile(r"^(?P<url>https?://[^/@\s]+(?:/[^@\s]*)?)(?:@(?P<model>\S+))?$")


def parse_backend_spec(spec: str) -> BackendSpec:
    """Parse ``oracle``, ``transformers:CKPT_DIR`` or ``openai:URL[@MODEL]``.

    Raises:
        BenchmarkError: Unknown kind, a checkpoint folder without ``config.json``, or a URL
            that is not ``http(s)://HOST...``.
    """
    kind, _, rest = spec.partition(":")
    if kind == "oracle" and not rest:
        return BackendSpec("oracle")
    if kind == "transformers" and rest:
        ckpt = Path(rest)
        if not (ckpt / "config.json").is_file():
            raise BenchmarkError(
                f"--backend {spec}: {ckpt} is not a checkpoint folder (no config.json)"
            )
        return BackendSpec("transformers", str(ckpt))
    if kind == "openai" and rest:
        # No credentials in the URL (the key comes from the environment), so the first "@"
        # after the host separates the model, whose name may hold "/" (Qwen/Qwen3-VL-8B).
        match = _OPENAI_SPEC.match(rest)
        if match is None:
            raise BenchmarkError(
                f"--backend {spec}: expected openai:http(s)://HOST[:PORT][/PATH][@MODEL]"
            )
        return BackendSpec("openai", match["url"].rstrip("/"), match["model"] or "")
    raise BenchmarkError(
        f"--backend {spec!r}: expected oracle, transformers:CKPT_DIR or openai:URL[@MODEL]"
    )


def _checkpoint_frame(ckpt: str) -> FrameConfig:
    """The pixel budget a checkpoint's processor was saved with (training's frame)."""
    try:
        lo, hi = read_frame(ckpt)
        return FrameConfig(min_pixels=lo, max_pixels=hi)
    except (CheckpointError, ConfigError) as e:
        raise BenchmarkError(f"--backend transformers:{ckpt}: {e}") from e


def _frame(cfg: BenchmarkConfig, spec: BackendSpec) -> FrameConfig:
    explicit = bool(cfg.min_pixels and cfg.max_pixels)
    local = spec.kind == "transformers" and not explicit
    base = _checkpoint_frame(spec.target) if local else FrameConfig()
    try:
        return FrameConfig(
            min_pixels=cfg.min_pixels or base.min_pixels,
            max_pixels=cfg.max_pixels or base.max_pixels,
        )
    except ConfigError as e:
        raise BenchmarkError(f"--min-pixels/--max-pixels: {e}") from e


def _served_model(url: str, timeout_s: float) -> str:
    """The first model an OpenAI-compatible server lists (``GET URL/models``)."""
    import httpx

    key = os.environ.get(BackendConfig.api_key_env)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = httpx.get(f"{url}/models", headers=headers, timeout=min(timeout_s, 30.0))
        resp.raise_for_status()
        models = [m["id"] for m in resp.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise BenchmarkError(
            f"cannot list the models at {url}/models ({e}); name one with openai:URL@MODEL"
        ) from e
    if not models:
        raise BenchmarkError(f"{url}/models lists no model; name one with openai:URL@MODEL")
    return str(models[0])


def resolve_model(spec: BackendSpec, timeout_s: float) -> BackendSpec:
    """``spec`` with the served model filled in for ``openai:URL`` without ``@MODEL``.

    Raises:
        BenchmarkError: The server cannot be reached or lists no model.
    """
    if spec.kind != "openai" or spec.model:
        return spec
    return BackendSpec(spec.kind, spec.target, _served_model(spec.target, timeout_s))


def build_predictor(
    spec: BackendSpec, cfg: BenchmarkConfig, image_root: Path, name: str
) -> Predictor:
    """The predictor a spec describes (loads the checkpoint for ``transformers``).

    Raises:
        BenchmarkError: The checkpoint cannot be loaded or the server lists no model.
    """
    if spec.kind == "oracle":
        return OraclePredictor(name)
    from hivig.backends import build_backend

    frame = _frame(cfg, spec)
    sampling = Sampling(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed)
    if spec.kind == "transformers":
        backend_cfg = BackendConfig(kind="transformers", model=spec.target)
        try:
            backend = build_backend(backend_cfg, frame=frame, device=cfg.device or None)
        except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: e.g. an absent --device
            raise BenchmarkError(f"--backend {spec.label}: cannot load {spec.target}: {e}") from e
    else:
        backend_cfg = BackendConfig(
            kind="openai",
            base_url=spec.target,
            model=spec.model or _served_model(spec.target, cfg.timeout_s),
            concurrency=cfg.concurrency,
            timeout_s=cfg.timeout_s,
        )
        backend = build_backend(backend_cfg)
    return BackendPredictor(backend, sampling, frame, image_root, name)


def _unique_names(specs: Sequence[BackendSpec]) -> list[str]:
    """Labels for the tables; checkpoints of the same folder name (``RUN_A/final``,
    ``RUN_B/final``) are told apart by their parent folder, anything else left by a number."""
    short = [s.label for s in specs]
    labels = list(short)
    for i, spec in enumerate(specs):
        if spec.kind == "transformers" and short.count(spec.label) > 1:
            labels[i] = "transformers:" + "/".join(Path(spec.target).parts[-2:])
    return [
        label if labels.count(label) == 1 else f"{label}#{labels[:i].count(label) + 1}"
        for i, label in enumerate(labels)
    ]


# ---------------------------------------------------------------------------------------------
# Outputs


def _pct(value: float | None) -> str:
    return (
        "—"
        if value is None or (isinstance(value, float) and math.isnan(value))
        else (f"{100 * value:.1f} %")
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _get(metrics: dict[str, Any], path: str) -> Any:
    value: Any = metrics
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


_CRITIQUE_ROWS: tuple[tuple[str, str], ...] = (
    ("verdict accuracy", "verdict_accuracy"),
    ("Bad precision", "bad_precision"),
    ("Bad recall", "bad_recall"),
    ("Bad F1", "bad_f1"),
    ("error-dimension accuracy", "dimension_accuracy"),
    ("error-dimension accuracy (detected Bad)", "dimension_accuracy_detected"),
    ("verdict accuracy, intent masked", "intent.masked.verdict_accuracy"),
    ("verdict accuracy, intent shown", "intent.unmasked.verdict_accuracy"),
    ("error-dimension accuracy, intent masked", "intent.masked.dimension_accuracy"),
    ("error-dimension accuracy, intent shown", "intent.unmasked.dimension_accuracy"),
    ("parse failures", "parse_failure_rate"),
    ("backend errors", "backend_error_rate"),
)
_HISTORY_ROWS: tuple[tuple[str, str], ...] = (
    ("well-formed", "well_formed_rate"),
    ("Last Action Result agreement", "last_result_agreement"),
    ("agreement, screen changed", f"per_transition.{CHANGED}.last_result_agreement"),
    ("agreement, no change", f"per_transition.{NO_CHANGE}.last_result_agreement"),
    ("agreement, intent masked", "intent.masked.last_result_agreement"),
    ("agreement, intent shown", "intent.unmasked.last_result_agreement"),
    ("labels agreeing with the pixels", "target_agreement"),
    ("parse failures", "parse_failure_rate"),
    ("backend errors", "backend_error_rate"),
)


def _rows(
    ms: Sequence[dict[str, Any]], part: str, spec: Sequence[tuple[str, str]]
) -> list[list[str]]:
    counts = [["samples", *(str(m[part]["n"]) for m in ms)]]
    return counts + [[label, *(_pct(_get(m[part], path)) for m in ms)] for label, path in spec]


def _cell(group: dict[str, Any] | None, first: str, second: str | None = None) -> str:
    if group is None:
        return "—"
    text = _pct(group[first])
    if second is not None:
        text += f" / {_pct(group[second])}"
    return f"{text} (n={group['n']})"


def render_report(results: Sequence[BackendResult], header: dict[str, Any]) -> str:
    """The markdown report: one column per backend, the same rows for each."""
    names = [r.name for r in results]
    ms = [r.metrics for r in results]
    out = ["# Critic benchmark", ""]
    out += [f"- {k}: `{v}`" if k == "command" else f"- {k}: {v}" for k, v in header.items()]
    out += ["", "## Critique", ""]
    crit = _rows(ms, "critique", _CRITIQUE_ROWS)
    crit.insert(1, ["Bad samples", *(str(m["critique"]["n_bad"]) for m in ms)])
    out += _table(["metric", *names], crit)
    out += ["", "### Error-dimension accuracy per dimension", ""]
    dims = [
        [name, *(_cell(m["critique"]["per_dimension"][name], "accuracy") for m in ms)]
        for name in DIMENSION_NAMES
    ]
    out += _table(["dimension", *names], dims)
    out += ["", "### Per platform: verdict accuracy / error-dimension accuracy", ""]
    platforms = sorted({p for m in ms for p in m["critique"]["per_platform"]})
    plat = [
        [
            p,
            *(
                _cell(
                    m["critique"]["per_platform"].get(p), "verdict_accuracy", "dimension_accuracy"
                )
                for m in ms
            ),
        ]
        for p in platforms
    ]
    out += _table(["platform", *names], plat)
    out += ["", "## History", ""]
    out += _table(["metric", *names], _rows(ms, "history", _HISTORY_ROWS))
    out += ["", "### Per platform: Last Action Result agreement", ""]
    platforms = sorted({p for m in ms for p in m["history"]["per_platform"]})
    plat = [
        [p, *(_cell(m["history"]["per_platform"].get(p), "last_result_agreement") for m in ms)]
        for p in platforms
    ]
    out += _table(["platform", *names], plat)
    out += ["", "## Answers", ""]
    ans = [
        ["truncated at --max-tokens", *(str(m["truncated"]) for m in ms)],
        ["median latency (s)", *(_num(m["latency_s_median"]) for m in ms)],
        ["mean completion tokens", *(_num(m["completion_tokens_mean"]) for m in ms)],
    ]
    out += _table(["", *names], ans)
    failures = [Counter(m["critique"]["failures"]) + Counter(m["history"]["failures"]) for m in ms]
    reasons = sorted({k for f in failures for k in f})
    if reasons:
        out += ["", "### Failures (samples)", ""]
        out += _table(["reason", *names], [[k, *(str(f[k]) for f in failures)] for k in reasons])
    return "\n".join(out) + "\n"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3g}"


def _abbrev(name: str) -> str:
    words = [w for w in re.split(r"[^A-Za-z]+", name) if w and w.lower() != "and"]
    return "".join(w[0].upper() for w in words)


def write_confusion_png(results: Sequence[BackendResult], path: Path) -> None:
    """Critique (Good + 12 dimensions) and history (transition) confusion matrices per backend.

    Rows are the truth, columns the prediction (``Unparsed``: no usable answer); one row of
    panels per backend. Cells show counts, shaded by their share of the row.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        len(results),
        2,
        figsize=(14, 6.2 * len(results)),
        gridspec_kw={"width_ratios": [4, 1.4]},
        squeeze=False,
    )
    for (ax_c, ax_h), result in zip(axes, results, strict=True):
        for ax, part, short in ((ax_c, "critique", True), (ax_h, "history", False)):
            conf = result.metrics[part]["confusion"]
            matrix = conf["matrix"]
            cols = [_abbrev(c) if short and c in DIMENSION_NAMES else c for c in conf["columns"]]
            rows = [
                f"{r} ({_abbrev(r)})" if short and r in DIMENSION_NAMES else r for r in conf["rows"]
            ]
            # Shade by share of the row, so a rare class reads as clearly as a common one; the
            # cells print the counts.
            shares = [[v / (sum(line) or 1) for v in line] for line in matrix]
            ax.imshow(shares, cmap="Blues", aspect="auto", vmin=0.0, vmax=1.0)
            ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right", fontsize=8)
            ax.set_yticks(range(len(rows)), rows, fontsize=8)
            for i, line in enumerate(matrix):
                for j, v in enumerate(line):
                    if v:
                        colour = "white" if shares[i][j] > 0.5 else "black"
                        ax.text(j, i, str(v), ha="center", va="center", fontsize=8, color=colour)
            ax.set_xlabel("predicted")
            ax.set_ylabel("truth")
            ax.set_title(f"{result.name}: {part} (n={result.metrics[part]['n']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_outputs(
    out: Path, results: Sequence[BackendResult], header: dict[str, Any], skipped: dict[str, str]
) -> None:
    preds = out / "predictions"
    preds.mkdir(parents=True, exist_ok=True)
    for result in results:
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", result.name).strip("_") or "backend"
        with (preds / f"{slug}.jsonl").open("w", encoding="utf-8") as fh:
            for row in result.rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    metrics = {
        **header,
        "skipped": dict(sorted(Counter(skipped.values()).items())),
        "backends": {r.name: {"spec": r.spec, **r.metrics} for r in results},
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_report(results, header), encoding="utf-8")
    write_confusion_png(results, out / "confusion.png")


# ---------------------------------------------------------------------------------------------
# Command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m train evaluate",
        description="Offline critic benchmark on held-out critique and history samples "
        "(also `python -m train.benchmark`). Metric definitions: docs/evaluation.md.",
    )
    p.add_argument("--data", required=True, help="data_gen output folder, records folder or shards")
    p.add_argument("--split", default="", help="split to score (default: test for dataset folders)")
    p.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="SPEC",
        help="oracle | transformers:CKPT_DIR | openai:URL[@MODEL]; repeat to compare",
    )
    p.add_argument("--compare", nargs=2, metavar="SPEC", help="two backends side by side")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--limit", type=int, default=0, help="score at most N records (0: all)")
    p.add_argument("--max-tokens", type=int, default=2048, help="new tokens per answer")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--seed", type=int, default=None, help="sampling seed")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight per backend")
    p.add_argument("--timeout", type=float, default=300.0, help="HTTP request timeout (s)")
    p.add_argument("--min-pixels", type=int, default=0, help="frame lower bound (0: checkpoint's)")
    p.add_argument("--max-pixels", type=int, default=0, help="frame upper bound (0: checkpoint's)")
    p.add_argument("--image-root", default="", help="override of the records' image root")
    p.add_argument("--device", default="", help="device of in-process models (default: auto)")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tqdm bars on stderr (default: when stderr is a terminal)",
    )
    return p


def _config(args: argparse.Namespace) -> BenchmarkConfig:
    backends = list(args.backend) + list(args.compare or [])
    if not backends:
        raise BenchmarkError("name a backend: --backend oracle|transformers:CKPT|openai:URL[@M]")
    for flag, value in (
        ("--max-tokens", args.max_tokens),
        ("--concurrency", args.concurrency),
    ):
        if value < 1:
            raise BenchmarkError(f"{flag} must be >= 1, got {value}")
    if args.limit < 0:
        raise BenchmarkError(f"--limit must be >= 0, got {args.limit}")
    if args.temperature < 0 or args.timeout <= 0 or args.min_pixels < 0 or args.max_pixels < 0:
        raise BenchmarkError(
            "--temperature, --min-pixels and --max-pixels must be >= 0, --timeout > 0"
        )
    return BenchmarkConfig(
        data=args.data,
        split=args.split,
        backends=backends,
        out=args.out,
        limit=args.limit,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        min_pixels=args.min_pixels,
        max_pixels=args.max_pixels,
        image_root=args.image_root,
        device=args.device,
    )


def _prepare_out(out: str) -> Path:
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as e:
        raise BenchmarkError(f"--out {path}: cannot write there ({e.strerror or e})") from e
    return path


def _fail(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return 2


def main(argv: list[str] | None = None) -> int:
    """``python -m train.benchmark`` / ``python -m train evaluate``; 2 on user mistakes.

    Returns:
        0 on success, 1 when a backend answered no request at all, 2 on a user mistake.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    configure_logging()
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        cfg = _config(args)
        specs = [parse_backend_spec(s) for s in cfg.backends]
        records, image_root, split = load_benchmark_records(cfg.data, cfg.split, cfg.image_root)
        out = _prepare_out(cfg.out)
        specs = [resolve_model(s, cfg.timeout_s) for s in specs]
    except BenchmarkError as e:
        return _fail(str(e))
    records = select_records(records, cfg.limit)
    transitions, skipped = true_transitions(records, image_root, progress=progress)
    for rid, reason in sorted(skipped.items()):
        log.warning("left out %s: %s", rid, reason)
    header = {
        "command": "python -m train.benchmark " + shlex.join(argv),
        "data": str(cfg.data),
        "split": split or "(all)",
        "records": len(records),
        "scored": len(transitions),
        "skipped": len(skipped),
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
    }
    results: list[BackendResult] = []
    status = 0
    for spec, name in zip(specs, _unique_names(specs), strict=True):
        try:
            predictor = build_predictor(spec, cfg, image_root, name)
        except BenchmarkError as e:
            return _fail(str(e))
        result = run_benchmark(
            records,
            predictor,
            transitions,
            spec=spec.label,
            concurrency=cfg.concurrency,
            progress=progress,
        )
        errors = sum(1 for r in result.rows if (r["failure"] or "").startswith("backend_"))
        if result.rows and errors == len(result.rows):
            log.error("%s answered none of the %d requests", name, errors)
            status = 1
        results.append(result)
        log.info(
            "%s: verdict accuracy %s, history well-formed %s",
            name,
            _pct(result.metrics["critique"]["verdict_accuracy"]),
            _pct(result.metrics["history"]["well_formed_rate"]),
        )
    write_run_description(out, cfg)
    _write_outputs(out, results, header, skipped)
    log.info("wrote %s", out / "report.md")
    return status


if __name__ == "__main__":
    sys.exit(main())
