"""Preemption signals, installed at process start (before torch is even imported).

SLURM sends SIGUSR1 ahead of the time limit (``--signal=B:USR1@LEAD``) and SIGTERM on
preemption. The handler only records the signal: the loop checkpoints at the next step boundary
on every rank (``should_stop`` all-reduces the flag) and the process exits with
``EXIT_PREEMPTED``, so a wrapper can tell "requeue me" from "finished" (0) and "failed" (1).
"""

from __future__ import annotations

import signal
from typing import Any

EXIT_PREEMPTED = 75
"""Exit status of a run stopped by a preemption signal after its checkpoint (``EX_TEMPFAIL``):
resume it (``loop.resume=auto``); SLURM requeues it when ``loop.requeue_on_signal`` is on."""


class PreemptionFlag:
    """Set by SIGTERM/SIGUSR1; the loop checkpoints at the next step boundary and exits."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1)):
        self.signum: int | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in signals}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def should_stop(self) -> bool:
        """True on every rank once any rank has received a signal (a collective if distributed)."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if self.signum is not None else 0])
        if dist.is_available() and dist.is_initialized():
            if dist.get_backend() == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def restore(self) -> None:
        """Reinstall the previous handlers."""
        for s, h in self._previous.items():
            signal.signal(s, h)
