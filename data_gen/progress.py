"""Progress of the annotation stages: one bar per stage, refreshed from the stage counters.

    transitions  62%|██████▏   | 80/128 [00:21<00:12, answers=84 tokens=301k retries=3 dropped=1]

Each bar counts the stage's items done (kept or dropped) against the items the plan gives
the shard, with the answers received, the server's tokens (prompt plus completion), the
answers refused and asked again (retries), the items dropped, and the ETA from the stage's
own rate. The bars are drawn from a thread every half second, so the stages never wait on the
terminal; on a stream that is not a terminal (a SLURM log) there are no bars, and log lines
written meanwhile go above the bars.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from data_gen.executor import StageStats

REFRESH_S = 0.5


def _has_width() -> bool:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns > 0
    except (OSError, ValueError):
        return False


def _line(stats: StageStats) -> tuple[int, str]:
    """Items done and the postfix of a stage's bar."""
    # A copy first: the stages add counters meanwhile (a copy of a dict is one step under
    # the interpreter lock; iterating the live one is not).
    c = dict(stats.counts)
    dropped = sum(v for k, v in c.items() if k.startswith("dropped_"))
    tokens = c.get("prompt_tokens", 0) + c.get("completion_tokens", 0)
    shown = f"{tokens / 1000:.0f}k" if tokens >= 10_000 else str(tokens)
    answers, retries = c.get("calls", 0), c.get("llm_retries", 0)
    postfix = f"answers={answers} tokens={shown} retries={retries} dropped={dropped}"
    return c.get("kept", 0) + dropped, postfix


@contextlib.contextmanager
def stage_bars(
    stats: dict[str, StageStats], totals: dict[str, int], enabled: bool | None = None
) -> Iterator[None]:
    """Show a bar per stage of ``stats`` while the block runs.

    Args:
        stats: The counters of the stages running (updated by the stages meanwhile).
        totals: Items the plan gives each stage (a bar may end short of it: an item dropped
            early never reaches the later stages).
        enabled: ``None`` shows the bars only when stderr is a terminal.
    """
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield
        return
    width = max(len(name) for name in stats)
    bars = {
        name: tqdm(
            total=totals.get(name, 0),
            desc=name.ljust(width),
            position=i,
            leave=True,
            # A terminal that reports no size (a pseudo-terminal without one) gets a fixed
            # size: tqdm would otherwise draw empty lines.
            dynamic_ncols=_has_width(),
            ncols=None if _has_width() else 110,
            nrows=None if _has_width() else 24,
            file=sys.stderr,
        )
        for i, name in enumerate(stats)
    }
    stop = threading.Event()

    def refresh() -> None:
        for name, bar in bars.items():
            bar.n, postfix = _line(stats[name])
            bar.set_postfix_str(postfix, refresh=False)
            bar.refresh()

    def loop() -> None:
        while not stop.wait(REFRESH_S):
            refresh()

    painter = threading.Thread(target=loop, name="hivig-progress", daemon=True)
    with logging_redirect_tqdm():
        painter.start()
        try:
            yield
        finally:
            stop.set()
            painter.join()
            refresh()
            for bar in bars.values():
                bar.close()
