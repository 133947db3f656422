"""Model FLOPs per optimizer step and MFU.

Counted from collator metadata (sequence lengths ΣS, ΣS² and ViT patches per image ΣP, ΣP²), so
logging MFU every step costs nothing. Recomputation (gradient checkpointing) is not counted.

Conventions, stated because they change the number:

- LLM attention ``causal``: 6 · L · H · d · ΣS² (fwd + bwd, half the score matrix); the
  ``non_causal`` convention (torchtitan, PaLM) counts 12 · L · H · d · ΣS² and reads higher.
- Multiplier per part: 3 (fwd + bwd incl. weight grads) when trained, 1 when frozen and not
  back-propagated through (the frozen ViT), 2 for the LLM linears under LoRA (fwd + input grads;
  adapters are negligible), i.e. 4 · N · S instead of 6 · N · S.
- ``lm_head`` runs on the supervised positions only (the chunked loss gathers them first), so it
  is charged per supervised token, not per token of the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FlopShape:
    """The numbers of a Qwen3-VL model that its FLOP count depends on."""

    llm_matmul_params: int
    """Non-embedding LLM matmul parameters, without ``lm_head`` (8B: 6.946e9)."""
    llm_layers: int
    """Decoder layers L."""
    llm_heads: int
    """Query heads H."""
    llm_head_dim: int
    """Head dimension d."""
    vit_params: int
    """ViT matmul parameters (patch embedding + blocks), per patch."""
    vit_layers: int
    """ViT depth."""
    vit_hidden: int
    """ViT width (attention FLOPs scale with it)."""
    merger_params: int
    """Main merger matmul parameters (applied per merged token, i.e. per 4 patches)."""
    deepstack_params: int
    """All DeepStack mergers together, per merged token."""
    head_params: int = 0
    """``lm_head`` parameters, vocab × hidden (8B: 0.622e9); applied per supervised token."""
    llm_trained: bool = True
    """Full LLM weights train (6·N·S); False means LoRA or frozen-with-backprop (4·N·S)."""
    vit_trained: bool = False
    """ViT trains (×3) or is frozen (×1)."""
    merger_trained: bool = True
    """Main merger trains (×3) or is frozen (×1)."""
    deepstack_trained: bool = False
    """DeepStack mergers train (×3) or are frozen (×1)."""


def _merger_params(hidden_in: int, out: int) -> int:
    # Two-layer MLP: (hidden·merge²) -> (hidden·merge²) -> out, per merged token.
    return hidden_in * hidden_in + hidden_in * out


def shape_from_config(config: Any, **trained: bool) -> FlopShape:
    """Derive a ``FlopShape`` from a ``Qwen3VLConfig`` (or any object with its fields).

    Args:
        config: Has ``text_config`` and ``vision_config`` with the Qwen3-VL field names.
        **trained: ``llm_trained``, ``vit_trained``, ``merger_trained``, ``deepstack_trained``.
    """
    t, v = config.text_config, config.vision_config
    hd = getattr(t, "head_dim", None) or t.hidden_size // t.num_attention_heads
    q, kv = t.num_attention_heads * hd, t.num_key_value_heads * hd
    attn = t.hidden_size * q + 2 * t.hidden_size * kv + q * t.hidden_size
    mlp = 3 * t.hidden_size * t.intermediate_size  # SwiGLU: gate, up, down
    llm = t.num_hidden_layers * (attn + mlp)
    patch_dim = v.in_channels * v.temporal_patch_size * v.patch_size**2
    vit_block = 4 * v.hidden_size**2 + 2 * v.hidden_size * v.intermediate_size
    vit = v.depth * vit_block + patch_dim * v.hidden_size
    merged_in = v.hidden_size * v.spatial_merge_size**2
    merger = _merger_params(merged_in, v.out_hidden_size)
    n_deepstack = len(getattr(v, "deepstack_visual_indexes", ()) or ())
    return FlopShape(
        llm_matmul_params=llm,
        llm_layers=t.num_hidden_layers,
        llm_heads=t.num_attention_heads,
        llm_head_dim=hd,
        vit_params=vit,
        vit_layers=v.depth,
        vit_hidden=v.hidden_size,
        merger_params=merger,
        deepstack_params=n_deepstack * merger,
        head_params=t.vocab_size * t.hidden_size,
        **trained,
    )


def step_flops(
    shape: FlopShape,
    seq_lens: Sequence[int],
    image_patches: Sequence[int] = (),
    *,
    supervised_tokens: int | None = None,
    causal: bool = True,
) -> float:
    """Model FLOPs of one training pass over the given samples.

    Args:
        shape: Model numbers and which parts train.
        seq_lens: Length S of every sample (text + visual tokens), not of the packed row:
            attention never crosses sample boundaries.
        image_patches: ViT patches P of every image (before the 2x2 merge).
        supervised_tokens: Positions that reach ``lm_head`` (labels != -100); ``None`` charges
            the head on every token (a model that computes all logits).
        causal: Causal-exact attention count (True) or the non-causal convention.

    Returns:
        FLOPs (float: 8B-scale steps exceed 2**63 only in theory, but floats are what MFU needs).
    """
    s1 = float(sum(seq_lens))
    s2 = float(sum(s * s for s in seq_lens))
    p1 = float(sum(image_patches))
    p2 = float(sum(p * p for p in image_patches))
    k_llm = 6.0 if shape.llm_trained else 4.0
    attn_coeff = 6.0 if causal else 12.0
    k_vit = 3.0 if shape.vit_trained else 1.0
    head_tokens = s1 if supervised_tokens is None else float(supervised_tokens)
    llm = k_llm * shape.llm_matmul_params * s1 + k_llm * shape.head_params * head_tokens
    llm_attn = attn_coeff * shape.llm_layers * shape.llm_heads * shape.llm_head_dim * s2
    vit = k_vit * 2.0 * shape.vit_params * p1
    vit_attn = k_vit * 4.0 * shape.vit_layers * shape.vit_hidden * p2
    merged = p1 / 4.0
    merger = (3.0 if shape.merger_trained else 1.0) * 2.0 * shape.merger_params * merged
    deepstack = (3.0 if shape.deepstack_trained else 1.0) * 2.0 * shape.deepstack_params * merged
    return llm + llm_attn + vit + vit_attn + merger + deepstack


def mfu(flops: float, seconds: float, devices: int, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: ``flops / (seconds · devices · peak)``, as a fraction.

    ``None`` when the peak is unknown (CPU, an unlisted GPU): no number beats a wrong one.
    """
    if peak_tflops is None:
        return None
    if seconds <= 0 or devices <= 0 or peak_tflops <= 0:
        return 0.0
    return flops / (seconds * devices * peak_tflops * 1e12)


PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 NVL", 835.0),
    ("H100 PCIE", 756.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
)
"""Dense (no sparsity) bf16 tensor-core peak per GPU, in TFLOP/s, matched in order against the
upper-cased ``torch.cuda.get_device_name()``; the specific H100 variants come before the
generic ``H100``, which is the SXM part (its name carries no form factor: "NVIDIA H100 80GB
HBM3")."""


def peak_tflops(device_name: str | None, override: float = 0.0) -> float | None:
    """Dense bf16 peak of one device for MFU, or ``None`` when unknown.

    Args:
        device_name: ``torch.cuda.get_device_name()``, or ``None`` on CPU.
        override: A positive value wins over the table (new or unlisted hardware).

    Returns:
        TFLOP/s per device; ``None`` on CPU or for a GPU missing from ``PEAK_BF16_TFLOPS``.
    """
    if override > 0:
        return override
    if not device_name:
        return None
    name = device_name.upper()
    return next((peak for key, peak in PEAK_BF16_TFLOPS if key in name), None)


def device_peak_tflops(override: float = 0.0) -> float | None:
    """``peak_tflops`` of this process's CUDA device (``None`` on CPU unless overridden)."""
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return peak_tflops(name, override)
