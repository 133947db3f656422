"""Metric loggers behind one small Protocol, so the loop never branches on "is W&B on".

Only rank 0 builds real sinks; other ranks get ``NullLogger``. JSONL is always written. A value
of ``None`` means "not available" (MFU on CPU): JSONL writes null, the stdout line shows it, and
the TensorBoard/W&B sinks leave it out.

``step_metrics`` turns one optimizer step's micro-batches into the logged row.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

import torch
import torch.distributed as dist

from hivig.logging import get_logger
from train.collate import PackedBatch
from train.flops import FlopShape, mfu, step_flops

log = get_logger(__name__)

Scalars = Mapping[str, float | int | None]


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
        for k, v in _available(metrics).items():
            self._writer.add_scalar(k, v, step)

    def close(self) -> None:
        self._writer.close()


class WandbLogger:
    """Scalars to Weights & Biases (needs the wandb extra and its own credentials)."""

    def __init__(self, project: str, run_dir: str | Path, config: Mapping[str, Any]):
        import wandb

        self._run = wandb.init(project=project, dir=str(run_dir), config=dict(config))

    def log(self, metrics: Scalars, step: int) -> None:
        self._run.log(_available(metrics), step=step)

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


def _available(metrics: Scalars) -> dict[str, float | int]:
    return {k: v for k, v in metrics.items() if v is not None}


def all_reduce_sum(values: list[float], device: torch.device | str) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (the values themselves without a group)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t.tolist()


def step_metrics(
    micro: Sequence[PackedBatch],
    loss_sum: torch.Tensor,
    n_global: int,
    *,
    world: int,
    device: torch.device,
    flop_shape: FlopShape,
    peak_tflops: float | None,
    lr: float,
    grad_norm: float | None,
    wait: float,
    elapsed: float,
) -> dict[str, float | None]:
    """The logged row of one optimizer step, summed over ranks (a collective: call on all).

    Args:
        micro: This rank's micro-batches of the step.
        loss_sum: This rank's summed CE over the step.
        n_global: Supervised tokens of the step on all ranks (the loss normaliser).
        world: Number of ranks.
        device: Where the all-reduce runs.
        flop_shape: Model numbers for the FLOP count.
        peak_tflops: Per-device peak, or ``None`` (MFU then logs as null).
        lr: LR the step was taken with (read before the scheduler advances).
        grad_norm: Global gradient norm before clipping, if known.
        wait: Seconds this rank waited for the loader.
        elapsed: Wall time of the step.
    """
    seq_lens = [n for b in micro for n in b.meta.seq_lens]
    patches = [p for b in micro for p in b.meta.image_patches]
    supervised = sum(b.meta.supervised for b in micro)
    local = [
        float(loss_sum),
        float(sum(seq_lens)),
        float(len(seq_lens)),
        step_flops(flop_shape, seq_lens, patches, supervised_tokens=supervised, causal=True),
        step_flops(flop_shape, seq_lens, patches, supervised_tokens=supervised, causal=False),
        wait,
    ]
    loss, tokens, samples, fl_c, fl_nc, waits = all_reduce_sum(local, device)
    row: dict[str, float | None] = {
        "loss": loss / max(n_global, 1),
        "lr": lr,
        "grad_norm": float("nan") if grad_norm is None else grad_norm,
        "tokens": tokens,
        "samples": samples,
        "supervised_tokens": float(n_global),
        "tokens_per_s_per_device": tokens / elapsed / world,
        "samples_per_s": samples / elapsed,
        "mfu": mfu(fl_c, elapsed, world, peak_tflops),
        "mfu_non_causal": mfu(fl_nc, elapsed, world, peak_tflops),
        "dataloader_wait_frac": waits / world / elapsed,
        "step_time_s": elapsed,
    }
    if torch.cuda.is_available():
        row["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def _jsonable(v: float | int | None) -> float | int | str | None:
    # JSON has no NaN/inf; keep them visible as strings instead of writing invalid JSON.
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v
