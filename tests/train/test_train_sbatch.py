"""slurm/train.sbatch rendered with stub srun/scontrol/accelerate: what a job would launch."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "slurm" / "train.sbatch"

# Stubs record their arguments and the environment they see, one JSON line per call.
_STUB = """#!/bin/bash
python3 - "$0" "$@" <<'PY'
import json, os, sys
keys = ("SRUN_CPUS_PER_TASK", "PET_SHUTDOWN_TIMEOUT", "PET_SIGNALS_TO_HANDLE", "MAIN_ADDR")
row = {"cmd": os.path.basename(sys.argv[1]), "args": sys.argv[2:],
       "env": {k: os.environ.get(k) for k in keys}}
with open(os.environ["STUB_LOG"], "a") as fh:
    fh.write(json.dumps(row) + "\\n")
PY
"""
_SCONTROL = """#!/bin/bash
echo node-a
echo node-b
"""
# srun runs its command like SLURM would on one node (SLURM_NODEID=0).
_SRUN = (
    _STUB
    + """
while [[ "$1" == --* ]]; do shift; done
SLURM_NODEID=0 "$@"
"""
)


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def job(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _write(bin_dir / "srun", _SRUN)
    _write(bin_dir / "accelerate", _STUB)
    _write(bin_dir / "scontrol", _SCONTROL)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text("")
    data = tmp_path / "data"
    data.mkdir()
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "STUB_LOG": str(tmp_path / "calls.jsonl"),
        "HIVIG_REPO": str(ROOT),
        "HIVIG_VENV": str(tmp_path / "venv"),
        "HIVIG_DATA_ROOT": str(data),
        "HIVIG_RUNS": str(tmp_path / "runs"),
        "ALLOW_DIRTY": "1",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NAME": "hivig-train",
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_CPUS_PER_TASK": "16",
    }
    return tmp_path, env


def _render(job, *args: str, **env: str):
    tmp_path, base = job
    proc = subprocess.run(
        ["bash", str(SBATCH), "configs/train/qwen3vl_8b_full.yaml", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    log = tmp_path / "calls.jsonl"
    calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return proc, {c["cmd"]: c for c in calls}


def test_srun_gets_the_cpus_per_task_and_a_folder_per_job(job):
    proc, calls = _render(job, "optim.lr=1e-5")
    assert proc.returncode == 0, proc.stderr
    srun, launch = calls["srun"], calls["accelerate"]
    assert srun["env"]["SRUN_CPUS_PER_TASK"] == "16"
    assert "--cpus-per-task=16" in srun["args"]
    args = launch["args"]
    runs = job[1]["HIVIG_RUNS"]
    assert f"out={runs}/hivig-train-4242" in args
    assert args[-2:] == ["loop.resume=auto", "optim.lr=1e-5"]
    assert args[args.index("--num_processes") + 1] == "16"
    assert args[args.index("--main_process_ip") + 1] == "node-a"
    assert launch["env"]["PET_SHUTDOWN_TIMEOUT"] == "840"  # the 900 s lead less a minute
    assert "SIGUSR1" in launch["env"]["PET_SIGNALS_TO_HANDLE"]


def test_an_explicit_out_wins_and_the_lead_is_configurable(job):
    proc, calls = _render(job, "out=/somewhere/run", HIVIG_SIGNAL_LEAD="1800")
    assert proc.returncode == 0, proc.stderr
    args = calls["accelerate"]["args"]
    assert args.index("out=/somewhere/run") > max(i for i, a in enumerate(args) if "-4242" in a)
    assert calls["accelerate"]["env"]["PET_SHUTDOWN_TIMEOUT"] == "1740"


def test_a_lead_too_short_for_a_checkpoint_is_refused(job):
    proc, calls = _render(job, HIVIG_SIGNAL_LEAD="30")
    assert proc.returncode == 1 and "too short" in proc.stderr
    assert "srun" not in calls


def test_header_appends_logs_and_leaves_partition_and_account_to_the_environment():
    header = [line for line in SBATCH.read_text().splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --open-mode=append" in header
    assert "#SBATCH --requeue" in header
    assert any(line.startswith("#SBATCH --signal=B:USR1@") for line in header)
    assert not any("--partition" in line or "--account" in line for line in header)
    text = SBATCH.read_text()
    assert "SBATCH_PARTITION" in text and "SBATCH_ACCOUNT" in text


def test_sbatch_syntax():
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0


def test_the_torch_floor_has_the_launcher_options_the_job_sets():
    """PET_SIGNALS_TO_HANDLE and PET_SHUTDOWN_TIMEOUT are torchrun options (torch >= 2.12)."""
    import re

    from torch.distributed.run import get_args_parser

    floor = re.search(r'"torch>=([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert tuple(int(x) for x in floor.split(".")) >= (2, 12)
    assert f'"torch>={floor}"' in (ROOT / "Makefile").read_text()
    options = {o for a in get_args_parser()._actions for o in a.option_strings}
    assert {"--signals-to-handle", "--shutdown-timeout"} <= options
    sbatch = SBATCH.read_text()
    assert "PET_SHUTDOWN_TIMEOUT" in sbatch and "PET_SIGNALS_TO_HANDLE" in sbatch
