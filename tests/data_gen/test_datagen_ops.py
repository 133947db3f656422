"""Operations: the ingest/merge lock across hosts, and the SLURM array script."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from hivig.locks import file_lock, lock_owner, run_once

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "slurm" / "data_gen.sbatch"


def _age(path: Path, seconds: float) -> None:
    past = time.time() - seconds
    os.utime(path, (past, past))


def test_lock_names_host_and_pid_and_excludes_others(tmp_path):
    lock = tmp_path / "merge.lock"
    with file_lock(lock) as held:
        assert held and lock.read_text() == f"{socket.gethostname()}:{os.getpid()}"
        with file_lock(lock) as second:
            assert not second
    assert not lock.exists()


def test_lock_of_another_host_is_kept_until_its_lease_runs_out(tmp_path):
    lock = tmp_path / "merge.lock"
    # Another host's pid must never be probed locally: only the lease decides.
    lock.write_text("other-node-17:999999")
    _age(lock, 10)
    with file_lock(lock, lease_s=60) as held:
        assert not held  # negative control: a live lease is respected
    _age(lock, 120)
    with file_lock(lock, lease_s=60) as held:
        assert held and lock.read_text() == lock_owner()


def test_lock_of_a_dead_local_process_is_taken_over(tmp_path):
    lock = tmp_path / "ingest.lock"
    dead = 2**22 + 12345  # above the default pid_max of most systems: no such process
    lock.write_text(f"{socket.gethostname()}:{dead}")
    with file_lock(lock, lease_s=600) as held:
        assert held


def test_lock_heartbeat_keeps_a_long_holder_fresh(tmp_path):
    lock = tmp_path / "merge.lock"
    with file_lock(lock, lease_s=0.4) as held:
        assert held
        _age(lock, 5)
        time.sleep(0.3)  # a heartbeat (every lease/4) refreshes the mtime
        assert time.time() - lock.stat().st_mtime < 0.4


def test_run_once_runs_the_job_in_one_process_and_waits_for_its_result(tmp_path):
    lock, marker, runs = tmp_path / "ingest.lock", tmp_path / "done", []

    def job():
        runs.append(1)
        marker.write_text("ok")

    run_once(lock, marker.exists, job, poll_s=0.01)
    run_once(lock, marker.exists, job, poll_s=0.01)  # done already: nothing runs
    assert runs == [1] and not lock.exists()
    # Another holder: this process waits, and returns once that holder's result is there.
    other = tmp_path / "other"
    lock.write_text(f"other-node-17:{os.getpid()}")
    waited = []

    def done():
        waited.append(1)
        if len(waited) == 3:
            other.write_text("ok")  # the other holder finishes
        return other.exists()

    run_once(lock, done, job, poll_s=0.01)
    assert runs == [1] and len(waited) >= 3


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_sbatch_numbers_shards_from_the_array_minimum(tmp_path):
    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    calls = tmp_path / "calls.txt"
    (bin_dir / "srun").write_text('#!/bin/bash\n"$@"\n')
    (venv / "bin" / "python").write_text(f'#!/bin/bash\necho "$@" >> {calls}\n')
    for f in (bin_dir / "srun", venv / "bin" / "python"):
        f.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HIVIG_REPO": str(ROOT),
        "HIVIG_DATA_ROOT": str(tmp_path / "data"),
        "HIVIG_VENV": str(venv),
        "CONFIG": "configs/data_gen/default.yaml",
        "SLURM_ARRAY_TASK_ID": "7",
        "SLURM_ARRAY_TASK_MIN": "5",
        "SLURM_ARRAY_TASK_COUNT": "4",
    }
    done = subprocess.run(["bash", str(SBATCH), "seed=1"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    args = calls.read_text().split()
    assert args[args.index("--shard") + 1] == "2/4"
    assert f"out={tmp_path / 'data' / 'gen'}" in args and "seed=1" in args
    assert (tmp_path / "data" / "gen" / "logs").is_dir()
    # A missing root fails before anything runs, naming the variable.
    missing = {k: v for k, v in env.items() if k != "HIVIG_DATA_ROOT"}
    failed = subprocess.run(["bash", str(SBATCH)], env=missing, capture_output=True, text=True)
    assert failed.returncode != 0 and "HIVIG_DATA_ROOT" in failed.stderr
