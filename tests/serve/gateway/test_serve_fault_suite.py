"""The fault-injection suite (``benchmarks/bench_faults.py``) at a small size: every fault tried
under concurrent sessions, the gateway up, every answer documented, nothing committed lost."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import bench_faults  # noqa: E402


@pytest.mark.slow
def test_faults_under_concurrent_sessions_lose_nothing(tmp_path):
    report = bench_faults.run(tmp_path, sessions=4, steps=8, window_s=0.6, pace_s=0.2)
    assert set(report["fault_windows"]) == {
        "3,000 idle sessions expire",
        "backend stalls",
        "backend fails (500)",
        "backend answers garbage",
        "backend usage past 64 bits",
        "backend answer oversized",
        "store refuses writes",
        "store file deleted",
        "traces/ refuses writes",
        "images/ refuses writes",
    }
    assert all(n > 0 for n in report["hostile_requests"].values())
    assert report["gateway_alive"] is True
    assert report["undocumented_statuses"] == []
    assert report["hostile_mishandled"] == {}  # a 500 kept its connection
    assert report["internal_errors_besides_the_bug"] == 0  # a client gone mid-body is no bug
    assert report["healthz_max_s"] < 1.0  # the expiry sweep of 3,000 sessions is off the loop
    assert report["committed_steps"] == 4 * 8
    assert report["steps_lost"] == 0
    assert report["committed_steps_missing_from_traces"] == 0
    statuses = report["answers_by_status"]
    assert statuses.get(503, 0) > 0  # the store fault was met, and answered as documented
