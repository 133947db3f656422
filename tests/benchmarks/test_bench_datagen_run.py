"""The whole-run data_gen benchmark runs at a tiny size and reports what it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_datagen_run.py"

pytestmark = pytest.mark.slow


def test_tiny_run_reports_time_ideal_phases_and_calls(tmp_path):
    out = tmp_path / "run.json"
    args = ["--episodes", "4", "--latency", "0.01", "--runs", "1", "--concurrency", "8"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--work", str(tmp_path), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(out.read_text())["runs"][0]
    assert row["requests"] > 0 and row["exported"] > 0
    assert row["ideal_s"] == round(row["requests"] * 0.01 / 8, 2)
    assert 0 < row["stages_s"] + row["export_s"] <= row["seconds"] + 0.01
    assert sum(row["calls_by_stage"].values()) == row["requests"]
    assert row["calls_per_sample"] == round(row["requests"] / row["exported"], 3)
    assert "SUMMARY" in done.stdout
