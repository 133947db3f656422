"""Preemption on a cluster: a repeated SIGTERM during the save, and the requeue on two nodes
before any rank can exit (and have srun kill the other node)."""

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
from train.signals import PreemptionFlag
from train.synthetic import write_dataset

# Multi-process CPU training: quiet-machine times x 4 still fit (a loaded 2-core CI box ran the
# ZeRO-2 test in 137 s against 64 s quiet).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
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


# srun on two nodes with --kill-on-bad-exit=1: one task per node, signals forwarded to every
# task, and the first task to exit non-zero gets the others SIGKILLed.
_SRUN = """#!/usr/bin/env python3
import os, signal, subprocess, sys, time
args = sys.argv[1:]
while args and args[0].startswith("--"):
    args.pop(0)
nodes = int(os.environ["SLURM_NNODES"])
tasks = [
    subprocess.Popen(args, env={**os.environ, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i)},
                     start_new_session=True)
    for i in range(nodes)
]
def forward(signum, frame):
    for t in tasks:
        if t.poll() is None:
            os.killpg(t.pid, signum)
signal.signal(signal.SIGUSR1, forward)
signal.signal(signal.SIGTERM, forward)
while True:
    for t in tasks:
        code = t.poll()
        if code is not None and code != 0:
            for other in tasks:
                if other.poll() is None:
                    os.killpg(other.pid, signal.SIGKILL)
            with open(os.environ["STUB_LOG"], "a") as fh:
                fh.write(f"killed after exit {code}\\n")
            sys.exit(code)
    if all(t.poll() == 0 for t in tasks):
        sys.exit(0)
    time.sleep(0.05)
"""

# One node's launcher: torchrun for this node's rank (the recipe runs under it as on SLURM).
_NODE = (
    'exec "$PYTHON" -m torch.distributed.run --nnodes 2 --node_rank "$SLURM_NODEID" '
    '--nproc_per_node 1 --master_addr 127.0.0.1 --master_port "$PORT" -m train "$@"'
)


def test_two_nodes_requeue_before_srun_kills_the_job(data_dir, tmp_path):
    """srun --kill-on-bad-exit on 2 nodes, SIGUSR1 as SLURM's time-limit warning: both ranks
    stop at one step and save; rank 0's ``scontrol requeue`` must go through before any rank
    exits with the preempted status (which makes srun kill the other node)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in (("scontrol", _SCONTROL), ("srun", _SRUN)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755 | stat.S_IEXEC)
    log = tmp_path / "scontrol.log"
    out = tmp_path / "requeue"
    env = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "STUB_LOG": str(log),
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "2",
        "PYTHON": sys.executable,
        "PORT": str(_free_port()),
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "true",
        "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
    }
    cmd = [
        str(stubs / "srun"), "--kill-on-bad-exit=1", "bash", "-c", _NODE, "node",
        *_args(data_dir, out, "loop.requeue_on_signal=true"),
    ]  # fmt: skip
    job = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 240
    metrics = out / "metrics.jsonl"
    while not metrics.is_file() or "loss" not in metrics.read_text():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0]
        time.sleep(0.1)
    job.send_signal(signal.SIGUSR1)
    output = job.communicate(timeout=240)[0]
    # The agents re-raise the signal once their worker is done (exit 1), so srun kills the
    # other node then; the requeue must be in by that time.
    lines = log.read_text().splitlines() if log.is_file() else []
    assert job.returncode != 0 and any(x.startswith("killed after exit") for x in lines), lines
    assert "requeue 4242" in lines, output[-3000:]
    assert lines.index("requeue 4242") < next(
        i for i, x in enumerate(lines) if x.startswith("killed")
    )
    (saved,) = (out / "checkpoints").iterdir()
    assert ckpt.incomplete_reason(saved) is None


def test_the_recipe_gives_the_signal_handlers_back_when_it_fails(data_dir, tmp_path, monkeypatch):
    """Library use (``train`` in-process): an error after the loop must not leave the recipe's
    SIGTERM handler behind, or the caller's own process could no longer be terminated."""
    from hivig.config import load_config
    from train.config import TrainConfig
    from train.sft import setup, train

    before = signal.getsignal(signal.SIGTERM)

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "export_final", broken)
    cfg = load_config(TrainConfig, TINY_YAML, _args(data_dir, tmp_path / "run")[2:] + [
        "loop.max_steps=1", "loop.epochs=1"])  # fmt: skip
    with pytest.raises(OSError, match="disk full"):
        train(setup(cfg), signals=PreemptionFlag())  # the entry point's handlers
    assert signal.getsignal(signal.SIGTERM) is before


def test_library_use_installs_no_signal_handler(data_dir, tmp_path):
    """``train`` in-process without a flag (a test, a notebook): SIGTERM keeps the caller's
    meaning, so a test runner can still cancel a hung training test."""
    from hivig.config import load_config
    from train.config import TrainConfig
    from train.sft import setup, train

    seen, before = [], signal.getsignal(signal.SIGTERM)
    cfg = load_config(TrainConfig, TINY_YAML, _args(data_dir, tmp_path / "run")[2:] + [
        "loop.max_steps=2", "loop.epochs=1"])  # fmt: skip
    c = setup(cfg)
    result = train(c, on_step=lambda s: seen.append(signal.getsignal(signal.SIGTERM)))
    assert result.final_dir is not None and seen
    assert all(h is before for h in seen)
    assert not isinstance(getattr(before, "__self__", None), PreemptionFlag)  # none leaked in
