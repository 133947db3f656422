"""Token-normalised, chunked cross-entropy on supervised positions only.

The rule: for one optimizer step with G micro-steps on W ranks,
``N`` = supervised tokens summed over all of them (known from the pack plan), and each micro-step
back-propagates ``Σ CE × W / N``. ``× W`` undoes the data-parallel gradient average; the 1/G that
accelerate (DDP) or DeepSpeed would add is switched off by the caller.

The logits are never materialised for the whole row: hidden states at supervised positions
are gathered, then ``lm_head`` + fp32 CE run chunk by chunk under activation checkpointing, so at
most ``chunk × vocab`` fp32 logits exist at once, in forward and in backward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hivig.models.qwen_vl import packed_attention_inputs

IGNORE_INDEX = -100


def _chunk_ce_sum(hidden: torch.Tensor, labels: torch.Tensor, head: nn.Module) -> torch.Tensor:
    # Logits in fp32 for the softmax; (chunk, vocab) is the largest tensor this ever creates.
    logits = head(hidden).float()
    return F.cross_entropy(logits, labels, reduction="sum")


def chunked_cross_entropy(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    head: nn.Module,
    chunk_tokens: int = 2048,
    n_chunks: int | None = None,
) -> torch.Tensor:
    """Summed cross-entropy of ``head(hidden)`` against ``labels``, chunk by chunk.

    Args:
        hidden: (N, D) hidden states at supervised positions.
        labels: (N,) target ids (no ignore index left).
        head: The output projection (``lm_head``); called as a module so ZeRO-3 hooks fire.
        chunk_tokens: Rows per chunk; 0 means one call without recomputation.
        n_chunks: Call ``head`` exactly this many times (at least ``ceil(N / chunk_tokens)``),
            the extra calls on zero rows. ZeRO-3 all-gathers the head's weight on every call,
            so ranks must agree on the count (``sync_chunk_count``) or the job hangs.

    Returns:
        A scalar fp32 tensor equal to ``F.cross_entropy(head(hidden).float(), labels, "sum")``.
    """
    if chunk_tokens <= 0 or (hidden.shape[0] == 0 and n_chunks is None):
        # Exactly one head call, even without supervised rows.
        return F.cross_entropy(head(hidden).float(), labels, reduction="sum")
    needed = -(-hidden.shape[0] // chunk_tokens)
    calls = needed if n_chunks is None else n_chunks
    if calls < needed:
        raise ValueError(f"n_chunks={n_chunks} < {needed} chunks of {chunk_tokens} rows")
    total = hidden.new_zeros((), dtype=torch.float32)
    for i in range(calls):
        # Past the last row the slices are empty: a head call that only keeps ranks in step.
        rows = slice(i * chunk_tokens, (i + 1) * chunk_tokens)
        h, y = hidden[rows], labels[rows]
        if torch.is_grad_enabled():
            # Recompute the chunk's logits in backward instead of keeping them alive.
            total = total + checkpoint(_chunk_ce_sum, h, y, head, use_reentrant=False)
        else:
            total = total + _chunk_ce_sum(h, y, head)
    return total


def sync_chunk_count(rows: int, chunk_tokens: int, device: torch.device) -> int:
    """The largest chunk count any rank needs for ``rows`` supervised rows (a MAX all-reduce)."""
    import torch.distributed as dist

    count = torch.tensor([max(1, -(-rows // chunk_tokens))], device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def supervised_positions(
    hidden: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather (N, D) hidden states and (N,) labels where the pre-shifted label is supervised.

    Labels are pre-shifted by the collator (label ``t`` is the token that follows position
    ``t``), so no shift happens here; this is what keeps packing exact at sample boundaries.
    """
    mask = labels != IGNORE_INDEX
    return hidden[mask], labels[mask]


def normalise(loss_sum: torch.Tensor, global_tokens: int, world: int) -> torch.Tensor:
    """Scale a micro-step's summed loss by ``W / N``; ``N`` counts the whole step."""
    return loss_sum * (world / max(global_tokens, 1))


def _base_model(model: nn.Module) -> nn.Module:
    # peft wraps the transformers model; the LoRA layers live inside the base model.
    getter = getattr(model, "get_base_model", None)
    return getter() if callable(getter) else model


class CriticLoss(nn.Module):
    """The trained module: the VLM plus the chunked loss, so engines wrap one forward.

    ``forward(batch)`` returns ``(loss_sum, supervised_tokens)`` for one packed micro-batch.
    Accelerate/DeepSpeed wrap this module; checkpoints save ``self.model``.
    """

    def __init__(
        self,
        model: nn.Module,
        chunk_tokens: int = 2048,
        vit_guard: bool = True,
        sync_chunks: bool = False,
    ):
        super().__init__()
        self.model = model
        self.chunk_tokens = chunk_tokens
        self.vit_guard = vit_guard
        # ZeRO-3: every rank calls the head the same number of times (see chunked_cross_entropy).
        self.sync_chunks = sync_chunks

    def hidden_states(self, batch: dict[str, Any]) -> torch.Tensor:
        """Last hidden states (1, L, D) of a packed row; no logits, no cache, no mask."""
        base = _base_model(self.model)
        inner = base.model
        # Boundaries come from the restarts in position row 0: no dense mask, no cache.
        # Under the flex backend the row gets its per-sample block mask instead.
        packed = packed_attention_inputs(base, batch["position_ids"])
        out = inner(
            input_ids=batch["input_ids"],
            pixel_values=batch.get("pixel_values"),
            image_grid_thw=batch.get("image_grid_thw"),
            position_ids=batch["position_ids"],
            attention_mask=packed.get("attention_mask"),
            use_cache=False,
        )
        hidden = out.last_hidden_state
        if self.vit_guard and batch.get("pixel_values") is None:
            hidden = hidden + 0.0 * _dummy_vision_pass(inner)
        return hidden

    def forward(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed CE over supervised tokens and their count, for one packed micro-batch."""
        hidden = self.hidden_states(batch)
        h, y = supervised_positions(hidden, batch["labels"])
        head = _base_model(self.model).lm_head
        calls = (
            sync_chunk_count(y.numel(), self.chunk_tokens, h.device) if self.sync_chunks else None
        )
        loss_sum = chunked_cross_entropy(h, y, head, self.chunk_tokens, calls)
        return loss_sum, y.new_tensor(y.numel())


def _dummy_vision_pass(inner: nn.Module) -> torch.Tensor:
    """Run a 2x2-patch dummy image through the ViT and mergers; returns a scalar sum.

    Under ZeRO-3 every rank must run the same modules, otherwise parameter all-gathers diverge
    and the job hangs; a pack without images would skip the ViT. Adding ``0 ×`` this
    sum keeps the graph identical at no numerical cost.
    """
    visual = inner.visual
    vc = visual.config
    dim = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    merge = vc.spatial_merge_size
    param = next(visual.parameters())
    pixels = torch.zeros(merge * merge, dim, dtype=param.dtype, device=param.device)
    grid = torch.tensor([[1, merge, merge]], device=param.device)
    return _sum_tensors(visual(pixels, grid_thw=grid))


def _sum_tensors(obj: Any) -> torch.Tensor:
    if isinstance(obj, torch.Tensor):
        return obj.float().sum()
    if isinstance(obj, dict):
        obj = list(obj.values())
    elif hasattr(obj, "to_tuple"):
        obj = obj.to_tuple()
    parts = [_sum_tensors(o) for o in obj if isinstance(o, torch.Tensor | list | tuple | dict)]
    return torch.stack(parts).sum() if parts else torch.zeros(())
