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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from data_gen import audit, flywheel, split
from data_gen.annotator import TRANSIENT_REASONS, Annotator, offline_answer
from data_gen.config import DataGenConfig
from data_gen.executor import (
    Executor,
    Shard,
    ShardError,
    StageIncomplete,
    merge_counts,
    summary_table,
)
from data_gen.export import ExportError, chains_within, export_dataset, out_of_bounds
from data_gen.ingest import IngestConfig, IngestError, ingest, ingest_complete
from data_gen.perturb import ElementIndex, GenParams, StepPlan, plan_corpus
from data_gen.perturb.grounding import ground_corpus
from data_gen.perturb.plan import UnreachableDimensionError, target_shares
from data_gen.step_unit import StepUnit
from data_gen.steps import STEP_CLASSES
from data_gen.steps.flow import StreamedStages
from data_gen.steps.work import (
    WORK_CODEC,
    Context,
    LoopThread,
    Work,
    critique_candidate,
    sample_id,
    step_view,
)
from hivig.actions import ActionError
from hivig.backends import build_backend
from hivig.backends.openai_client import OpenAIClient
from hivig.config import (
    ConfigError,
    add_config_arguments,
    config_to_dict,
    config_to_yaml,
    load_config,
    write_run_description,
)
from hivig.files import dumps_jsonl, write_atomic
from hivig.logging import configure_logging, get_logger
from hivig.profiles import ProfileError, resolve_profile
from hivig.taxonomy import DIMENSIONS
from hivig.trajectory import Trajectory, TrajectoryError, scan_trajectories

log = get_logger(__name__)

LOCK_POLL_S = 5.0
"""Seconds between checks while another shard holds the ingest lock."""
LOCK_LEASE_S = 300.0
"""Seconds without a heartbeat after which an ingest or merge lock counts as abandoned."""


# --------------------------------------------------------------------------------------------
# Setup


def trajectories_path(cfg: DataGenConfig) -> Path:
    """The trajectory file, ingesting the corpus first when there is none (idempotent)."""
    if cfg.trajectories:
        return Path(cfg.trajectories)
    inside = Path(cfg.corpus) / "trajectories.jsonl"
    if inside.exists():
        return inside
    ingested = Path(cfg.out) / "ingest" / "trajectories.jsonl"
    # Shards of an array job may start together: one ingests, the others wait for its
    # completion marker (a trajectories file alone may be what a killed ingest left behind).
    while not ingest_complete(ingested.parent):
        with file_lock(Path(cfg.out) / "ingest.lock") as held:
            if held and not ingest_complete(ingested.parent):
                log.info("no trajectories.jsonl given; ingesting %s", cfg.corpus)
                ingest(
                    cfg.corpus,
                    ingested.parent,
                    IngestConfig(verify_images=cfg.verify_images),
                    progress=False,
                )
        if not ingest_complete(ingested.parent):
            time.sleep(LOCK_POLL_S)
    return ingested


def _unusable(traj: Trajectory) -> tuple[str, str] | None:
    """Why a parsed trajectory cannot enter the pipeline, or ``None``."""
    for step in traj.steps:
        if not step.actions:
            return "step_without_actions", f"step {step.index} has no action"
        for action in step.actions:
            try:
                action.to_arguments()
            except ActionError as e:
                return "unrenderable_action", f"step {step.index}: {e}"
    return None


def _unwanted(cfg: DataGenConfig, traj: Trajectory) -> tuple[str, str] | None:
    """Why a usable trajectory is left out by the sampling config, or ``None``."""
    if not cfg.keep_failed and traj.outcome != "success":
        # HiViG synthesises from successful trajectories; failed ones teach the critic that
        # a failing expert's steps are Good (set keep_failed=true to use them anyway).
        return "not_successful", f"outcome {traj.outcome} (keep_failed=false)"
    return None


def load_work(cfg: DataGenConfig) -> tuple[list[Work], list[dict[str, Any]]]:
    """All usable trajectories as work items in id order, and the quarantined input lines.

    Unreadable lines, trajectories with an unusable step and duplicate ids are quarantined with
    a reason (``out/input_quarantine.jsonl``), never silently skipped. Trajectories that an
    episode sidecar names are the agent's runs (``data_gen.flywheel``), routed by their
    evaluated outcome; ``load_work_and_runs`` also returns their accounting.
    """
    works, quarantine, _ = load_work_and_runs(cfg)
    return works, quarantine


def _scan(
    path: Path,
    trajs: dict[str, Trajectory],
    quarantine: list[dict[str, Any]],
    lines: dict[str, int],
    prefix: str = "",
) -> None:
    for line, item in scan_trajectories(path):
        if isinstance(item, TrajectoryError):
            quarantine.append({"line": line, "reason": item.reason, "message": item.message})
            continue
        problem = _unusable(item) or (
            ("duplicate_id", "id already used") if item.id in trajs else None
        )
        if problem is not None:
            quarantine.append(
                {"line": line, "id": item.id, "reason": problem[0], "message": problem[1]}
            )
            continue
        trajs[item.id] = flywheel.rebase(item, prefix)
        lines[item.id] = line


def load_work_and_runs(
    cfg: DataGenConfig,
) -> tuple[list[Work], list[dict[str, Any]], flywheel.RunLedger]:
    """``load_work`` plus the run ledger (``out/runs.json``)."""
    trajs: dict[str, Trajectory] = {}
    quarantine: list[dict[str, Any]] = []
    lines: dict[str, int] = {}
    path = trajectories_path(cfg)
    _scan(path, trajs, quarantine, lines)
    ledger = flywheel.RunLedger()
    sidecars: dict[str, dict[str, Any]] = {}
    if cfg.runs.enabled:
        extra = runs_trajectories_path(cfg)
        if extra is not None:
            prefix = os.path.relpath(Path(cfg.runs.corpus).resolve(), Path(cfg.corpus).resolve())
            _scan(extra, trajs, quarantine, lines, Path(prefix).as_posix())
        sidecars = flywheel.load_sidecars(flywheel.sidecar_folder(cfg.runs), ledger)
    chosen: list[tuple[Trajectory, dict[str, Any], list[StepUnit]]] = []
    for tid in sorted(trajs):
        traj = trajs[tid]
        side = sidecars.get(tid)
        if side is None:
            problem = _unwanted(cfg, traj)
            if problem is None:
                chosen.append((traj, {}, [StepUnit(k) for k in range(len(traj.steps))]))
            else:
                quarantine.append(
                    {"line": lines[tid], "id": tid, "reason": problem[0], "message": problem[1]}
                )
            continue
        routed = flywheel.route_run(traj, side, cfg.runs.hard_cases)
        if isinstance(routed[0], str):
            reason, message = routed  # type: ignore[misc]
            ledger.trajectories[reason] += 1
            ledger.steps[f"dropped_{reason}"] += len(traj.steps)
            quarantine.append({"line": lines[tid], "id": tid, "reason": reason, "message": message})
            continue
        chosen.append(routed)  # type: ignore[arg-type]
    chosen = _mix(cfg, chosen, trajs, ledger, quarantine)
    if cfg.max_trajectories:
        chosen = chosen[: cfg.max_trajectories]
    e = cfg.export
    # The rule and the key set of `data_gen split`: every episode of the file, ranked, plus the
    # benchmark tasks of the agent's runs (a run's split is drawn from its task).
    keys = split.episode_keys(path) | {flywheel.split_key(t, o) for t, o, _ in chosen if o}
    where = split.assign_episodes(keys, split.SplitConfig(e.val_share, e.test_share, cfg.seed))
    works = [Work(t, where[flywheel.split_key(t, o)], u, o) for t, o, u in chosen]
    if quarantine:
        log.warning(
            "quarantined %d input trajectories (see input_quarantine.jsonl)", len(quarantine)
        )
    return works, quarantine, ledger


def _mix(
    cfg: DataGenConfig,
    chosen: list[tuple[Trajectory, dict[str, Any], list[StepUnit]]],
    trajs: dict[str, Trajectory],
    ledger: flywheel.RunLedger,
    quarantine: list[dict[str, Any]],
) -> list[tuple[Trajectory, dict[str, Any], list[StepUnit]]]:
    """``chosen`` without the runs beyond ``runs.mix_ratio``; counts the kept runs."""
    runs = [t.id for t, o, _ in chosen if o]
    scalecua = len(chosen) - len(runs)
    surplus = flywheel.mix_surplus_runs(runs, scalecua, cfg.runs.mix_ratio, cfg.seed)
    kept = []
    for traj, origin, units in chosen:
        if traj.id in surplus:
            ledger.trajectories["mix_ratio"] += 1
            ledger.steps["dropped_mix_ratio"] += len(trajs[traj.id].steps)
            ratio = cfg.runs.mix_ratio
            quarantine.append(
                {"id": traj.id, "reason": "mix_ratio", "message": f"beyond runs.mix_ratio={ratio}"}
            )
            continue
        if origin:
            ledger.trajectories[f"kept_{origin['outcome']}"] += 1
            flywheel.count_steps(ledger, traj, origin, len(trajs[traj.id].steps))
        kept.append((traj, origin, units))
    return kept


def build_plan(
    cfg: DataGenConfig, works: list[Work], elements: ElementIndex, offline: bool
) -> dict[str, StepPlan]:
    """The corpus-wide perturbation and masking plan (identical in every shard)."""
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


def runs_trajectories_path(cfg: DataGenConfig) -> Path | None:
    """The run trajectories to add to ``corpus``'s, ingesting ``runs.corpus`` when needed;
    ``None`` when ``runs.corpus`` is ``corpus`` (its trajectories are the main ones)."""
    r = cfg.runs
    if Path(r.corpus).resolve() == Path(cfg.corpus).resolve():
        return None
    if r.trajectories:
        return Path(r.trajectories)
    inside = Path(r.corpus) / "trajectories.jsonl"
    if inside.exists():
        return inside
    ingested = Path(cfg.out) / "ingest_runs"
    while not ingest_complete(ingested):
        with file_lock(Path(cfg.out) / "ingest_runs.lock") as held:
            if held and not ingest_complete(ingested):
                log.info("ingesting the runs corpus %s", r.corpus)
                ingest(
                    r.corpus,
                    ingested,
                    IngestConfig(verify_images=cfg.verify_images),
                    progress=False,
                )
        if not ingest_complete(ingested):
            time.sleep(LOCK_POLL_S)
    return ingested / "trajectories.jsonl"


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
    while not grounded.exists():
        with file_lock(Path(cfg.out) / "grounding.lock") as held:
            if held and not grounded.exists():
                elements = _ground(cfg, works, annotator, loop, sidecar)
                write_atomic(grounded, elements.to_jsonl())
        if not grounded.exists():
            time.sleep(LOCK_POLL_S)
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


def gen_params(cfg: DataGenConfig) -> GenParams:
    """Generator knobs from the config."""
    return GenParams(cfg.perturb.near_miss_margin, cfg.perturb.scroll_shrink)


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


OPERATIONAL_FIELDS = (
    "out",
    "annotator.cache_dir",
    "annotator.cache_offline",
    "annotator.frame_cache_mb",
    "annotator.prefetch",
    "annotator.outage_wait_s",
    "annotator.prepare_threads",
    "annotator.backend.base_url",
    "annotator.backend.api_key_env",
    "annotator.backend.concurrency",
    "annotator.backend.timeout_s",
    "annotator.backend.max_retries",
    "annotator.backend.backoff_s",
)
"""Config fields that change how a run goes, never what it writes; a resume may change them."""

MERGE_ONLY_FIELDS = ("export.report_cards", "export.sharegpt", "export.max_tokens")
"""Fields read only by the merge; changing them on a resume just re-runs the export (the
export's input digest covers the whole config). ``export.val_share`` and ``test_share`` are not
among them: the split of every work item is fixed when the stages run."""


def resume_fingerprint(cfg: DataGenConfig) -> dict[str, Any]:
    """The config fields that determine the stage outputs, flattened to dotted keys."""
    skip = set(OPERATIONAL_FIELDS) | set(MERGE_ONLY_FIELDS)
    out = {k: v for k, v in _flatten(config_to_dict(cfg)).items() if k not in skip}
    if cfg.profile:
        # The folder's content decides the samples, not its path.
        out["profile"] = resolve_profile(cfg.profile).digest
    return out


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value and not name.endswith("_weights"):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


OUTPUT_FORMAT = 2
"""Version of the layout of an output folder (work files, plan, markers). Version 1 folders
(no ``format.json``) were written before successful-only sampling and paired masking; their
work files do not resume under this code."""


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


def log_estimate(cfg: DataGenConfig, shard: Shard, works: list[Work], ctx: Context) -> None:
    """Log what the shard will send, per stage, before it sends anything."""
    from data_gen.estimate import estimate_for, estimate_table  # it builds on this module

    est = estimate_for(cfg, works, ctx.plan, ctx.history_pairs)
    log.info(
        "shard %s will send (estimate from the plan):\n%s",
        shard.name,
        "\n".join(estimate_table(est)),
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


def check_out(cfg: DataGenConfig) -> None:
    """Refuse an ``out`` that cannot be written, or that an older version wrote.

    Raises:
        ConfigError: Naming the folder and the fix.
    """
    out = Path(cfg.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create `out` folder {out}: {e.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"`out` folder {out} is not writable")
    marker = out / "format.json"
    if (out / "config.yaml").exists():
        try:
            found = json.loads(marker.read_text(encoding="utf-8")).get("format")
        except (OSError, ValueError, AttributeError):
            found = 1
        if found != OUTPUT_FORMAT:
            raise ConfigError(
                f"{out} was written by an older hivig (output format {found}, this one writes "
                f"{OUTPUT_FORMAT}); write to a new `out` (paid answers stay usable with "
                f"annotator.cache_dir={cfg.annotator.cache_dir or out / 'cache'})"
            )
    write_atomic(marker, json.dumps({"format": OUTPUT_FORMAT}) + "\n")


def check_resume(cfg: DataGenConfig) -> None:
    """Record the config in ``out/config.yaml``, refusing a resume that would change outputs.

    Only the fields of ``resume_fingerprint`` must match the recorded run: concurrency,
    timeouts, retries, the endpoint address and the cache location may change between reruns,
    and export options only re-run the merge. Shards of one array job write the same text
    atomically, so concurrent starts agree.

    Raises:
        ConfigError: An output-changing field differs; the message names the fields.
    """
    path, text = Path(cfg.out) / "config.yaml", config_to_yaml(cfg)
    if path.exists():
        before = resume_fingerprint(load_config(DataGenConfig, path))
        now = resume_fingerprint(cfg)
        changed = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
        if changed:
            cache = Path(cfg.annotator.cache_dir or Path(cfg.out) / "cache")
            raise ConfigError(
                f"{cfg.out} holds a run with a different config ({', '.join(changed)} "
                "changed); write to a new `out`, keeping the paid annotator answers with "
                f"annotator.cache_dir={cache}"
            )
    write_atomic(path, text)


# --------------------------------------------------------------------------------------------
# Merge


@contextlib.contextmanager
def file_lock(path: Path, lease_s: float = LOCK_LEASE_S) -> Iterator[bool]:
    """Exclusive right to a one-off job (ingest, merge): yields True for the one holder.

    Shards run on many hosts over a shared filesystem, where a process id says nothing about
    another host. The lock file therefore names ``host:pid`` and works as a lease: while held,
    a heartbeat refreshes its mtime every ``lease_s / 4`` seconds, and a lock whose mtime is
    older than ``lease_s`` (a crashed or killed holder on any host) is taken over.

    Args:
        path: The lock file.
        lease_s: Seconds without a heartbeat after which the lock counts as abandoned.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _lock_is_stale(path, lease_s):
                path.unlink(missing_ok=True)
                continue
            yield False
            return
        os.write(fd, lock_owner().encode())
        os.close(fd)
        stop = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(path, lease_s / 4, stop), daemon=True)
        beat.start()
        try:
            yield True
        finally:
            stop.set()
            beat.join()
            path.unlink(missing_ok=True)
        return
    yield False


def lock_owner() -> str:
    """``host:pid`` of this process, as written into lock files."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _heartbeat(path: Path, every_s: float, stop: threading.Event) -> None:
    while not stop.wait(every_s):
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)


def _lock_is_stale(path: Path, lease_s: float) -> bool:
    """Whether the lock's lease ran out, or its holder is a dead process on this host."""
    try:
        age = time.time() - path.stat().st_mtime
        owner = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return True  # released meanwhile: try again
    if age > lease_s:
        return True
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        # Another host's process cannot be probed from here; only its lease can expire.
        # A lock still being written (empty or half a name) is fresh, so it is respected.
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, owned by another user
    return False


def _inputs_digest(cfg: DataGenConfig, executor: Executor[Work], shards: list[Shard]) -> str:
    """Digest of everything the export reads: config, every stage's output and exclusions."""
    h = hashlib.sha256(config_to_yaml(cfg).encode("utf-8"))
    for shard in shards:
        for step in executor.steps:
            for path in (
                executor.marker_path(shard, step.name),
                executor.output_path(shard, step.name),
                executor.exclusion_path(shard, step.name),
            ):
                h.update(path.read_bytes())
    return h.hexdigest()


def merge(
    cfg: DataGenConfig,
    executor: Executor[Work],
    count: int,
    annotator: Annotator,
    input_quarantined: int = 0,
) -> dict[str, Any] | None:
    """Export the dataset once every shard of ``count`` is complete; ``None`` if not yet."""
    shards = [Shard(i, count) for i in range(count)]
    if not all(executor.is_done(s) for s in shards):
        missing = [s.name for s in shards if not executor.is_done(s)]
        log.info("not merging yet: %d shards unfinished (%s ...)", len(missing), missing[0])
        return None
    with file_lock(Path(cfg.out) / "merge.lock") as held:
        if not held:
            log.info("another process is merging")
            return None
        digest = _inputs_digest(cfg, executor, shards)
        marker, dataset = Path(cfg.out) / "completions" / "export.json", Path(cfg.out) / "dataset"
        done = marker.exists() and (dataset / "stats.json").exists()
        if done and json.loads(marker.read_text(encoding="utf-8")).get("inputs") == digest:
            log.info("export is up to date with every shard's output; nothing to do")
            return json.loads((dataset / "stats.json").read_text(encoding="utf-8"))
        works = sorted((w for s in shards for w in executor.load_output(s)), key=lambda w: w.id)
        per_shard = [executor.load_counters(s) for s in shards]
        counters = {
            step.name: merge_counts(c.get(step.name, {}) for c in per_shard)
            for step in executor.steps
        }
        run = {
            "annotator": annotator.describe(),
            "input_trajectories_quarantined": input_quarantined,
            "configured": {
                "critique_intent_mask_rate": cfg.rationale.intent_mask_rate,
                "history_intent_mask_rate": cfg.history.intent_mask_rate,
                "min_dimension_share": cfg.perturb.min_share,
                "dimension_target_shares": target_shares(
                    cfg.perturb.weights_by_name(), cfg.perturb.min_share
                ),
            },
        }
        stats = export_dataset(cfg, works, counters, executor.merged_exclusions(shards), run)
        write_atomic(marker, json.dumps({"inputs": digest}) + "\n")
        log.info(
            "dataset written to %s\n%s", Path(cfg.out) / "dataset", summary_table(stats["stages"])
        )
        return stats


# --------------------------------------------------------------------------------------------
# Entry point


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line arguments of ``python -m data_gen run``."""
    parser = argparse.ArgumentParser(
        prog="python -m data_gen run",
        description=__doc__.split("\n")[0],
        epilog="example: python -m data_gen run --config configs/data_gen/demo.yaml "
        "corpus=CORPUS out=OUT annotator.backend.concurrency=16 (--dry-run prints every key "
        "and the annotator requests the run will send)",
    )
    add_config_arguments(parser, example="annotator.backend.concurrency=16")
    parser.add_argument("--shard", default=None, help="run shard i of N (i/N); default: all, 0/1")
    parser.add_argument(
        "--merge", action="store_true", help="only merge finished shards and export"
    )
    return parser.parse_args(argv)


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


def read_config(path: str | None, overrides: list[str]) -> DataGenConfig:
    """``load_config`` with every way a config file can be unusable as a ``ConfigError``.

    Raises:
        ConfigError: The file is missing, unreadable, not YAML, or does not fit the schema.
    """
    try:
        return load_config(DataGenConfig, path, overrides)
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path} is not valid YAML: {' '.join(str(e).split())}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config {path} is not UTF-8 text") from None
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid config {path}: {e}") from None


def main(argv: list[str]) -> int:
    """``python -m data_gen run``; returns the process exit code."""
    args = parse_args(argv)
    try:
        cfg = read_config(args.config, args.overrides)
        if args.dry_run:
            from data_gen.estimate import estimate_text  # it builds on this module

            sys.stdout.write(config_to_yaml(cfg))
            sys.stdout.write(estimate_text(cfg))
            return 0
        shard = Shard.parse(args.shard) if args.shard else None
        configure_logging()
        run(cfg, shard, args.merge)
    except (
        ConfigError,
        ShardError,
        UnreachableDimensionError,
        PlanOffTargetError,
        IngestError,
    ) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    except ExportError as e:
        sys.stderr.write(f"error: {e}\n")
        return 1
    except StageIncomplete as e:
        # Not a crash: the finished work is kept and a rerun picks up the rest.
        sys.stderr.write(f"incomplete: {e}\n")
        return 3
    return 0
