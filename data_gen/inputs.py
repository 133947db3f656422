"""The run's input: usable trajectories as work items, each with its split, and the quarantine.

Both trajectory files (the corpus's and an agent's runs', ``data_gen.flywheel``) are ingested
on the fly when the config names none; the shards of an array job that start together ingest
once (``hivig.locks.run_once``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from data_gen import flywheel, split
from data_gen.config import DataGenConfig
from data_gen.ingest import IngestConfig, ingest, ingest_complete
from data_gen.step_unit import StepUnit
from data_gen.steps.work import Work
from hivig.actions import ActionError
from hivig.locks import run_once
from hivig.logging import get_logger
from hivig.trajectory import Trajectory, TrajectoryError, scan_trajectories

log = get_logger(__name__)


def trajectories_path(cfg: DataGenConfig) -> Path:
    """The trajectory file, ingesting the corpus first when there is none (idempotent)."""
    if cfg.trajectories:
        return Path(cfg.trajectories)
    inside = Path(cfg.corpus) / "trajectories.jsonl"
    if inside.exists():
        return inside
    ingested = Path(cfg.out) / "ingest" / "trajectories.jsonl"

    def job() -> None:
        log.info("no trajectories.jsonl given; ingesting %s", cfg.corpus)
        ingest(
            cfg.corpus,
            ingested.parent,
            IngestConfig(verify_images=cfg.verify_images),
            progress=False,
        )

    # Shards of an array job may start together: one ingests, the others wait for its
    # completion marker (a trajectories file alone may be what a killed ingest left behind).
    run_once(Path(cfg.out) / "ingest.lock", lambda: ingest_complete(ingested.parent), job)
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

    def job() -> None:
        log.info("ingesting the runs corpus %s", r.corpus)
        ingest(r.corpus, ingested, IngestConfig(verify_images=cfg.verify_images), progress=False)

    run_once(Path(cfg.out) / "ingest_runs.lock", lambda: ingest_complete(ingested), job)
    return ingested / "trajectories.jsonl"
