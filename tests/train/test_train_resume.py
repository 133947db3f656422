"""Safe resume: refused config changes, untouched old checkpoints, fallback, no replayed rows,
signals from process start and the "preempted" exit status."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hivig.config import ConfigError, load_config
from train import checkpoint as ckpt
from train.config import TrainConfig
from train.sft import setup, train
from train.signals import EXIT_PREEMPTED
from train.synthetic import write_dataset

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY_YAML = ROOT / "configs" / "train" / "tiny_cpu.yaml"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gen")
    return write_dataset(out, n_train=8, n_val=0, sizes=((64, 64),), words=(2, 8))


def _cfg(data: Path, out: Path, *overrides: str) -> TrainConfig:
    base = [
        f"data={data}",
        f"out={out}",
        "dataset.max_samples_per_pack=1",
        "optim.grad_accum=1",
        "optim.global_batch_samples=1",
        "loop.save_every_n_steps=1",
        "loop.keep_last_checkpoints=5",
    ]
    return load_config(TrainConfig, TINY_YAML, [*base, *overrides])


def _digest(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory) -> Path:
    """A run stopped after 3 steps, one checkpoint per step."""
    out = tmp_path_factory.mktemp("run")
    train(setup(_cfg(data_dir, out, "loop.max_steps=3", "optim.lr=1e-3")))
    return out


def test_a_changed_run_defining_key_is_refused_with_both_values(data_dir, trained):
    with pytest.raises(ConfigError, match=r"optim.lr: 0.001 -> 0.5") as e:
        setup(_cfg(data_dir, trained, "loop.max_steps=3", "optim.lr=0.5"))
    assert "loop.resume=never" in str(e.value)
    # Freezing is run-defining too: named, not a raw error from the optimizer state.
    with pytest.raises(ConfigError, match=r"model.train_merger: True -> False"):
        setup(_cfg(data_dir, trained, "loop.max_steps=3", "model.train_merger=false"))


def test_safe_keys_need_the_flag_and_old_checkpoints_are_never_rewritten(
    data_dir, trained, tmp_path
):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(trained, out)
    # A resume that continues from step 3 to 4 (run length is a safe key).
    with pytest.raises(ConfigError, match=r"loop.max_steps: 3 -> 4.*resume_allow_changes"):
        setup(_cfg(data_dir, out, "loop.max_steps=4", "optim.lr=1e-3"))
    before = {p.name: _digest(p) for p in (out / "checkpoints").iterdir()}
    run_config = (out / "config.yaml").read_text()
    c = setup(
        _cfg(data_dir, out, "loop.max_steps=4", "optim.lr=1e-3", "loop.resume_allow_changes=true")
    )
    assert c.state.step == 3
    train(c)
    after = {p.name: _digest(p) for p in (out / "checkpoints").iterdir()}
    for name, files in before.items():
        assert after[name] == files, f"{name} was rewritten"
    assert "step_000004" in after
    assert (out / "config.yaml").read_text() == run_config  # the run's own description stays


def test_stopping_right_after_a_resume_leaves_that_checkpoint_alone(data_dir, trained, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(trained, out)
    before = _digest(out / "checkpoints" / "step_000003")
    c = setup(_cfg(data_dir, out, "loop.max_steps=3", "optim.lr=1e-3"))
    # Nothing left to train: the loop ends at once and saves "step 3" again.
    train(c)
    assert _digest(out / "checkpoints" / "step_000003") == before


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_one(data_dir, trained, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(trained, out)
    state = out / "checkpoints" / "step_000003" / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    assert "state.pt has" in ckpt.incomplete_reason(state.parent)
    c = setup(_cfg(data_dir, out, "loop.max_steps=3", "optim.lr=1e-3"))
    assert c.state.step == 2


def test_replayed_steps_are_not_logged_twice(data_dir, trained, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(trained, out)
    # As after a SIGKILL between the step-3 log rows and its checkpoint: step 3 replays.
    shutil.rmtree(out / "checkpoints" / "step_000003")
    assert _steps(out / "metrics.jsonl") == [1, 2, 3]
    train(setup(_cfg(data_dir, out, "loop.max_steps=3", "optim.lr=1e-3")))
    assert _steps(out / "metrics.jsonl") == [1, 2, 3]
    assert _steps(out / "ledger" / "rank_0.jsonl") == [1, 2, 3]


def _catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler for SIGTERM (Linux: ``SigCgt`` in its status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def test_a_signal_during_start_up_exits_with_the_preempted_status(data_dir, tmp_path):
    out = tmp_path / "early"
    cmd = [sys.executable, "-m", "train", "--config", str(TINY_YAML), f"data={data_dir}",
           f"out={out}", "loop.max_steps=50"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    # Signal as soon as the handler is in place (the process catches SIGTERM), which is before
    # torch and transformers are imported; a fixed sleep raced a slow interpreter start on a
    # busy machine (the signal then killed it outright).
    deadline = time.monotonic() + 60
    while not _catches_sigterm(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, "no handler was installed"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    stdout = proc.communicate(timeout=300)[0]
    assert proc.returncode == EXIT_PREEMPTED, stdout
    assert "preempted at step 0" in stdout
    assert not (out / "final").exists()
