"""Model-free pieces of the training stage: packing, FLOPs/MFU, schedule, collation, config."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from hivig.config import ConfigError, load_config
from train.collate import collate_pack, cu_seq_lens
from train.config import TrainConfig
from train.data import Sample, derive_grad_accum, epoch_order, mix_kinds, plan_epoch, rank_packs
from train.flops import FlopShape, mfu, peak_tflops, shape_from_config, step_flops
from train.metrics import JsonlLogger, NullLogger, StdoutLogger, build_metric_logger
from train.packing import group_into_steps, pad_to_longest_efficiency, plan_packs
from train.schedule import lr_factor

# --------------------------------------------------------------------------------------------
# Packing


@pytest.mark.parametrize("strategy", ["best_fit", "first_fit"])
def test_every_sample_is_packed_once_or_dropped_as_too_long(strategy):
    lengths = [5, 12, 3, 9, 20, 1, 7, 7, 11, 4]
    plan = plan_packs(lengths, budget=12, strategy=strategy, window=4)
    placed = [i for p in plan.packs for i in p]
    assert sorted(placed + plan.too_long) == list(range(len(lengths)))
    assert plan.too_long == [4]  # 20 > 12: dropped, never truncated
    assert all(sum(lengths[i] for i in p) <= 12 for p in plan.packs)
    assert plan.tokens == sum(lengths) - 20


def test_best_fit_decreasing_packs_tighter_than_one_per_row():
    lengths = [6, 6, 4, 4, 2, 2, 5, 5, 1, 1]  # 36 tokens fit exactly in three rows of 12
    plan = plan_packs(lengths, budget=12, strategy="best_fit")
    assert len(plan.packs) == 3
    assert plan.fill == pytest.approx(1.0)


def test_first_fit_keeps_visiting_order_and_the_cap():
    plan = plan_packs(
        [1] * 8, budget=100, order=[7, 6, 5, 4, 3, 2, 1, 0], strategy="first_fit", max_per_pack=3
    )
    assert plan.packs == [[7, 6, 5], [4, 3, 2], [1, 0]]


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        plan_packs([1], budget=0)
    with pytest.raises(ValueError):
        plan_packs([1], budget=4, strategy="magic")


def test_pad_to_longest_baseline():
    # batches (4, 2) and (3, 3): real 12, allocated 8 + 6.
    assert pad_to_longest_efficiency([4, 2, 3, 3], 2) == pytest.approx(12 / 14)


def test_steps_give_ranks_disjoint_packs_with_the_same_union():
    one = group_into_steps(9, world=1, packs_per_rank=4)
    two = group_into_steps(9, world=2, packs_per_rank=2)
    assert one == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]  # pack 8 does not fill a step
    assert two == [[[0, 2], [1, 3]], [[4, 6], [5, 7]]]
    for a, b in zip(one, two, strict=True):
        assert sorted(a[0]) == sorted(b[0] + b[1])


def test_plan_epoch_is_deterministic_and_counts_drops():
    lengths = [30, 50, 10, 200, -1, 40, 60, 20, 10, 25]
    kw = dict(budget=100, seed=3, world=2, grad_accum=1, strategy="best_fit")
    a, b = plan_epoch(lengths, epoch=0, **kw), plan_epoch(lengths, epoch=0, **kw)
    assert a.packs == b.packs and a.steps == b.steps
    assert a.counts["dropped_too_long"] == 1  # 200; the -1 (quarantined) is not counted here
    used = {i for s in a.steps for r in s for j in r for i in a.packs[j]}
    partial = a.counts["dropped_partial_step"]
    assert len(used) + partial == a.counts["samples"]
    assert plan_epoch(lengths, epoch=1, **kw).packs != a.packs or len(a.packs) < 2


def test_rank_packs_resume_from_a_step():
    plan = plan_epoch([10] * 8, budget=10, seed=0, epoch=0, world=2, grad_accum=2)
    assert len(rank_packs(plan, 0, 0)) == 4
    assert rank_packs(plan, 1, 1) == rank_packs(plan, 1, 0)[2:]


def test_epoch_order_same_for_same_seed_and_epoch():
    assert epoch_order(50, 7, 0, True) == epoch_order(50, 7, 0, True)
    assert epoch_order(50, 7, 0, True) != epoch_order(50, 7, 1, True)
    assert epoch_order(5, 7, 0, False) == [0, 1, 2, 3, 4]


def test_mix_kinds_reaches_the_ratio_and_keeps_order():
    samples = [Sample(str(i), "history" if i < 30 else "critique", None) for i in range(100)]
    mixed = mix_kinds(samples, 0.5, seed=0)
    kinds = [s.kind for s in mixed]
    assert kinds.count("history") == kinds.count("critique") == 30
    assert [int(s.id) for s in mixed] == sorted(int(s.id) for s in mixed)
    assert len(mix_kinds(samples, -1, seed=0)) == 100
    assert all(s.kind == "critique" for s in mix_kinds(samples, 0.0, seed=0))


def test_grad_accum_derived_from_global_batch():
    assert derive_grad_accum(4.0, world=8, global_batch_samples=256, grad_accum=0) == 8
    assert derive_grad_accum(4.0, world=8, global_batch_samples=256, grad_accum=3) == 3
    assert derive_grad_accum(100.0, world=8, global_batch_samples=16, grad_accum=0) == 1


# --------------------------------------------------------------------------------------------
# FLOPs and MFU


def _toy_shape(**trained) -> FlopShape:
    return FlopShape(
        llm_matmul_params=1000,
        llm_layers=2,
        llm_heads=4,
        llm_head_dim=8,
        vit_params=100,
        vit_layers=3,
        vit_hidden=16,
        merger_params=50,
        deepstack_params=20,
        **trained,
    )


def test_step_flops_hand_computed():
    # Two samples S = 10, 20; one image of P = 8 patches (2 merged tokens).
    shape = _toy_shape()
    llm = 6 * 1000 * 30  # 180,000
    attn = 6 * 2 * 4 * 8 * (100 + 400)  # 192,000 (causal-exact)
    vit = 1 * 2 * 100 * 8 + 1 * 4 * 3 * 16 * 64  # frozen ViT: 1,600 + 12,288
    mergers = 3 * 2 * 50 * 2 + 1 * 2 * 20 * 2  # trained merger, frozen DeepStack: 600 + 80
    assert step_flops(shape, [10, 20], [8]) == llm + attn + vit + mergers
    assert step_flops(shape, [10, 20], [8], causal=False) == llm + 2 * attn + vit + mergers


def test_lm_head_is_charged_on_supervised_positions_only():
    # The chunked loss runs lm_head on the supervised positions only: 7 of the 30 tokens here.
    shape = dataclasses.replace(_toy_shape(), head_params=500)
    base = step_flops(dataclasses.replace(shape, head_params=0), [10, 20], [8])
    assert step_flops(shape, [10, 20], [8], supervised_tokens=7) == base + 6 * 500 * 7
    # Without a supervised count the head is charged on every token (a full-logits model).
    assert step_flops(shape, [10, 20], [8]) == base + 6 * 500 * 30
    # LoRA: the frozen head still back-propagates to its input, 4 · N per position.
    lora = dataclasses.replace(shape, llm_trained=False)
    lora_base = step_flops(dataclasses.replace(lora, head_params=0), [10, 20], [8])
    assert step_flops(lora, [10, 20], [8], supervised_tokens=7) == lora_base + 4 * 500 * 7


def test_step_flops_multipliers_follow_training_flags():
    base = step_flops(_toy_shape(), [10], [4])
    vit_on = step_flops(_toy_shape(vit_trained=True), [10], [4])
    assert vit_on - base == 2 * (2 * 100 * 4 + 4 * 3 * 16 * 16)  # ×3 instead of ×1
    lora = step_flops(_toy_shape(llm_trained=False), [10], [4])
    assert base - lora == 2 * 1000 * 10  # 4·N·S instead of 6·N·S


def test_qwen3vl_8b_numbers_match_the_reference_table():
    # The reference figures: N_llm = 6.946e9 + 0.622e9, causal attention 91 TF at S=10,160.
    text = dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
    )
    vision = dict(
        depth=27,
        hidden_size=1152,
        intermediate_size=4304,
        in_channels=3,
        temporal_patch_size=2,
        patch_size=16,
        spatial_merge_size=2,
        out_hidden_size=4096,
        deepstack_visual_indexes=[8, 16, 24],
    )
    cfg = type(
        "C", (), {"text_config": type("T", (), text), "vision_config": type("V", (), vision)}
    )
    shape = shape_from_config(cfg)
    assert shape.llm_matmul_params == pytest.approx(6.946e9, rel=1e-3)
    assert shape.head_params == 151936 * 4096
    s = 10_160
    llm_only = step_flops(shape, [s])  # head on every token: the reference table's convention
    linear = 6 * (shape.llm_matmul_params + shape.head_params) * s
    assert linear == pytest.approx(461e12, rel=5e-3)
    assert llm_only - linear == pytest.approx(91.3e12, rel=5e-3)
    # A typical critique pack supervises ~2,000 of its 10,160 tokens: the head then costs
    # 6 · 0.622e9 · 2,000 instead of · 10,160, about 5 % of the step's model FLOPs.
    sup = step_flops(shape, [s], supervised_tokens=2000)
    assert llm_only - sup == pytest.approx(6 * shape.head_params * (s - 2000))
    assert 0.04 < (llm_only - sup) / llm_only < 0.06


def test_mfu_definition():
    assert mfu(989e12, 1.0, 1, 989.0) == pytest.approx(1.0)
    assert mfu(4 * 0.4 * 989e12, 2.0, 2, 989.0) == pytest.approx(0.4)
    assert mfu(1.0, 0.0, 1, 989.0) == 0.0
    assert mfu(1.0, 1.0, 1, None) is None  # unknown peak: unavailable, not 0


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),  # SXM
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA A800-SXM4-80GB", 312.0),
        ("NVIDIA GeForce RTX 4090", None),
        (None, None),  # CPU
    ],
)
def test_peak_tflops_lookup_by_device_name(name, peak):
    assert peak_tflops(name) == peak


def test_peak_tflops_override_wins_everywhere():
    assert peak_tflops(None, override=1.5) == 1.5
    assert peak_tflops("NVIDIA H100 PCIe", override=400.0) == 400.0
    assert peak_tflops("NVIDIA H100 PCIe", override=0.0) == 756.0


# --------------------------------------------------------------------------------------------
# Schedule


def test_lr_schedule_warmup_then_cosine_to_floor():
    f = [lr_factor(s, total=10, warmup=2, kind="cosine", min_ratio=0.1) for s in range(10)]
    assert f[0] == pytest.approx(0.5) and f[1] == pytest.approx(1.0)
    assert f[2] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[1:], f[2:], strict=False))
    assert lr_factor(10, total=10, warmup=2, kind="cosine", min_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(5, total=10, warmup=0, kind="constant", min_ratio=0.0) == 1.0
    assert lr_factor(5, total=10, warmup=0, kind="linear", min_ratio=0.0) == pytest.approx(0.5)


# --------------------------------------------------------------------------------------------
# Collation


def _sample(n: int, sup: int, images: int = 0) -> dict:
    labels = torch.full((n,), -100)
    labels[n - sup - 1 : n - 1] = 7
    out = {
        "input_ids": torch.arange(n) + 10,
        "labels": labels,
        "position_ids": torch.arange(n).repeat(4, 1),
    }
    if images:
        out["pixel_values"] = torch.ones(4 * images, 1536)
        out["image_grid_thw"] = torch.tensor([[1, 2, 2]] * images)
    return out


def test_collate_restarts_text_positions_per_sample():
    batch = collate_pack(
        [_sample(5, 2, images=1), _sample(3, 1), _sample(4, 2, images=2)], ["a", "b", "c"]
    )
    pos = batch.inputs["position_ids"]
    assert pos.shape == (4, 1, 12)
    assert pos[0, 0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]
    assert batch.inputs["input_ids"].shape == batch.inputs["labels"].shape == (1, 12)
    assert batch.inputs["pixel_values"].shape == (12, 1536)
    assert batch.inputs["image_grid_thw"].shape == (3, 3)
    assert batch.meta.supervised == 5 and batch.meta.seq_lens == [5, 3, 4]
    assert batch.meta.image_patches == [4, 4, 4] and batch.meta.sample_ids == ["a", "b", "c"]
    assert "pixel_values" not in collate_pack([_sample(3, 1)]).inputs


def test_collate_casts_pixels_to_the_vision_dtype_and_the_model_sees_the_same_numbers():
    from hivig.tiny import tiny_model, tiny_processor

    s = _sample(5, 2, images=1)
    s["pixel_values"] = torch.randn(4, 1536)
    fp32 = collate_pack([s]).inputs["pixel_values"]
    bf16 = collate_pack([s], pixel_dtype=torch.bfloat16).inputs["pixel_values"]
    assert fp32.dtype == torch.float32 and bf16.dtype == torch.bfloat16
    # A bf16 vision tower casts fp32 pixels itself: handing them over in bf16 changes nothing.
    visual = tiny_model(tiny_processor()).to(torch.bfloat16).model.visual.eval()
    grid = torch.tensor([[1, 2, 2]])
    patches = torch.randn(4, visual.config.in_channels * 2 * visual.config.patch_size**2)
    with torch.no_grad():
        a = visual(patches, grid_thw=grid).pooler_output
        b = visual(patches.to(torch.bfloat16), grid_thw=grid).pooler_output
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_loader_hands_pixels_over_in_the_vision_towers_dtype():
    from types import SimpleNamespace

    from hivig.tiny import tiny_model, tiny_processor
    from train.data import PackDataset
    from train.sft import _vision_dtype

    model = tiny_model(tiny_processor()).to(torch.bfloat16)
    c = SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda m: m),
                        model=SimpleNamespace(model=model))  # fmt: skip
    assert _vision_dtype(c) == torch.bfloat16
    sample = _sample(5, 2, images=1)
    data = PackDataset([Sample("a", "critique", sample)], [[0]], lambda p: p, _vision_dtype(c))
    assert data[0].inputs["pixel_values"].dtype == torch.bfloat16


def test_collate_prepends_text_row_to_three_row_mrope():
    s = _sample(4, 1)
    s["position_ids"] = torch.full((3, 4), 9)
    pos = collate_pack([s]).inputs["position_ids"]
    assert pos[0, 0].tolist() == [0, 1, 2, 3] and pos[1:, 0].eq(9).all()


def test_collate_rejects_inconsistent_samples():
    bad = _sample(4, 1)
    bad["labels"] = bad["labels"][:3]
    with pytest.raises(ValueError):
        collate_pack([bad])
    with pytest.raises(ValueError):
        collate_pack([])


def test_cu_seq_lens():
    assert cu_seq_lens([3, 5, 2]).tolist() == [0, 3, 8, 10]
    assert cu_seq_lens([3]).dtype == torch.int32


# --------------------------------------------------------------------------------------------
# Metric loggers and config


def test_jsonl_logger_appends_and_keeps_nan_readable(tmp_path):
    path = tmp_path / "m.jsonl"
    for step in (1, 2):
        lg = JsonlLogger(path)
        lg.log({"loss": 1.5, "grad_norm": math.nan}, step)
        lg.close()
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["grad_norm"] == "nan"


def test_stdout_logger_and_rank_gate(tmp_path):
    stream = io.StringIO()
    StdoutLogger(stream).log({"loss": 0.5, "samples": 3}, 4)
    assert stream.getvalue() == "step 4: loss=0.5 samples=3\n"
    assert isinstance(build_metric_logger(["stdout"], tmp_path, is_main=False), NullLogger)
    with pytest.raises(ValueError):
        build_metric_logger(["carrier-pigeon"], tmp_path, is_main=True)


def test_config_overrides_and_named_errors():
    tiny = "model.tiny=true"
    cfg = load_config(TrainConfig, None, [tiny, "data=/d", "out=/o", "optim.lr=1e-5"])
    assert (cfg.data, cfg.out, cfg.optim.lr) == ("/d", "/o", 1e-5)
    with pytest.raises(ConfigError, match="optim.warmup_ratio"):
        load_config(TrainConfig, None, [tiny, "optim.warmup_ratio=1.5"])
    with pytest.raises(ConfigError, match="dataset.token_budget"):
        load_config(TrainConfig, None, [tiny, "dataset.token_budget=0"])
    with pytest.raises(ConfigError, match="nothing to train"):
        load_config(TrainConfig, None, [tiny, "model.train_llm=false", "model.train_merger=false"])
    with pytest.raises(ConfigError):
        load_config(TrainConfig, None, [tiny, "optim.no_such_field=1"])
    with pytest.raises(ConfigError, match="loop.peak_tflops_override"):
        load_config(TrainConfig, None, [tiny, "loop.peak_tflops_override=-1"])


@pytest.mark.parametrize("flag", ["train_merger", "train_vit", "train_deepstack"])
def test_lora_refuses_module_group_flags_it_would_ignore(flag):
    base = ["lora.enabled=true", "model.train_merger=false", "model.tiny=true"]
    with pytest.raises(ConfigError, match=f"`model.{flag}`"):
        load_config(TrainConfig, None, [*base, f"model.{flag}=true"])
    cfg = load_config(TrainConfig, None, base)  # adapters only: valid
    assert cfg.lora.enabled and not cfg.model.train_merger


def test_cli_help_names_the_merge_lora_command(capsys):
    from train.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "merge-lora" in capsys.readouterr().out


def test_resume_check_names_what_changed():
    from train.checkpoint import TrainerState, check_resumable

    saved = TrainerState(step=5, world_size=8, grad_accum=4, plan_hash="abc")
    check_resumable(saved, TrainerState(world_size=8, grad_accum=4, plan_hash="abc"), "ck")
    with pytest.raises(ConfigError, match=r"world_size: checkpoint 8, this run 16") as e:
        check_resumable(saved, TrainerState(world_size=16, grad_accum=2, plan_hash="abc"), "ck")
    assert "grad_accum" in str(e.value) and "plan_hash" not in str(e.value)


def test_plan_fingerprint_follows_packs_and_step_grouping():
    from train.data import plan_fingerprint

    kw = dict(budget=10, seed=0, epoch=0, shuffle=True)
    a = plan_epoch([10] * 8, world=2, grad_accum=2, **kw)
    assert plan_fingerprint(a) == plan_fingerprint(
        plan_epoch([10] * 8, world=2, grad_accum=2, **kw)
    )
    assert plan_fingerprint(a) != plan_fingerprint(
        plan_epoch([10] * 8, world=1, grad_accum=4, **kw)
    )
    assert plan_fingerprint(a) != plan_fingerprint(
        plan_epoch([10] * 9, world=2, grad_accum=2, **kw)
    )


# --------------------------------------------------------------------------------------------
# Committed config files

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "path", sorted((ROOT / "configs" / "train").glob("*.yaml")), ids=lambda p: p.name
)
def test_train_yaml_validates_and_documents_its_launch(path):
    cfg = load_config(TrainConfig, path, ["data=/data"])
    text = path.read_text()
    assert text.startswith("#")
    assert "python -m train" in text or "accelerate launch" in text
    assert cfg.data == "/data"


def test_paper_defaults_in_the_8b_config():
    cfg = load_config(TrainConfig, ROOT / "configs" / "train" / "qwen3vl_8b_full.yaml")
    assert (cfg.optim.lr, cfg.optim.scheduler, cfg.loop.epochs) == (5e-6, "cosine", 1)
    assert cfg.optim.global_batch_samples == 256 and not cfg.model.train_vit
    lora = load_config(TrainConfig, ROOT / "configs" / "train" / "qwen3vl_8b_lora.yaml")
    assert lora.lora.enabled and lora.optim.lr == 1e-4 and not lora.model.train_merger


@pytest.mark.parametrize("name", ["zero2", "zero3", "ddp"])
def test_accelerate_configs_parse_and_point_at_deepspeed_files(name):
    launch = yaml.safe_load((ROOT / "configs" / "accelerate" / f"{name}.yaml").read_text())
    if name == "ddp":
        assert launch["distributed_type"] == "MULTI_GPU"
        return
    assert launch["distributed_type"] == "DEEPSPEED"
    ds = json.loads((ROOT / launch["deepspeed_config"]["deepspeed_config_file"]).read_text())
    zero = ds["zero_optimization"]
    assert zero["stage"] == int(name[-1])
    # ZeRO-2 overlaps the gradient reduce-scatter with backward (proven by the two-process
    # DeepSpeed test in test_train_distributed.py, which launches with this file).
    assert zero["overlap_comm"] is (name == "zero2")
    assert "optimizer" not in ds  # AdamW is built in code with our parameter groups
    assert ds["bf16"]["enabled"] is True
    if name == "zero3":
        assert zero["stage3_gather_16bit_weights_on_model_save"] is True


def test_step_normaliser_comes_from_the_plan():
    from train.data import step_supervised

    plan = plan_epoch([10] * 8, budget=10, seed=0, epoch=0, world=2, grad_accum=2, shuffle=False)
    supervised = [1, 2, 3, 4, 5, 6, 7, 8]
    total, per_rank = step_supervised(plan, 0, supervised)
    # Step 0 = packs 0..3: rank 0 gets packs 0, 2 (samples 0, 2); rank 1 packs 1, 3.
    assert per_rank == [1 + 3, 2 + 4] and total == 10
    assert step_supervised(plan, 1, supervised)[0] == 5 + 6 + 7 + 8


def test_tensorboard_sink_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    lg = build_metric_logger(["tensorboard"], tmp_path, is_main=True)
    lg.log({"loss": 1.0}, 1)
    lg.close()
    assert list((tmp_path / "tensorboard").glob("events.*"))
    assert (tmp_path / "metrics.jsonl").is_file()  # JSONL is always written


# --------------------------------------------------------------------------------------------
# SLURM launcher (run with stub srun/scontrol/git/accelerate on PATH)


def _stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def _sbatch(tmp_path: Path, env_extra: dict[str, str], *args: str, git: str = "exit 0\n"):
    import subprocess

    bin_dir, venv = tmp_path / "bin", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    bin_dir.mkdir(parents=True)
    _stub(bin_dir / "git", git)  # default: a clean tree
    _stub(bin_dir / "scontrol", "echo node-a; echo node-b\n")
    _stub(bin_dir / "srun", 'while [[ "$1" == --* ]]; do shift; done; exec "$@"\n')
    _stub(bin_dir / "accelerate", f'printf "%s\\n" "$@" > {tmp_path / "argv"}\n')
    (tmp_path / "data").mkdir()
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HIVIG_REPO": str(ROOT),
        "HIVIG_VENV": str(venv),
        "HIVIG_DATA_ROOT": str(tmp_path / "data"),
        "HIVIG_RUNS": str(tmp_path / "runs"),
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_JOB_ID": "1234",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NAME": "hivig-train",
        "SLURM_CPUS_PER_TASK": "8",
        **env_extra,
    }
    env = {k: v for k, v in env.items() if v}
    cmd = ["bash", str(ROOT / "slurm" / "train.sbatch"), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)


def test_sbatch_passes_overrides_verbatim_and_sizes_from_slurm(tmp_path):
    odd = "metrics.wandb_project=a b;$(touch pwned)"
    proc = _sbatch(tmp_path, {}, "configs/train/tiny_cpu.yaml", odd, "optim.lr=1e-5")
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[-2:] == [odd, "optim.lr=1e-5"] and not (ROOT / "pwned").exists()
    assert argv[argv.index("--num_processes") + 1] == "8"  # 2 nodes × SLURM_GPUS_ON_NODE
    assert argv[argv.index("--machine_rank") + 1] == "1"
    assert argv[argv.index("--main_process_ip") + 1] == "node-a"
    assert f"data={tmp_path / 'data'}/gen" in argv and "loop.resume=auto" in argv


def test_sbatch_requires_the_data_and_output_roots(tmp_path):
    proc = _sbatch(tmp_path, {"HIVIG_DATA_ROOT": ""}, "configs/train/tiny_cpu.yaml")
    assert proc.returncode != 0 and "HIVIG_DATA_ROOT" in proc.stderr
    assert not (tmp_path / "argv").exists()


def test_sbatch_refuses_a_dirty_tree_unless_allowed(tmp_path):
    dirty = 'echo " M train/sft.py"\n'
    proc = _sbatch(tmp_path / "a", {}, "configs/train/tiny_cpu.yaml", git=dirty)
    assert proc.returncode == 1 and "uncommitted changes" in proc.stderr
    proc = _sbatch(tmp_path / "b", {"ALLOW_DIRTY": "1"}, "configs/train/tiny_cpu.yaml", git=dirty)
    assert proc.returncode == 0, proc.stderr


def test_activation_checkpointing_is_enabled_without_deprecated_calls():
    import warnings

    from hivig.models.qwen_vl import enable_activation_checkpointing
    from hivig.tiny import tiny_model, tiny_processor

    model = tiny_model(tiny_processor())
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        enable_activation_checkpointing(model)
    flag = getattr(model, "is_activation_checkpointing", None)
    if flag is None:  # older transformers 5.x: the gradient-checkpointing name only
        flag = model.is_gradient_checkpointing
    assert flag


def test_export_reads_the_state_dict_on_rank_zero_only_outside_zero3(monkeypatch, tmp_path):
    # ZeRO-2/DDP: get_state_dict copies every weight to host memory; only rank 0 needs them.
    import train.checkpoint as ckpt

    class Acc:
        calls = 0
        device = "cpu"

        def get_state_dict(self, model):
            Acc.calls += 1
            return {}

    monkeypatch.setattr(ckpt, "rank_and_world", lambda: (1, 2))
    monkeypatch.setattr(ckpt, "_state_dict_is_collective", lambda acc: False)
    ckpt.export_final(tmp_path, Acc(), torch.nn.Linear(1, 1), None, None, lora=False)
    assert Acc.calls == 0 and not any(tmp_path.iterdir())
    monkeypatch.setattr(ckpt, "_state_dict_is_collective", lambda acc: True)  # every rank
    ckpt.export_final(tmp_path, Acc(), torch.nn.Linear(1, 1), None, None, lora=False)
    assert Acc.calls == 1


def test_export_failure_on_rank_zero_is_raised_not_left_for_a_barrier(monkeypatch, tmp_path):
    import train.checkpoint as ckpt

    class Acc:
        device = "cpu"

        def get_state_dict(self, model):
            return {}

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_state_dict_is_collective", lambda acc: False)
    monkeypatch.setattr(ckpt, "_write_final", broken)
    with pytest.raises(OSError, match="disk full"):
        ckpt.export_final(tmp_path, Acc(), torch.nn.Linear(1, 1), None, None, lora=False)


@pytest.mark.parametrize(
    ("kind", "ds", "expected"),
    [
        ("NO", None, False),
        ("MULTI_GPU", None, False),
        ("MULTI_CPU", None, False),
        ("FSDP", None, True),
        ("DEEPSPEED", {"zero_optimization": {"stage": 2}}, False),
        ("DEEPSPEED", {"zero_optimization": {"stage": 3}}, True),
        (
            "DEEPSPEED",
            {"zero_optimization": {"stage": 2}, "tensor_parallel": {"autotp_size": 2}},
            True,
        ),
    ],
)
def test_which_setups_gather_the_state_dict_on_every_rank(kind, ds, expected):
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    import train.checkpoint as ckpt

    plugin = SimpleNamespace(deepspeed_config=ds) if ds else None
    acc = SimpleNamespace(
        distributed_type=DistributedType[kind], state=SimpleNamespace(deepspeed_plugin=plugin)
    )
    assert ckpt._state_dict_is_collective(acc) is expected
