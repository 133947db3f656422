"""Metric loggers behind one small Protocol, so the loop never branches on "is W&B on".

Only rank 0 builds real sinks; other ranks get ``NullLogger``. JSONL is always written.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

from hivig.logging import get_logger

log = get_logger(__name__)

Scalars = Mapping[str, float | int]


class MetricLogger(Protocol):
    """Where scalar metrics go; ``step`` is the optimizer step."""

    def log(self, metrics: Scalars, step: int) -> None:
        """Record one set of scalars at ``step``."""

    def close(self) -> None:
        """Flush and release resources."""


class NullLogger:
    """Drops everything (non-zero ranks, ``null`` sink)."""

    def log(self, metrics: Scalars, step: int) -> None:
        return None

    def close(self) -> None:
        return None


class JsonlLogger:
    """One JSON object per line: ``{"step": s, ...metrics}``; appends, so resumed runs continue."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: TextIO = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Scalars, step: int) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class StdoutLogger:
    """A compact line per record on a text stream (stdout by default)."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout

    def log(self, metrics: Scalars, step: int) -> None:
        parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items()]
        self.stream.write(f"step {step}: " + " ".join(parts) + "\n")
        self.stream.flush()

    def close(self) -> None:
        return None


class TensorBoardLogger:
    """Scalars to TensorBoard event files under ``log_dir`` (needs the tensorboard extra)."""

    def __init__(self, log_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, metrics: Scalars, step: int) -> None:
        for k, v in metrics.items():
            self._writer.add_scalar(k, v, step)

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    """Scalars to Weights & Biases (needs the wandb extra and its own credentials)."""

    def __init__(self, project: str, run_dir: str | Path, config: Mapping[str, Any]):
        import wandb

        self._run = wandb.init(project=project, dir=str(run_dir), config=dict(config))

    def log(self, metrics: Scalars, step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class MultiLogger:
    """Fans every record out to several loggers."""

    def __init__(self, loggers: Sequence[MetricLogger]):
        self.loggers = list(loggers)

    def log(self, metrics: Scalars, step: int) -> None:
        for lg in self.loggers:
            lg.log(metrics, step)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


def build_metric_logger(
    sinks: Sequence[str],
    out_dir: str | Path,
    *,
    is_main: bool,
    project: str = "hivig",
    config: Mapping[str, Any] | None = None,
) -> MetricLogger:
    """The metric logger of a run: JSONL (always) plus the requested sinks, on rank 0 only.

    Args:
        sinks: Names from ``jsonl``, ``stdout``, ``tensorboard``, ``wandb``, ``null``.
        out_dir: Run directory; JSONL goes to ``out_dir/metrics.jsonl``.
        is_main: Whether this is global rank 0.
        project: W&B project.
        config: Resolved config recorded by W&B.
    """
    if not is_main:
        return NullLogger()
    out = Path(out_dir)
    loggers: list[MetricLogger] = [JsonlLogger(out / "metrics.jsonl")]
    for sink in dict.fromkeys(sinks):
        if sink == "stdout":
            loggers.append(StdoutLogger())
        elif sink == "tensorboard":
            loggers.append(TensorBoardLogger(out / "tensorboard"))
        elif sink == "wandb":
            loggers.append(WandbLogger(project, out, config or {}))
        elif sink not in ("jsonl", "null"):
            raise ValueError(f"unknown metric sink {sink!r}")
    return MultiLogger(loggers)


def _jsonable(v: float | int) -> float | int | str:
    # JSON has no NaN/inf; keep them visible as strings instead of writing invalid JSON.
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v
