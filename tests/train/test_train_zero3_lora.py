"""LoRA under ZeRO-3 on two CPU ranks: every parameter partitioned (persistence threshold 0), the
final adapter saved gathered, and its merge computes the live trained model's logits."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hivig.tiny import save_tiny_checkpoint
from train.synthetic import write_dataset

# Multi-process CPU training: quiet-machine times x 4 still fit (a loaded 2-core CI box ran the
# ZeRO-2 test in 137 s against 64 s quiet).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]

# Trains through the recipe, then runs the live (still partitioned) model on one fixed sample on
# every rank, which is what a ZeRO-3 forward needs; rank 0 keeps the logits.
_JOB = """
import sys, torch
from hivig.config import load_config
from hivig.distributed import rank_and_world
from hivig.models.qwen_vl import encode_sample
from hivig.tiny import synthetic_conversation
from train.config import TrainConfig
from train.sft import setup, train

cfg = load_config(TrainConfig, sys.argv[1], sys.argv[3:])
c = setup(cfg)
train(c)
model = c.accelerator.unwrap_model(c.model).model.eval()
messages, target = synthetic_conversation(2, seed=3)
inputs = encode_sample(c.processor, messages, target).model_inputs()
with torch.no_grad():
    logits = model(**inputs).logits
if rank_and_world()[0] == 0:
    torch.save(logits, sys.argv[2])
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lora_under_zero3_saves_the_gathered_adapter_and_merges_to_the_live_logits(tmp_path):
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForImageTextToText

    from hivig.models.qwen_vl import encode_sample
    from hivig.tiny import synthetic_conversation, tiny_processor

    data = write_dataset(tmp_path / "data", n_train=4, n_val=0, sizes=((64, 64),), words=(2, 6))
    base = save_tiny_checkpoint(tmp_path / "base")
    ds = json.loads((ROOT / "configs" / "accelerate" / "ds_zero3.json").read_text())
    ds["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # partition everything
    ds["bf16"] = {"enabled": False}  # fp32, so the merge can be compared tightly
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    acc = (ROOT / "configs" / "accelerate" / "zero3.yaml").read_text()
    acc = acc.replace("configs/accelerate/ds_zero3.json", str(tmp_path / "ds.json"))
    (tmp_path / "acc.yaml").write_text(acc)
    (tmp_path / "job.py").write_text(_JOB)
    out, live = tmp_path / "run", tmp_path / "live.pt"
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file",
        str(tmp_path / "acc.yaml"), "--num_processes", "2", "--main_process_port",
        str(_free_port()), str(tmp_path / "job.py"),
        str(ROOT / "configs" / "train" / "tiny_cpu.yaml"), str(live),
        f"data={data}", f"out={out}", f"model.path={base}", "model.tiny=false",
        "model.attn_implementation=sdpa", "model.train_merger=false", "lora.enabled=true",
        "lora.r=4", "lora.alpha=8", "optim.lr=1e-2", "optim.grad_accum=1",
        "optim.global_batch_samples=2", "dataset.max_samples_per_pack=1", "loop.max_steps=2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=800)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-5000:]

    with safe_open(str(out / "final" / "adapter_model.safetensors"), framework="pt") as fh:
        shapes = {k: fh.get_slice(k).get_shape() for k in fh.keys()}  # noqa: SIM118 (safe_open is no dict)
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 (safe_open is no dict)
    assert shapes and all(0 not in s for s in shapes.values()), shapes
    assert any(t.abs().sum() > 0 for k, t in tensors.items() if "lora_B" in k), "B never trained"

    merged_dir = tmp_path / "merged"
    merge = subprocess.run(
        [sys.executable, "-m", "train", "merge-lora", "--adapter", str(out / "final"), "--out",
         str(merged_dir), "--dtype", "float32"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert merge.returncode == 0, merge.stderr[-3000:]
    merged = AutoModelForImageTextToText.from_pretrained(merged_dir).eval()
    messages, target = synthetic_conversation(2, seed=3)
    inputs = encode_sample(tiny_processor(), messages, target).model_inputs()
    with torch.no_grad():
        got = merged(**inputs).logits
        plain = AutoModelForImageTextToText.from_pretrained(base).eval()(**inputs).logits
    want = torch.load(live)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(plain, want, atol=1e-4), "the adapter changed nothing"
    # The PEFT path reads the same adapter.
    adapter = PeftModel.from_pretrained(
        AutoModelForImageTextToText.from_pretrained(base), out / "final"
    )
    with torch.no_grad():
        torch.testing.assert_close(adapter.eval()(**inputs).logits, want, rtol=1e-4, atol=1e-4)
