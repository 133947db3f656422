"""``runs``: the agent's own ingested runs in a ``data_gen run`` (the flywheel).

    # runs only (the corpus is an ingest-runs folder):
    python -m data_gen run --config configs/data_gen/demo.yaml corpus=RUNS out=OUT \
        runs.corpus=RUNS
    # ScaleCUA data mixed with one run episode per four ScaleCUA trajectories:
    python -m data_gen run --config configs/data_gen/default.yaml corpus=SCALECUA out=OUT \
        runs.corpus=RUNS runs.mix_ratio=0.25
"""

from __future__ import annotations

from dataclasses import dataclass

from hivig.config import ConfigError


@dataclass
class RunsConfig:
    """Where the agent's runs are and how much of them enters the dataset."""

    corpus: str = ""
    """An ``ingest-runs`` output folder (``meta.json``, ``data/``, ``episodes/``); empty: no
    runs. It may be ``corpus`` itself (runs only); otherwise its trajectories are added to the
    ScaleCUA ones, screenshots still resolving under ``corpus`` (paths are rewritten relative
    to it)."""
    trajectories: str = ""
    """``trajectories.jsonl`` of ``python -m data_gen ingest`` on ``runs.corpus``; empty: use
    ``<runs.corpus>/trajectories.jsonl`` when present, else ingest it into
    ``<out>/ingest_runs`` (when ``runs.corpus`` is ``corpus``, ``trajectories`` is read)."""
    sidecars: str = ""
    """The episode sidecars (``<benchmark>/<episode>.json``); empty: ``<runs.corpus>/episodes``.
    A trajectory is a run when a sidecar names its id (``trajectory_id``); its outcome is the
    sidecar's evaluated one, never the agent's own ``terminate`` claim."""
    mix_ratio: float = 0.0
    """Run episodes kept per ScaleCUA trajectory (0.25: one run per four); runs beyond it are
    left out by a hash of their id and counted (``mix_ratio``). 0 keeps every run, and a run
    without ScaleCUA trajectories keeps them all."""
    hard_cases: bool = True
    """Tag (``hard_case``) and always keep the samples where the recorded critic was wrong: a
    Good verdict on a failed run's root cause, a Bad verdict on a step of a successful run."""

    def __post_init__(self) -> None:
        if self.mix_ratio < 0:
            raise ConfigError("`runs.mix_ratio` must be >= 0 (0 = keep every run)")
        if (self.trajectories or self.sidecars) and not self.corpus:
            raise ConfigError("`runs.trajectories`/`runs.sidecars` need `runs.corpus` (override)")

    @property
    def enabled(self) -> bool:
        """Whether the run reads agent runs at all."""
        return bool(self.corpus)
