"""``benchmarks/bench_serve.py``'s throughput part runs end to end at a tiny size (slow tier)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def test_throughput_through_python_m_serve_reports_both_baselines(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.delenv("HIVIG_RESIZE_KERNEL", raising=False)
    import bench_serve

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
    import os

    assert "HIVIG_RESIZE_KERNEL" not in os.environ
    sys.modules.pop("bench_serve", None)
