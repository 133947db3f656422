"""Learning-rate schedule: linear warmup, then cosine, linear or constant (HiViG: cosine)."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from torch.optim.lr_scheduler import LambdaLR

from train.config import OptimConfig


def lr_factor(step: int, *, total: int, warmup: int, kind: str, min_ratio: float) -> float:
    """LR multiplier at optimizer step ``step``: linear warmup, then cosine/linear/constant."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if kind == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    decay = 0.5 * (1 + math.cos(math.pi * progress)) if kind == "cosine" else 1 - progress
    return min_ratio + (1 - min_ratio) * decay


def build_scheduler(optimizer: Any, optim: OptimConfig, total_steps: int) -> LambdaLR:
    """A ``LambdaLR`` over ``total_steps`` optimizer steps; multiplies every group's peak LR."""
    warmup = int(optim.warmup_ratio * total_steps)
    kind, floor = optim.scheduler, optim.min_lr_ratio
    fn = partial(lr_factor, total=total_steps, warmup=warmup, kind=kind, min_ratio=floor)
    return LambdaLR(optimizer, fn)
