"""The flywheel in ``data_gen run``: an agent's ingested runs next to ScaleCUA trajectories.

    python -m data_gen ingest-runs --format osworld --root RESULTS --out RUNS --diagnoses DIAG
    python -m data_gen run --config configs/data_gen/demo.yaml corpus=RUNS out=OUT runs.corpus=RUNS

A trajectory is a run when an episode sidecar names its id. What it becomes depends on the
sidecar's *evaluated* outcome (never on the agent's own ``terminate`` claim):

- ``success``: exactly a ScaleCUA trajectory (Good samples, macro history, perturbations).
- ``failure`` with a diagnosed root cause whose category maps onto a dimension
  (``data_gen.runs.diagnoses.CUADEBUG_TO_DIMENSION``): one real Bad sample at the root-cause
  step, the executed step itself, judged double-blind against diagnose's correction and
  annotated like a synthetic Bad. The steps before it are only its history; the steps after it
  are cut off and unused.
- anything else is left out with a reason: ``run_outcome_unknown``, ``no_diagnosis``,
  ``no_dimension``, ``root_cause_not_in_trajectory``, ``mix_ratio`` (beyond ``runs.mix_ratio``).

Splits are by task: every run of one benchmark task (successes and failures alike) lands in
the split its ``<benchmark>/<task id>`` hashes to.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_gen.executor import stable_int
from data_gen.perturb import BadStep
from data_gen.perturb.calls import render_calls
from data_gen.runs.config import RunsConfig
from data_gen.step_unit import StepUnit
from hivig.actions import space_for_platform
from hivig.taxonomy import dimension_by_key
from hivig.trajectory import Trajectory

REAL_METHOD = "real_run"
"""``BadStep.method`` of a real Bad: the agent's executed root-cause step, not a perturbation."""
HARD_GOOD_ON_ROOT = "critic_good_on_root_cause"
"""Hard-case tag: the recorded critic said Good on the step diagnosed as the root cause."""
HARD_BAD_ON_SUCCESS = "critic_bad_on_success"
"""Hard-case tag: the recorded critic said Bad on a step of a run that succeeded."""


@dataclass
class RunLedger:
    """Run trajectories and their steps, in = kept + Σ dropped for each."""

    trajectories: Counter[str] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)
    sidecars_unreadable: int = 0

    def to_json(self) -> dict[str, Any]:
        """``out/runs.json``."""
        t, s = self.trajectories, self.steps
        return {
            "trajectories": {
                "in": sum(t.values()),
                "kept": t["kept_success"] + t["kept_failure"],
                "dropped": {k: n for k, n in sorted(t.items()) if not k.startswith("kept_")},
                "kept_success": t["kept_success"],
                "kept_failure": t["kept_failure"],
            },
            "steps": {"in": sum(s.values()), **dict(sorted(s.items()))},
            "sidecars_unreadable": self.sidecars_unreadable,
        }


def load_sidecars(folder: Path, ledger: RunLedger) -> dict[str, dict[str, Any]]:
    """``{trajectory_id: sidecar}`` of every readable sidecar under ``folder``."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.rglob("*.json")):
        try:
            side = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            ledger.sidecars_unreadable += 1
            continue
        if isinstance(side, dict) and isinstance(side.get("trajectory_id"), str):
            out[side["trajectory_id"]] = side
        else:
            ledger.sidecars_unreadable += 1
    return out


def sidecar_folder(runs: RunsConfig) -> Path:
    """Where the sidecars are."""
    return Path(runs.sidecars) if runs.sidecars else Path(runs.corpus) / "episodes"


def rebase(traj: Trajectory, prefix: str) -> Trajectory:
    """The trajectory with screenshot paths relative to another corpus root (``prefix/...``)."""
    if prefix in ("", "."):
        return traj
    steps = [dataclasses.replace(s, screenshot=f"{prefix}/{s.screenshot}") for s in traj.steps]
    return dataclasses.replace(traj, steps=steps)


def split_key(traj: Trajectory, origin: dict[str, Any]) -> str:
    """What a split is drawn from: the benchmark task for runs, the episode otherwise."""
    if origin:
        return f"task:{origin['benchmark']}/{origin['task_id']}"
    return traj.episode_key


def _verdicts(side: dict[str, Any], wanted: str) -> list[int]:
    return sorted(
        {
            v["step"]
            for v in side.get("verdicts") or []
            if isinstance(v.get("step"), int) and str(v.get("verdict", "")).lower() == wanted
        }
    )


def _origin(side: dict[str, Any], outcome: str) -> dict[str, Any]:
    return {
        "source": "run",
        "benchmark": side.get("benchmark"),
        "task_id": side.get("task_id"),
        "episode": side.get("episode"),
        "outcome": outcome,
        "agent_model": side.get("agent_model"),
        "hard_cases": {},
    }


def route_run(
    traj: Trajectory, side: dict[str, Any], hard_cases: bool
) -> tuple[Trajectory, dict[str, Any], list[StepUnit]] | tuple[str, str]:
    """A run trajectory as ``(trajectory, origin, units)`` for the pipeline, or a drop reason.

    Returns:
        For a success: the trajectory with the evaluated outcome and one empty unit per step.
        For a failure: the trajectory cut after the root cause, whose unit carries the real
        ``bad`` step. Otherwise ``(reason, message)``.
    """
    outcome = side.get("outcome")
    if outcome == "success":
        origin = _origin(side, "success")
        if hard_cases:
            origin["hard_cases"] = {
                str(k): {"tag": HARD_BAD_ON_SUCCESS, "verdict": "Good"}
                for k in _verdicts(side, "bad")
                if k < len(traj.steps)
            }
        kept = dataclasses.replace(traj, outcome="success")
        return kept, origin, [StepUnit(k) for k in range(len(traj.steps))]
    if outcome != "failure":
        return "run_outcome_unknown", f"evaluated outcome {outcome!r}"
    diag = side.get("diagnosis")
    if not isinstance(diag, dict):
        return "no_diagnosis", "failed run without a diagnosis (ingest-runs --diagnoses)"
    if diag.get("dimension") is None:
        return "no_dimension", f"root cause {diag.get('l2')} has no clean dimension"
    r = diag.get("root_cause_index")
    if not isinstance(r, int) or not 0 <= r < len(traj.steps):
        return "root_cause_not_in_trajectory", f"root cause index {r!r}"
    cut = dataclasses.replace(traj, steps=list(traj.steps[: r + 1]), outcome="failure")
    origin = {**_origin(side, "failure"), "root_cause_index": r, "diagnosis": diag}
    if hard_cases and r in _verdicts(side, "good"):
        origin["hard_cases"] = {str(r): {"tag": HARD_GOOD_ON_ROOT, "verdict": "Bad"}}
    units = [StepUnit(k) for k in range(r + 1)]
    units[r].bad = real_bad(cut, r, diag)
    return cut, origin, units


def real_bad(traj: Trajectory, r: int, diag: dict[str, Any]) -> BadStep:
    """The executed root-cause step as a Bad step of the diagnosed dimension."""
    step = traj.steps[r]
    calls = [a.to_arguments() for a in step.actions]
    dim = dimension_by_key(diag["dimension"])
    return BadStep(
        dimension=dim.name,
        method=REAL_METHOD,
        generator="run",  # the agent's own step; the annotator and the judge confirm it
        intent=" ".join((step.intent or "").split()),
        text=render_calls(calls, space_for_platform(traj.platform)),
        calls=tuple(calls),
        note=f"diagnosed root cause: {diag.get('l2')} {diag.get('l2_name') or ''}".strip(),
        extra={"correction": diag.get("correction") or "", "diagnosis": diag.get("file")},
    )


def mix_surplus_runs(run_ids: list[str], scalecua: int, ratio: float, seed: int) -> set[str]:
    """Run trajectory ids beyond ``ratio`` runs per ScaleCUA trajectory (hash order)."""
    if ratio <= 0 or scalecua == 0:
        return set()
    quota = int(ratio * scalecua)
    ranked = sorted(run_ids, key=lambda i: stable_int(seed, i, "runs_mix"))
    return set(ranked[quota:])


def count_steps(ledger: RunLedger, traj: Trajectory, origin: dict[str, Any], full: int) -> None:
    """Account for a kept run's steps (``full``: the steps before any cut)."""
    if origin["outcome"] == "success":
        ledger.steps["success_steps"] += full
        return
    r = origin["root_cause_index"]
    ledger.steps["history_only"] += r
    ledger.steps["root_cause"] += 1
    ledger.steps["after_root_cause_unused"] += full - r - 1
