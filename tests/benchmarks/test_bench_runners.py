"""The runner-overhead benchmark runs at a tiny size and reports what it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_runners.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
        cwd=ROOT,
    )  # fmt: skip


def test_tiny_run_reports_every_harness_with_its_phases(tmp_path):
    out = tmp_path / "bench.json"
    run = _run("--steps", "3", "--runs", "1", "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["steps"] == 3 and result["runs"] == 1
    assert list(result["harnesses"]) == ["webarena", "waa", "osworld", "androidlab"]
    for name, r in result["harnesses"].items():
        assert r["screen"] == ([1440, 3120] if name == "androidlab" else [1920, 1080])
        # Rounded separately, so the difference of the rounded figures may be off by 0.01.
        assert abs(r["overhead_ms"] - (r["guarded_ms"] - r["bare_ms"])) <= 0.011
        # A guarded step uploads a screen and waits for two round trips: never free.
        assert r["guarded_ms"] > r["bare_ms"]
        phases = r["phases_ms_per_step"]
        # The gateway ran the image path for every guarded step, inside the client's HTTP time.
        for phase in ("client.http", "gw.put_bytes", "gw.png_decode", "gw.canonical_frame"):
            assert any(k.startswith(phase) and v > 0 for k, v in phases.items()), (name, phase)
        http = next(v for k, v in phases.items() if k.startswith("client.http"))
        image = next(v for k, v in phases.items() if k.startswith("gw.put_bytes"))
        assert http >= image
        assert name in run.stdout


def test_both_history_modes_are_measured(tmp_path):
    out = tmp_path / "on.json"
    run = _run(
        "--steps", "2", "--runs", "1", "--only", "waa", "--inject-history", "--json", str(out)
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "history injected" in run.stdout
    result = json.loads(out.read_text())
    assert result["inject_history"] is True and result["harnesses"]["waa"]["guarded_ms"] > 0
    off = _run("--steps", "1", "--runs", "1", "--only", "waa")
    assert "history not injected" in off.stdout


def test_only_and_bad_arguments():
    run = _run("--steps", "1", "--runs", "1", "--only", "osworld")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "osworld" in run.stdout and "androidlab" not in run.stdout
    bad = _run("--only", "nowhere")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    missing = _run("--json", "/nonexistent-dir/x.json")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert "Traceback" not in bad.stderr + missing.stderr


def test_help_explains_the_measurement():
    run = _run("--help")
    assert run.returncode == 0
    for word in ("--steps", "--runs", "--only", "--json", "bare", "guarded", "overhead"):
        assert word in run.stdout
