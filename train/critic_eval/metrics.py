"""Scoring: one prediction row per sample (``score_sample``), then every figure of a backend.

Ratios are in [0, 1] and ``None`` where their denominator is empty. Metric definitions are in
``docs/evaluation.md``.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hivig.contracts import ContractError, parse_critique, parse_history
from hivig.records import SFTRecord
from hivig.taxonomy import DIMENSIONS
from train.critic_eval.predictors import Answer
from train.critic_eval.truth import TRANSITIONS, transition_class

GOOD = "Good"
UNPARSED = "Unparsed"
"""Prediction column of the confusion matrices for answers that failed (parse or backend)."""
RUN_SOURCE = "run"
"""``provenance.source`` of samples from an agent's own runs (the rest: ``scalecua``)."""
UNKNOWN_BENCHMARK = "unknown"
"""``per_benchmark`` key of run samples whose benchmark was not recorded."""
DIMENSION_NAMES: tuple[str, ...] = tuple(d.name for d in DIMENSIONS)
VERDICT_LABELS: tuple[str, ...] = (GOOD, *DIMENSION_NAMES)
"""Rows of the critique confusion matrix: Good, then each Bad dimension."""


@dataclass
class BackendResult:
    """One backend's rows and metrics."""

    name: str
    spec: str
    rows: list[dict[str, Any]]
    metrics: dict[str, Any]


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
        # Where the sample came from: the flywheel's real-run steps score apart from ScaleCUA's.
        "source": record.provenance.source,
        "benchmark": record.provenance.benchmark,
        "hard_case": record.provenance.hard_case,
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
        **_slices(rows, _critique_group),
        "confusion": _confusion(rows, VERDICT_LABELS, _verdict_label),
    }


def _slices(
    rows: Sequence[dict[str, Any]], group: Callable[[Sequence[dict[str, Any]]], dict[str, Any]]
) -> dict[str, Any]:
    """``group`` per platform, source, run benchmark, hard cases and intent masking; failures."""
    platforms = sorted({r["platform"] for r in rows})
    sources = sorted({r["source"] for r in rows})
    runs = [r for r in rows if r["source"] == RUN_SOURCE]
    benchmarks = sorted({r["benchmark"] or UNKNOWN_BENCHMARK for r in runs})
    return {
        "per_platform": {p: group([r for r in rows if r["platform"] == p]) for p in platforms},
        "per_source": {s: group([r for r in rows if r["source"] == s]) for s in sources},
        "per_benchmark": {
            b: group([r for r in runs if (r["benchmark"] or UNKNOWN_BENCHMARK) == b])
            for b in benchmarks
        },
        # The recorded critic's own mistakes: the samples a retrained critic most needs to fix.
        "hard_cases": group([r for r in rows if r["hard_case"]]),
        "intent": {
            "masked": group([r for r in rows if r["intent_masked"]]),
            "unmasked": group([r for r in rows if not r["intent_masked"]]),
        },
        "failures": _failure_counts(rows),
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
        **_slices(rows, _history_group),
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
