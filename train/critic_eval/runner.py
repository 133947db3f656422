"""One evaluation run: read the records, find their true transitions, answer and score them with
each backend in turn, and write the outputs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from hivig.config import write_run_description
from hivig.logging import get_logger
from hivig.records import SFTRecord
from train.critic_eval.config import CriticEvalConfig
from train.critic_eval.loading import load_eval_records, select_records
from train.critic_eval.metrics import BackendResult, compute_metrics, score_sample
from train.critic_eval.predictors import Answer, Predictor, predict_all
from train.critic_eval.report import percent, prepare_out, write_outputs
from train.critic_eval.specs import build_predictor, parse_backend_spec, resolve_model, unique_names
from train.critic_eval.truth import true_transitions

log = get_logger(__name__)


def run(cfg: CriticEvalConfig, *, command: str, progress: bool = False) -> int:
    """Score every backend of ``cfg`` on the same records and write the outputs to ``cfg.out``.

    Args:
        cfg: The validated settings.
        command: The command line, recorded in ``metrics.json`` and ``report.md``.
        progress: Show tqdm bars (stderr).

    Returns:
        0, or 1 when a backend answered none of its requests.

    Raises:
        CriticEvalError: A user mistake. The data, backend specs and output folder are checked
            before any image is decoded; a checkpoint that cannot load fails when its turn comes.
    """
    specs = [parse_backend_spec(s) for s in cfg.backends]
    records, image_root, split = load_eval_records(cfg.data, cfg.split, cfg.image_root)
    out = prepare_out(cfg.out)
    specs = [resolve_model(s, cfg.timeout_s) for s in specs]
    records = select_records(records, cfg.limit)
    transitions, skipped = true_transitions(records, image_root, progress=progress)
    for rid, reason in sorted(skipped.items()):
        log.warning("left out %s: %s", rid, reason)
    header = {
        "command": command,
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
    for spec, name in zip(specs, unique_names(specs), strict=True):
        predictor = build_predictor(spec, cfg, image_root, name)
        result = evaluate_predictor(
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
            percent(result.metrics["critique"]["verdict_accuracy"]),
            percent(result.metrics["history"]["well_formed_rate"]),
        )
    write_run_description(out, cfg)
    write_outputs(out, results, header, skipped)
    log.info("wrote %s", out / "report.md")
    return status


def evaluate_predictor(
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


async def _answer(
    predictor: Predictor, records: Sequence[SFTRecord], concurrency: int, progress: bool
) -> list[Answer]:
    try:
        return await predict_all(predictor, records, concurrency=concurrency, progress=progress)
    finally:
        await predictor.aclose()
