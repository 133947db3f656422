"""A newcomer's mistakes, each one clear line and exit status 2: an output folder that cannot be
written (make-sample, split, train and merge-lora, serve.demo: found before any work), a file
that holds no trajectory given to split, and ingest-runs pointed at results of another format.

The unwritable folder is a real one: ``chmod 0o500``, and where that does not bind (root) the
immutable attribute; the test is skipped where neither can be set.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.data_gen.ingest.test_ingest_runs import osworld_task

ROOT = Path(__file__).resolve().parents[2]


def _writable(folder: Path) -> bool:
    probe = folder / ".probe"
    try:
        probe.write_text("")
    except OSError:
        return False
    probe.unlink()
    return True


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A folder nothing can be written in (made so for real, never a stand-in)."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o500)
    immutable = False
    if _writable(folder) and shutil.which("chattr"):
        # Root ignores permission bits; the immutable attribute binds root too.
        immutable = (
            subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
        )
    if _writable(folder):
        folder.chmod(0o700)
        pytest.skip("no way to make a folder read-only here (root without chattr)")
    yield folder
    if immutable:
        subprocess.run(["chattr", "-i", str(folder)], check=False)
    folder.chmod(0o700)


def _cli(*args: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def _one_line(run: subprocess.CompletedProcess, *needles: str) -> str:
    """The run exited 2 with one stderr line, no traceback, holding every needle."""
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    lines = [x for x in run.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1, run.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --------------------------------------------------------------------------------------------
# Unwritable outputs


def test_make_sample_into_a_read_only_folder(read_only: Path):
    for out in (read_only, read_only / "corpus"):
        run = _cli("-m", "data_gen", "make-sample", "--out", str(out), "--trajectories", "2")
        _one_line(run, "make-sample", "--out", "cannot write")
        assert "make-sample summary" not in run.stdout


def test_split_into_a_read_only_folder(read_only: Path, tmp_path: Path):
    trajs = tmp_path / "t.jsonl"
    trajs.write_text(json.dumps({"id": "a", "episode_key": "e1", "platform": "web"}) + "\n")
    run = _cli("-m", "data_gen", "split", "--in", str(trajs), "--out", str(read_only / "s"))
    _one_line(run, "split", "cannot write")


def test_train_and_merge_lora_check_their_out_folder_before_loading_a_model(
    read_only: Path, tmp_path: Path
):
    # merge-lora loads the base model and merges before it writes: refused before either.
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    config = {"base_model_name_or_path": str(tmp_path / "base"), "peft_type": "LORA"}
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    run = _cli("-m", "train", "merge-lora", "--adapter", str(adapter), "--out", str(read_only))
    _one_line(run, "error: --out", "cannot write")
    # Training itself checks `out` before the model too.
    from train.synthetic import write_dataset

    data = write_dataset(tmp_path / "gen", n_train=2, n_val=0, sizes=((64, 64),), words=(2, 4))
    run = _cli(
        "-m", "train", "--config", "configs/train/tiny_cpu.yaml", f"data={data}",
        f"out={read_only / 'run'}", "loop.max_steps=1",
    )  # fmt: skip
    _one_line(run, "`out`", "cannot write")


def test_serve_demo_into_a_read_only_folder(read_only: Path, tmp_path: Path):
    data, train = tmp_path / "data", tmp_path / "train"
    (data / "dataset").mkdir(parents=True)
    (data / "dataset" / "report.html").write_text("<html></html>")
    (train / "final").mkdir(parents=True)
    (train / "final" / "config.json").write_text("{}")
    (train / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    for out in (read_only, read_only / "demo"):
        run = _cli(
            "-m", "serve.demo", "--data", str(data), "--train", str(train), "--out", str(out),
            "--env", "synthetic",
        )  # fmt: skip
        _one_line(run, "--out", "cannot write")


# --------------------------------------------------------------------------------------------
# Garbage in: nothing usable is a user mistake, not an empty result


def test_split_of_a_file_with_no_trajectory(tmp_path: Path):
    out = tmp_path / "splits"
    run = _cli("-m", "data_gen", "split", "--in", "README.md", "--out", str(out), "--quiet")
    lines = len((ROOT / "README.md").read_text().splitlines())
    _one_line(run, "split: nothing usable in README.md", f"{lines} of {lines} lines dropped")
    assert not (out / "train.jsonl").exists()  # no empty splits left behind


def test_ingest_runs_with_the_wrong_format_names_the_one_that_matches(tmp_path: Path):
    results = tmp_path / "results"
    steps = [("pyautogui.click(10, 20)", "Click it"), ("DONE", "Done")]
    osworld_task(results / "pyautogui" / "screenshot" / "m" / "chrome" / "t1", steps, "1.0")
    out = tmp_path / "corpus"
    run = _cli(
        "-m", "data_gen", "ingest-runs", "--format", "androidlab", "--root", str(results),
        "--out", str(out),
    )  # fmt: skip
    _one_line(run, "ingest-runs: no androidlab runs", "--format osworld")
    assert not out.exists()  # no empty corpus written
    # A folder of no format at all says so, naming the formats it looked for.
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("hello")
    run = _cli(
        "-m", "data_gen", "ingest-runs", "--format", "osworld", "--root", str(tmp_path / "notes"),
        "--out", str(out),
    )  # fmt: skip
    _one_line(run, "no runs under", "webarena-lite")
    # The right format still ingests.
    run = _cli(
        "-m", "data_gen", "ingest-runs", "--format", "osworld", "--root", str(results),
        "--out", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "2 in = 2 kept" in run.stdout
