"""``benchmarks/bench_serve.py``: its per-thread CPU reading, and its throughput part end to end at
a tiny size (slow tier)."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench_serve(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_serve

    yield bench_serve
    sys.modules.pop("bench_serve", None)


def test_thread_cpu_reads_one_thread_not_the_process(bench_serve):
    """The event loop's share is one thread's CPU: a thread that burns CPU reads as itself,
    and the main thread, idle meanwhile, does not take its time."""
    tick = 1 / os.sysconf("SC_CLK_TCK")
    seen: dict[str, float] = {}

    def burn() -> None:
        tid = threading.get_native_id()
        start, cpu0 = time.thread_time(), bench_serve._thread_cpu(os.getpid(), tid)
        while time.thread_time() - start < 0.3:
            pass
        seen["own"] = time.thread_time() - start
        seen["read"] = bench_serve._thread_cpu(os.getpid(), tid) - cpu0

    main0 = bench_serve._thread_cpu(os.getpid(), threading.get_native_id())
    worker = threading.Thread(target=burn)
    worker.start()
    worker.join()
    main = bench_serve._thread_cpu(os.getpid(), threading.get_native_id()) - main0
    assert abs(seen["read"] - seen["own"]) <= 2 * tick
    assert main < seen["read"] / 2


@pytest.mark.slow
def test_throughput_through_python_m_serve_reports_both_baselines(monkeypatch, bench_serve):
    monkeypatch.delenv("HIVIG_RESIZE_KERNEL", raising=False)
    out = bench_serve.bench_throughput(1, 2, 2, (320, 200), 0.05, "raw", "staggered", "openai")
    assert out["errors"] == 0 and out["kernel"] == "numpy"
    assert out["bare_samples_during_run"] >= 1
    for key in ("gateway_cpu_to_bare_during_run", "gateway_cpu_to_bare"):
        assert out[key] > 0
    # The event loop's part is read from the gateway's main thread (clock ticks: a short run
    # may show none of it), and is part of the whole.
    loop = out["gateway_event_loop_cpu_ms_per_step"]
    assert loop is not None and 0 <= loop <= out["gateway_cpu_ms_per_step"]
    # The kernel chosen for the run does not leak into the rest of the process.
    assert "HIVIG_RESIZE_KERNEL" not in os.environ
