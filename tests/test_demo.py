"""``make demo`` end to end at a small size: every page the index links exists and is non-empty.

The same commands as the Makefile's ``demo`` target (a smaller corpus and one training step),
each as its own process, then the links of ``index.html`` and ``episode.html`` are followed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def _links(page: Path) -> list[Path]:
    targets = re.findall(r"""(?:href|src)=['"]([^'"#]+)['"]""", page.read_text())
    return [(page.parent / t).resolve() for t in targets if not t.startswith(("http", "data:"))]


@pytest.mark.slow
def test_demo_pages_and_everything_they_link(tmp_path):
    demo = tmp_path / "demo_out"
    _run(
        "-m",
        "data_gen",
        "make-sample",
        "--out",
        str(demo / "corpus"),
        "--trajectories",
        "12",
        "--seed",
        "0",
    )
    _run(
        "-m",
        "data_gen",
        "run",
        "--config",
        "configs/data_gen/demo.yaml",
        f"corpus={demo / 'corpus'}",
        f"out={demo / 'data'}",
    )
    train_out = _run(
        "-m",
        "train",
        "--config",
        "configs/train/tiny_cpu.yaml",
        f"data={demo / 'data'}",
        f"out={demo / 'train'}",
        "dataset.max_samples=8",
        "optim.global_batch_samples=4",
        "loop.max_steps=2",
    )
    assert "loss" in train_out  # a loss line per step on stdout
    out = _run(
        "-m",
        "serve.demo",
        "--data",
        str(demo / "data"),
        "--train",
        str(demo / "train"),
        "--out",
        str(demo),
    )
    assert "open " in out and "index.html" in out
    index = demo / "index.html"
    links = _links(index)
    assert len(links) >= 4
    for path in links:
        assert path.is_file() and path.stat().st_size > 0, path
    episode = demo / "episode.html"
    assert episode in links
    shots = _links(episode)
    assert any(p.suffix == ".png" for p in shots)
    for path in shots:
        assert path.is_file() and path.stat().st_size > 0, path
    text = episode.read_text()
    assert "R3 trigger" in text  # the no-effect repeat was caught
    assert "carries no meaning" in index.read_text()
