"""Training throughput on one GPU: tokens/s/GPU and MFU of a random-init Qwen3-VL of a given shape.

    python benchmarks/bench_train_gpu.py                          # Qwen3-VL-8B shape, H100/H200
    python benchmarks/bench_train_gpu.py --images 1 --text 2000 --samples-per-pack 4
    python benchmarks/bench_train_gpu.py --preset tiny --device cpu --steps 2   # smoke test
    python benchmarks/bench_train_gpu.py --attn flex --checkpoint-layers 0.5
    python benchmarks/bench_train_gpu.py --compare-attention --layers 2   # packed == per sample
    python benchmarks/bench_train_gpu.py --grad-check            # flex bf16 grads, 8B heads

One packed row per step (the recipe's micro-batch): ``--samples-per-pack`` samples, each with
``--images`` screenshots of ``--screen`` resized to the canonical frame plus ``--text`` text
tokens of which ``--answer`` are supervised. The step is the recipe's: frozen ViT, trained merger
and LLM, bf16, the attention backend of ``--attn`` (resolved like the recipe's
``model.attn_implementation``; never a silent fallback, the result names it), LLM gradient
checkpointing on ``--checkpoint-layers``, chunked CE, AdamW. MFU uses the causal-exact FLOP
count of ``train.flops`` (``lm_head`` on supervised positions only) against the GPU's dense bf16
peak, looked up from its name (``train.flops.PEAK_BF16_TFLOPS``) unless ``--peak-tflops`` is
given; null when unknown. Weights are random: the numbers are speed, not quality. Single GPU, no
DeepSpeed.

``--compare-attention`` instead runs one packed row through every available backend and
reports the largest deviation of its last hidden states from the per-sample SDPA reference.
``--grad-check`` runs the flex kernel alone at the model's attention shape (8B: 32 query and 8
KV heads of 128) on packs of varying lengths and sample counts, and compares its output and the
gradients of q, k and v with a float64 per-sample reference. Every mode reports ``pass`` against
its tolerance (``TOLERANCES``): bf16 on CUDA, fp32 on CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from hivig.config import FrameConfig
from hivig.models.qwen_vl import (
    apply_freezing,
    attention_backend_of,
    enable_activation_checkpointing,
    flash_attn_available,
    mrope_position_ids,
    parameter_groups,
    resolve_attention,
    set_attention,
)
from hivig.vision import smart_resize
from train.collate import PackedBatch, collate_pack
from train.flops import device_peak_tflops, mfu, shape_from_config, step_flops
from train.loss import CriticLoss

# Qwen3-VL-8B; token ids are the Qwen3VLConfig defaults.
QWEN3VL_8B = {
    "text_config": {
        "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
        "rope_theta": 5_000_000.0,
        "rope_scaling": {
            "rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True,
        },
    },
    "vision_config": {
        "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
        "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3,
        "out_hidden_size": 4096, "num_position_embeddings": 2304,
        "deepstack_visual_indexes": [8, 16, 24],
    },
}  # fmt: skip


# Relative tolerances per compute dtype. Forward: mean |packed - reference| / mean |reference| of
# the last hidden states (2 layers of bf16 rounding differences between kernels); grads:
# ||x - reference|| / ||reference|| of one attention call against float64 (bf16 keeps 8 bits of
# mantissa: about 0.4 % per element, accumulated over the key length).
TOLERANCES = {
    "bfloat16": {"forward_rel_mean": 3e-2, "grad_rel": 2e-2},
    "float32": {"forward_rel_mean": 1e-4, "grad_rel": 1e-4},
}
MFU_FLOOR = 0.05
"""Lowest MFU a CUDA benchmark run passes with (the recipe targets 35-45 %)."""

# Packs of the grad check, as sample lengths: one long sample, uneven samples with lengths off the
# 128-token tile, and many short ones (scaled down 64x at the tiny preset).
GRAD_PACKS = ((16_384,), (7_001, 5_000, 4_383), (3_001, 1_000, 12_000), (1_024,) * 16)
"""Checked after the benchmark's own pack (its sample lengths from the shape arguments)."""


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=("8b", "tiny"), default="8b")
    p.add_argument("--layers", type=int, default=0, help="override LLM depth (0 = preset)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--samples-per-pack", type=int, default=2)
    p.add_argument("--images", type=int, default=4, help="screenshots per sample")
    p.add_argument("--screen", default="1920x1080")
    p.add_argument("--max-pixels", type=int, default=FrameConfig().max_pixels)
    p.add_argument("--text", type=int, default=2000, help="text tokens per sample")
    p.add_argument("--answer", type=int, default=1500, help="supervised tokens per sample")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--chunk", type=int, default=4096, help="chunked-CE rows")
    p.add_argument("--no-checkpointing", action="store_true")
    p.add_argument("--checkpoint-layers", type=float, default=1.0, help="fraction or count")
    p.add_argument(
        "--attn", default="auto", choices=("auto", "flash_attention_2", "flex", "sdpa", "eager")
    )
    p.add_argument("--compare-attention", action="store_true")
    p.add_argument("--grad-check", action="store_true")
    p.add_argument(
        "--peak-tflops", type=float, default=0.0, help="per-GPU peak; 0 = look up the GPU name"
    )
    p.add_argument("--json", default=None, help="also write the result here")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> Qwen3VLConfig:
    if args.preset == "tiny":
        from hivig.tiny import tiny_config, tiny_processor

        config = tiny_config(tiny_processor())
    else:
        config = Qwen3VLConfig(**QWEN3VL_8B, tie_word_embeddings=False, use_cache=False)
    if args.layers:
        config.text_config.num_hidden_layers = args.layers
    return config


def synthetic_sample(config: Qwen3VLConfig, args: argparse.Namespace, seed: int) -> dict:
    """Token ids, pre-shifted labels, 4-row positions and random patches of one sample."""
    g = torch.Generator().manual_seed(seed)
    vc = config.vision_config
    factor = vc.patch_size * vc.spatial_merge_size
    w, h = (int(v) for v in args.screen.split("x"))
    rh, rw = smart_resize(h, w, factor, FrameConfig().min_pixels, args.max_pixels)
    grid = torch.tensor([[1, rh // vc.patch_size, rw // vc.patch_size]] * args.images)
    per_image = int(grid[0].prod()) // vc.spatial_merge_size**2
    special = {config.image_token_id, config.vision_start_token_id, config.vision_end_token_id}
    vocab = config.text_config.vocab_size

    def text(n: int) -> list[int]:
        ids = torch.randint(0, min(vocab, 150_000), (n,), generator=g).tolist()
        return [i if i not in special else 0 for i in ids]

    ids: list[int] = text(8)
    for _ in range(args.images):
        ids += [config.vision_start_token_id, *([config.image_token_id] * per_image)]
        ids += [config.vision_end_token_id]
    ids += text(args.text)
    input_ids = torch.tensor(ids)
    labels = torch.full_like(input_ids, -100)
    labels[-args.answer - 1 : -1] = input_ids[-args.answer :]
    mrope = mrope_position_ids(
        input_ids,
        grid,
        image_token_id=config.image_token_id,
        spatial_merge_size=vc.spatial_merge_size,
    )
    dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    patches = int(grid.prod(dim=-1).sum())
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": torch.cat([torch.arange(len(ids))[None], mrope]),
        "pixel_values": torch.randn(patches, dim, generator=g),
        "image_grid_thw": grid,
    }


def build_model(config: Qwen3VLConfig, args: argparse.Namespace) -> Any:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    attn = resolve_attention(args.attn, cuda=device.type == "cuda")
    config._attn_implementation = "sdpa"  # switched below (flex needs its registration)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # build in bf16 directly: an fp32 8B copy would need 35 GB
    try:
        with device:
            model = Qwen3VLForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(previous)
    set_attention(model, attn)
    apply_freezing(model, train_vit=False, train_merger=True, train_deepstack=False, train_llm=True)
    if not args.no_checkpointing:
        enable_activation_checkpointing(model, args.checkpoint_layers)
    return model.train(), attn


def available_backends(device: str) -> list[str]:
    """Backends that can run a packed row on ``device`` (CPU: forward only for flex)."""
    names = ["sdpa", "flex"]
    if device.startswith("cuda") and flash_attn_available():
        names.append("flash_attention_2")
    return names


def compare_attention(argv: list[str] | None = None) -> dict[str, Any]:
    """Last hidden states of one packed row per backend vs each sample alone under SDPA."""
    args = _parse(argv)
    config = build_config(args)
    args.attn = "sdpa"
    model, _ = build_model(config, args)
    model.eval()
    samples = [synthetic_sample(config, args, seed=k) for k in range(args.samples_per_pack)]
    dtype = next(model.parameters()).dtype
    loss_fn = CriticLoss(model, chunk_tokens=args.chunk)

    def hidden(batch: PackedBatch) -> torch.Tensor:
        batch.inputs["pixel_values"] = batch.inputs["pixel_values"].to(dtype)
        with torch.no_grad():
            return loss_fn.hidden_states(batch.to(args.device).inputs)[0].float()

    reference = torch.cat([hidden(collate_pack([s])) for s in samples])
    scale = reference.abs().mean().item()
    tolerance = TOLERANCES[str(dtype).removeprefix("torch.")]["forward_rel_mean"]
    out: dict[str, Any] = {"tokens": int(reference.shape[0]), "reference": "sdpa per sample"}
    for name in available_backends(args.device):
        set_attention(model, name)
        got = hidden(collate_pack(samples))
        err = (got - reference).abs()
        rel = err.mean().item() / scale
        out[name] = {
            "max_abs_err": err.max().item(),
            "mean_abs_err": err.mean().item(),
            "mean_abs_value": scale,
            "rel_mean_err": rel,
            "pass": rel <= tolerance,
        }
    out["tolerance_rel_mean"] = tolerance
    out["pass"] = all(v["pass"] for k, v in out.items() if isinstance(v, dict))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return out


def _attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: list[int],
    upstream: torch.Tensor | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """Causal attention of each sample alone in float64, one query head at a time.

    float64 SDPA has only the math kernel, which builds the whole (L, L) score matrix: per head
    that is 2 GiB at 16k tokens, for all 32 heads at once it would not fit an H200. With
    ``upstream`` (the gradient of the output) the q/k/v gradients are computed head by head too.

    Returns:
        ``(out, grads)``: (1, H, L, D) float64, and (dq, dk, dv) or ``None``.
    """
    groups = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    grads = None
    if upstream is not None:
        kv_zeros = [torch.zeros(k.shape, dtype=torch.float64, device=k.device) for _ in (k, v)]
        grads = (torch.zeros_like(out), *kv_zeros)
    start = 0
    for n in lengths:
        sl = slice(start, start + n)
        for h in range(q.shape[1]):
            kv = h // groups
            qh, kh, vh = (
                t[:, i : i + 1, sl].detach().double().requires_grad_(upstream is not None)
                for t, i in ((q, h), (k, kv), (v, kv))
            )
            with torch.enable_grad() if upstream is not None else torch.no_grad():
                oh = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
            out[:, h : h + 1, sl] = oh.detach()
            if grads is not None:
                dq, dk, dv = torch.autograd.grad(oh, (qh, kh, vh), upstream[:, h : h + 1, sl])
                grads[0][:, h : h + 1, sl] += dq
                grads[1][:, kv : kv + 1, sl] += dk
                grads[2][:, kv : kv + 1, sl] += dv
        start += n
    return out, grads


def grad_check(argv: list[str] | None = None) -> dict[str, Any]:
    """Flex attention's output and q/k/v gradients on varying packs against float64.

    CUDA runs the compiled kernel in bf16; CPU runs the eager path in fp32 and, flex having no
    CPU backward, checks the forward only (``backward`` reports why).
    """
    from hivig.models._attention import flex_packed_attention, packed_block_mask

    args = _parse(argv)
    text = build_config(args).text_config
    heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    cuda = args.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    tol = TOLERANCES[str(dtype).removeprefix("torch.")]["grad_rel"]
    scale_down = 1 if args.preset == "8b" else 64
    g = torch.Generator().manual_seed(0)
    # The benchmark's own pack first: its compile then warms the cache the benchmark steps reuse.
    bench_pack = [len(synthetic_sample(build_config(args), args, k)["input_ids"])
                  for k in range(args.samples_per_pack)]  # fmt: skip
    packs = []
    for lengths in (bench_pack, *[[max(2, n // scale_down) for n in p] for p in GRAD_PACKS]):
        total = sum(lengths)
        q, k, v = (
            torch.randn(1, h, total, head_dim, generator=g).to(args.device, dtype)
            for h in (heads, kv_heads, kv_heads)
        )
        mask = packed_block_mask(lengths, device=args.device)
        for t in (q, k, v):
            t.requires_grad_(cuda)
        # The scale the model passes (1/sqrt(head_dim)), so the compiled graph is the model's.
        out, _ = flex_packed_attention(None, q, k, v, mask, scaling=head_dim**-0.5)  # (1,L,H,D)
        out = out.transpose(1, 2)
        upstream = torch.randn(out.shape, generator=g).to(args.device) if cuda else None
        ref, ref_grads = _attention_reference(
            q, k, v, lengths, None if upstream is None else upstream.double()
        )
        row = {"lengths": lengths, "out": _rel(out, ref)}
        if cuda:
            out.backward(upstream.to(dtype))
            for name, got, want in zip("qkv", (q, k, v), ref_grads, strict=True):
                row[f"d{name}"] = _rel(got.grad, want)
        else:
            row["backward"] = "not run: flex attention has no CPU backward"
        row["pass"] = all(v <= tol for key, v in row.items() if key in ("out", "dq", "dk", "dv"))
        packs.append(row)
    result = {
        "device": args.device,
        "dtype": str(dtype).removeprefix("torch."),
        "heads": [heads, kv_heads, head_dim],
        "tolerance_rel": tol,
        "packs": packs,
        "pass": all(p["pass"] for p in packs),
    }
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return result


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def run(argv: list[str] | None = None) -> dict[str, float]:
    args = _parse(argv)
    config = build_config(args)
    model, attn = build_model(config, args)
    loss_fn = CriticLoss(model, chunk_tokens=args.chunk)
    groups = parameter_groups(model, lr_llm=1e-6, lr_merger=1e-6, lr_vit=1e-6, weight_decay=0.0)
    fused = args.device.startswith("cuda")
    optimizer = torch.optim.AdamW(groups, lr=1e-6, fused=fused)
    samples = [synthetic_sample(config, args, seed=k) for k in range(args.samples_per_pack)]
    batch: PackedBatch = collate_pack(samples)
    dtype = next(model.parameters()).dtype
    batch.inputs["pixel_values"] = batch.inputs["pixel_values"].to(dtype)
    batch = batch.to(args.device)
    shape = shape_from_config(config, merger_trained=True)
    sup = batch.meta.supervised
    flops = step_flops(shape, batch.meta.seq_lens, batch.meta.image_patches, supervised_tokens=sup)
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.warmup + args.steps):
        _sync(args.device)
        t0 = time.perf_counter()
        loss_sum, n = loss_fn(batch.inputs)
        (loss_sum / n).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _sync(args.device)
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
        if not torch.isfinite(loss_sum):
            raise FloatingPointError(f"non-finite loss at step {step}")
    t = statistics.median(times)
    peak = device_peak_tflops(args.peak_tflops) if args.device.startswith("cuda") else None
    peak = args.peak_tflops if peak is None and args.peak_tflops > 0 else peak
    result = {
        "preset": args.preset,
        "attn": attn,
        "checkpoint_layers": 0.0 if args.no_checkpointing else args.checkpoint_layers,
        "tokens_per_pack": batch.meta.tokens,
        "step_time_s": t,
        "tokens_per_s_per_gpu": batch.meta.tokens / t,
        "samples_per_s_per_gpu": len(samples) / t,
        "tflops_per_step": flops / 1e12,
        "peak_tflops": peak,
        "mfu": mfu(flops, t, 1, peak),
        "mfu_non_causal": mfu(
            step_flops(
                shape,
                batch.meta.seq_lens,
                batch.meta.image_patches,
                supervised_tokens=sup,
                causal=False,
            ),
            t,
            1,
            peak,
        ),
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if fused else 0.0,
        "loss": float(loss_sum.detach() / n),
    }
    total_gib = torch.cuda.get_device_properties(0).total_memory / 2**30 if fused else None
    # What the text tower really ran, read back from the model (not the name resolved above).
    ran = attention_backend_of(model)
    checks = {
        "finite_loss": math.isfinite(result["loss"]),
        "backend_as_requested": ran == attn,
        # A floor far under the 35-45 % target: below it something is broken (a CPU fallback,
        # an eager kernel, a sync per layer), not slow.
        "mfu_at_least_5_percent": not fused
        or (result["mfu"] is not None and result["mfu"] >= MFU_FLOOR),
        "mfu_below_1": result["mfu"] is None or result["mfu"] < 1,
        "fits_memory": total_gib is None or result["peak_mem_gib"] < total_gib,
    }
    result["checks"] = checks
    result["pass"] = all(checks.values())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)
    return result


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


if __name__ == "__main__":
    import sys

    if "--compare-attention" in sys.argv[1:]:
        report = compare_attention()
        print(json.dumps(report, indent=2))
        raise SystemExit(0 if report["pass"] else 1)
    if "--grad-check" in sys.argv[1:]:
        report = grad_check()
        print(json.dumps(report, indent=2))
        raise SystemExit(0 if report["pass"] else 1)
    report = run()
    for key, value in report.items():
        print(f"{key}: {value:.4g}" if isinstance(value, float) else f"{key}: {value}")
    raise SystemExit(0 if report["pass"] else 1)
