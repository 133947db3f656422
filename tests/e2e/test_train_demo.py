"""The documented CPU command trains on the demo's own data (real Qwen token counts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _sample_run import ingested_demo_config

from data_gen.run import run as run_data_gen
from train.cli import main

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_tiny_cpu_yaml_trains_on_demo_data_at_its_own_budget(tmp_path, monkeypatch):
    monkeypatch.setattr("hivig.logging._CONFIGURED", True)  # no stderr handler under capture
    cfg = ingested_demo_config(tmp_path, 3, 0)
    run_data_gen(cfg, None)
    out = tmp_path / "train"
    # The command of configs/train/tiny_cpu.yaml's header, with no budget override: the
    # samples (a ~6k-character system prompt, screenshots, a critique) fit its 2,048 tokens.
    argv = ["--config", str(ROOT / "configs" / "train" / "tiny_cpu.yaml"),
            f"data={tmp_path / 'o'}", f"out={out}", "loop.max_steps=1",
            "optim.global_batch_samples=2", "loop.save_every_n_steps=0"]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 1 and rows[0]["samples"] >= 1
    lengths = json.loads((out / "token_counts.json").read_text())["lengths"]
    fitting = [n for n in lengths if 0 < n <= 2048]
    assert len(fitting) > len(lengths) / 2, sorted(lengths)
    assert (out / "final" / "model.safetensors").is_file()
