"""Preemption on a cluster: a repeated SIGTERM during the save, and the requeue on two ranks
before any of them can exit (and have the launcher kill the others)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train import checkpoint as ckpt
from train.synthetic import write_dataset

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TINY_YAML = ROOT / "configs" / "train" / "tiny_cpu.yaml"

# The job's own process: SIGTERM to itself once step 1 is done (the preemption), and again as
# the checkpoint save starts (SLURM repeats it); the default handler would kill the save.
_TWICE = """
import os, signal, sys
import train.checkpoint as ckpt
from train.__main__ import main

original = ckpt.save_checkpoint

def save(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return original(*args, **kwargs)

ckpt.save_checkpoint = save
import train.sft as sft
step_done = sft.train

def train(c, on_step=None, **kw):
    return step_done(c, on_step=lambda s: os.kill(os.getpid(), signal.SIGTERM), **kw)

sft.train = train
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    return write_dataset(out, n_train=8, n_val=0, sizes=((64, 64),), words=(2, 8))


def _args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--config", str(TINY_YAML), f"data={data}", f"out={out}",
        "dataset.max_samples_per_pack=1", "optim.grad_accum=1", "optim.global_batch_samples=1",
        "loop.save_every_n_steps=0", "loop.epochs=100", *extra,
    ]  # fmt: skip


def test_a_second_sigterm_during_the_preemption_save_leaves_a_complete_checkpoint(
    data_dir, tmp_path
):
    out = tmp_path / "twice"
    run = subprocess.run(
        [sys.executable, "-c", _TWICE, *_args(data_dir, out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 75, run.stderr[-3000:]  # preempted after its checkpoint
    (saved,) = (out / "checkpoints").iterdir()
    assert ckpt.incomplete_reason(saved) is None
    assert json.loads((saved / "trainer_state.json").read_text())["step"] == 1


# scontrol takes a while to answer; it records the requeue only if the rank that asked is still
# alive by then (a rank killed mid-request never gets its job requeued).
_SCONTROL = """#!/bin/bash
parent=$PPID
sleep 2
kill -0 "$parent" 2>/dev/null && echo "$@" >> "$STUB_LOG"
exit 0
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_stop_save_and_rank_zero_requeues_the_job(data_dir, tmp_path):
    """Two ranks under torchrun, SIGUSR1 as SLURM's time-limit warning: both stop at one step,
    the checkpoint is complete and rank 0's ``scontrol requeue`` went through while it lived
    (rank 0 now asks before the ranks' last barrier, so no rank exits first)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "scontrol").write_text(_SCONTROL)
    (stubs / "scontrol").chmod(0o755 | stat.S_IEXEC)
    log = tmp_path / "scontrol.log"
    out = tmp_path / "requeue"
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "STUB_LOG": str(log),
        "SLURM_JOB_ID": "4242",
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "true",
        "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
    }
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_port", str(_free_port()), "-m", "train",
        *_args(data_dir, out, "loop.requeue_on_signal=true"),
    ]  # fmt: skip
    launcher = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 240
    while (
        not (out / "metrics.jsonl").is_file() or "loss" not in (out / "metrics.jsonl").read_text()
    ):
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[0]
        time.sleep(0.1)
    launcher.send_signal(signal.SIGUSR1)
    output = launcher.communicate(timeout=240)[0]
    assert log.is_file(), output[-3000:]
    assert log.read_text().split() == ["requeue", "4242"]
    (saved,) = (out / "checkpoints").iterdir()
    assert ckpt.incomplete_reason(saved) is None
