"""Throughput options: selective checkpointing, fp32 gradient accumulation, the generation eval."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from hivig.config import FrameConfig, load_config
from hivig.models.qwen_vl import checkpointed_layers, enable_activation_checkpointing
from hivig.tiny import tiny_model, tiny_processor
from train.build import configure_deepspeed
from train.config import TrainConfig
from train.synthetic import write_dataset

ROOT = Path(__file__).resolve().parents[2]


def test_checkpointed_layers_fraction_or_count_spread_over_the_depth():
    assert checkpointed_layers(36, 1.0) == list(range(36))
    half = checkpointed_layers(36, 0.5)
    assert len(half) == 18 and half == list(range(0, 36, 2))
    assert checkpointed_layers(36, 4) == [0, 9, 18, 27]
    assert checkpointed_layers(36, 100) == list(range(36))
    assert checkpointed_layers(3, 0.01) == [0]  # at least one layer
    with pytest.raises(ValueError):
        checkpointed_layers(36, 0)


def test_selective_checkpointing_sets_the_flag_on_the_chosen_layers_only():
    model = tiny_model(tiny_processor())
    chosen = enable_activation_checkpointing(model, 2)
    flags = [layer.gradient_checkpointing for layer in model.model.language_model.layers]
    assert chosen == [0, 1] and flags == [True, True, False]


def test_fp32_gradient_accumulation_reaches_the_deepspeed_config():
    tiny = ROOT / "configs" / "train" / "tiny_cpu.yaml"
    for flag, expected in (("true", "fp32"), ("false", None)):
        cfg = load_config(TrainConfig, tiny, [f"optim.fp32_grad_accum={flag}"])
        ds: dict = {}
        acc = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(
            deepspeed_config=ds)))  # fmt: skip
        configure_deepspeed(acc, cfg, grad_accum=4)
        assert ds.get("data_types", {}).get("grad_accum_dtype") == expected
        assert ds["gradient_accumulation_steps"] == 4 and ds["train_micro_batch_size_per_gpu"] == 1


@pytest.mark.slow
def test_generation_eval_is_spread_over_ranks_and_bounded_by_the_targets(tmp_path, monkeypatch):
    from train.data import load_samples
    from train.encode import RecordEncoder
    from train.evaluate import GENERATION_MARGIN, generation_budget, verdict_accuracy

    data = write_dataset(tmp_path, n_train=8, n_val=0, sizes=((64, 64),), words=(2, 30))
    processor = tiny_processor(min_pixels=1024, max_pixels=65536)
    encoder = RecordEncoder(processor, FrameConfig(min_pixels=1024, max_pixels=65536), data)
    samples = load_samples(data, "train")
    critiques = [s for s in samples if s.kind == "critique"][:3]
    assert len(critiques) == 3
    tok = processor.tokenizer
    targets = [encoder.prompt_and_target(s.payload)[1] for s in critiques]
    longest = max(len(tok.encode(t, add_special_tokens=False)) for t in targets)
    assert generation_budget(processor, encoder, critiques) == longest + GENERATION_MARGIN
    model = tiny_model(processor).eval()
    scored = {}
    for rank in (0, 1):
        # Without a process group the rank comes from the environment (as under torchrun).
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        row = verdict_accuracy(model, processor, samples, encoder, limit=3, max_new_tokens=2)
        scored[rank] = row["eval_verdict_n"]
        assert row["eval_max_new_tokens"] == 2.0
    assert scored == {0: 2.0, 1: 1.0}  # every rank generates its share, none waits idle
