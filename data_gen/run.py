"""The synthesis pipeline: transitions, macro history, perturbation, judge, rationales, export.

    # whole corpus in one process, offline annotator (no model):
    python -m data_gen run --config configs/data_gen/demo.yaml corpus=CORPUS out=OUT
    # one shard of a SLURM array against a vLLM endpoint (the last shard to finish merges):
    python -m data_gen run --config configs/data_gen/default.yaml corpus=C out=O --shard 3/16
    # merge only (after every shard has finished), and the resolved config:
    python -m data_gen run --config configs/data_gen/default.yaml corpus=C out=O --merge --shard 0/8
    python -m data_gen run --config configs/data_gen/default.yaml corpus=C out=O --dry-run

Reruns resume: finished (shard, stage) pairs are loaded from their completion markers, paid
annotator requests come from the on-disk cache, and the export is rewritten deterministically.

Temporary endpoint failures (timeouts, dropped connections, HTTP 429 and 5xx after the client's
own retries) never become permanent drops: the stage is left unfinished, the command exits with
status 3, and running it again retries only what failed (everything else is a cache hit).

This module runs the parts in order; each lives in its own module: ``data_gen.inputs`` (the
work items and their splits), ``data_gen.planning`` (the corpus-wide plan), ``data_gen.steps``
(the stages, run by ``data_gen.executor``), ``data_gen.merge`` (the export once every shard is
done), ``data_gen.resume`` (what a rerun in the same ``out`` must match), ``data_gen.cli_run``
(the command line) and ``hivig.locks`` (the lock of the one-off jobs shards share).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from data_gen import audit
from data_gen.annotator import TRANSIENT_REASONS, Annotator, offline_answer
from data_gen.cli_run import main, parse_args, read_config
from data_gen.config import DataGenConfig
from data_gen.estimate import log_estimate
from data_gen.executor import Executor, Shard, StageIncomplete
from data_gen.inputs import load_work, load_work_and_runs, trajectories_path
from data_gen.merge import merge
from data_gen.perturb import ElementIndex
from data_gen.perturb.grounding import ground_corpus
from data_gen.planning import (
    PlanOffTargetError,
    build_plan,
    check_plan,
    gen_params,
    plan_history,
)
from data_gen.resume import check_out, check_resume
from data_gen.steps import STEP_CLASSES
from data_gen.steps.flow import StreamedStages
from data_gen.steps.work import WORK_CODEC, Context, LoopThread, Work
from hivig.backends import build_backend
from hivig.backends.openai_client import OpenAIClient
from hivig.config import ConfigError, write_run_description
from hivig.files import dumps_jsonl, write_atomic
from hivig.locks import run_once
from hivig.logging import get_logger
from hivig.profiles import ProfileError, resolve_profile

__all__ = [
    "PlanOffTargetError",
    "build_annotator",
    "build_plan",
    "gen_params",
    "load_work",
    "load_work_and_runs",
    "main",
    "make_context",
    "parse_args",
    "read_config",
    "run",
    "trajectories_path",
]

log = get_logger(__name__)


# --------------------------------------------------------------------------------------------
# Setup


def load_elements(
    cfg: DataGenConfig, works: list[Work], annotator: Annotator, loop: LoopThread
) -> ElementIndex:
    """The element boxes of the run: the sidecar, annotator grounding, or both (see
    ``PerturbConfig.element_source``).

    Grounding covers the whole corpus, because the plan is global, but runs once per output
    folder: the first shard grounds and saves ``grounding/elements.jsonl``, the other shards of
    the array wait for that file and read it instead of paying for every request again.

    Raises:
        StageIncomplete: Grounding requests failed with temporary endpoint errors (rerun).
    """
    path = Path(cfg.corpus) / cfg.elements_file
    sidecar = ElementIndex.load(path)
    source = cfg.perturb.element_source
    if source == "sidecar" or (source == "auto" and path.exists()):
        return sidecar
    # `annotator`: the sidecar, if any, is only the offline annotator's ground truth.
    grounded = Path(cfg.out) / "grounding" / "elements.jsonl"

    def job() -> None:
        write_atomic(grounded, _ground(cfg, works, annotator, loop, sidecar).to_jsonl())

    run_once(Path(cfg.out) / "grounding.lock", grounded.exists, job)
    return ElementIndex.load(grounded)


def _ground(
    cfg: DataGenConfig,
    works: list[Work],
    annotator: Annotator,
    loop: LoopThread,
    sidecar: ElementIndex,
) -> ElementIndex:
    elements = ElementIndex()
    counts = ground_corpus(
        [w.trajectory for w in works],
        elements,
        annotator,
        lambda coros: loop.run_all(coros, limit=max(1, annotator.jobs_in_flight)),
        sidecar,
    )
    write_atomic(Path(cfg.out) / "grounding.json", json.dumps(dict(sorted(counts.items()))))
    log.info("grounding: %s", json.dumps(dict(sorted(counts.items()))))
    temporary = {k: n for k, n in counts.items() if k.removeprefix("dropped_") in TRANSIENT_REASONS}
    if temporary:
        raise StageIncomplete(
            f"grounding left unfinished, temporary errors {temporary}; run the same command "
            "again to retry (answers already received are cached)"
        )
    return elements


def build_annotator(cfg: DataGenConfig) -> Annotator:
    """The annotator the config describes (offline writer or OpenAI-compatible endpoint)."""
    a = cfg.annotator
    offline = a.backend.kind == "offline"
    cache = None
    if not offline or a.cache_offline:
        cache = Path(a.cache_dir) if a.cache_dir else Path(cfg.out) / "cache"
    backend = None if offline else build_backend(a.backend)
    if isinstance(backend, OpenAIClient):
        # The transport format is an annotator choice (see AnnotatorConfig.image_format), not
        # part of the shared backend config, so the critic keeps lossless PNG.
        backend.image_format = "jpeg" if a.image_format == "jpeg" else "png"
        backend.jpeg_quality = a.jpeg_quality
    return Annotator(
        a.backend,
        cfg.frame,
        Path(cfg.corpus),
        cache,
        a.max_attempts,
        backend=backend,
        offline=offline_answer if offline else None,
        frame_cache_bytes=a.frame_cache_mb << 20,
        prefetch=a.prefetch,
        prepare_threads=a.prepare_threads,
        outage_wait_s=a.outage_wait_s,
    )


def make_context(
    cfg: DataGenConfig,
    works: list[Work],
    elements: ElementIndex,
    annotator: Annotator,
    loop: LoopThread,
) -> Context:
    """What the stages share: the corpus-wide plan (refused here if it misses the dimension
    bounds), the planned history cap, the profile, the annotator and its loop.

    Raises:
        PlanOffTargetError: See ``check_plan``.
    """
    plan = build_plan(cfg, works, elements, annotator.is_offline)
    check_plan(cfg, plan, works)
    return Context(
        cfg,
        Path(cfg.corpus),
        annotator,
        elements,
        plan,
        gen_params(cfg),
        loop,
        resolve_profile(cfg.profile),
        plan_history(cfg, works, plan),
    )


def check_profile(cfg: DataGenConfig) -> None:
    """Refuse a ``profile`` folder that is missing or invalid, in one line, before any work."""
    try:
        resolve_profile(cfg.profile)
    except ProfileError as e:
        raise ConfigError(f"`profile`: {e}") from None


def check_corpus(cfg: DataGenConfig) -> None:
    """Refuse a missing corpus, or one with neither ``meta.json`` nor ``trajectories.jsonl``.

    Raises:
        ConfigError: Naming the folder and what it lacks.
    """
    corpus = Path(cfg.corpus)
    if cfg.trajectories:
        if not Path(cfg.trajectories).is_file():
            raise ConfigError(f"`trajectories` file {cfg.trajectories} does not exist")
        if not corpus.is_dir():
            raise ConfigError(f"`corpus` folder {corpus} does not exist")
        return
    if not corpus.is_dir():
        raise ConfigError(f"`corpus` folder {corpus} does not exist (override: corpus=DIR)")
    if not (corpus / "meta.json").is_file() and not (corpus / "trajectories.jsonl").is_file():
        raise ConfigError(
            f"`corpus` folder {corpus} holds neither meta.json (a ScaleCUA-format corpus) nor "
            "trajectories.jsonl (ingest output)"
        )


# --------------------------------------------------------------------------------------------
# The run


def run(cfg: DataGenConfig, shard: Shard | None, merge_only: bool = False) -> dict[str, Any] | None:
    """Run the pipeline for ``shard`` (all of the corpus when ``None``) and merge when complete."""
    cfg.require_paths()
    check_profile(cfg)
    check_corpus(cfg)
    check_out(cfg)
    check_resume(cfg)
    shard = shard or Shard(0, 1)
    # The annotator (endpoint, key variable, transport) is checked before any ingest work.
    annotator = build_annotator(cfg)
    # Host, git revision, package versions and SLURM ids of this process, per shard.
    write_run_description(Path(cfg.out) / "runs" / shard.name, cfg)
    works, quarantine, ledger = load_work_and_runs(cfg)
    write_atomic(Path(cfg.out) / "input_quarantine.jsonl", dumps_jsonl(quarantine))
    if cfg.runs.enabled:
        write_atomic(Path(cfg.out) / "runs.json", json.dumps(ledger.to_json(), indent=1))
    if not works:
        annotator.close()
        raise ConfigError(
            f"no usable trajectory in {cfg.corpus} ({len(quarantine)} quarantined, see "
            f"{Path(cfg.out) / 'input_quarantine.jsonl'}); check the corpus"
        )
    loop = LoopThread()
    try:
        elements = load_elements(cfg, works, annotator, loop)
        ctx = make_context(cfg, works, elements, annotator, loop)
        executor: Executor[Work] = Executor(
            cfg.out, [cls(ctx) for cls in STEP_CLASSES], WORK_CODEC, TRANSIENT_REASONS
        )
        if not merge_only:
            mine = [w for w in works if shard.owns(w.id)]
            log_estimate(cfg, shard, mine, ctx)
            if shard.count == 1:  # the one process that exports: its probes made ready
                audit.warm_up()  # while the annotator waits
            executor.run_shard(shard, mine, StreamedStages(ctx))
        counts = {**annotator.counts, **annotator.frames.counts}
        annotator.frames.clear()  # the shard is done; the export reads no annotator frame
        stats = merge(cfg, executor, shard.count, annotator, len(quarantine))
        log.info("annotator: %s", json.dumps(counts, sort_keys=True))
        return stats
    finally:
        try:
            if annotator.backend is not None and hasattr(annotator.backend, "aclose"):
                loop.run(annotator.backend.aclose())
        finally:
            loop.close()
            annotator.close()
