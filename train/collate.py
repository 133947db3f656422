"""Padding-free collation: several encoded samples become one packed row (batch size 1).

The recipe that reproduces the unpacked loss exactly:

- ``input_ids`` and pre-shifted ``labels`` are concatenated: (1, L);
- ``position_ids`` are (4, 1, L): row 0 = text positions restarting at 0 for every sample (the
  model finds the sample boundaries from these restarts), rows 1-3 = that sample's MRoPE t/h/w;
- no attention mask and no cache (the model call sets ``attention_mask=None, use_cache=False``);
- ``pixel_values`` and ``image_grid_thw`` are concatenated in sample order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

IGNORE_INDEX = -100


@dataclass
class PackMeta:
    """What the loop needs besides tensors: ids for guards, lengths for FLOPs and throughput."""

    sample_ids: list[str]
    """Ids of the packed samples, in order."""
    seq_lens: list[int]
    """Length of every sample in tokens (text + visual)."""
    image_patches: list[int] = field(default_factory=list)
    """ViT patches of every image (t·h·w of its grid), for the FLOP count."""
    supervised: int = 0
    """Labels != -100 in the row (after the pre-shift)."""
    kinds: list[str] = field(default_factory=list)
    """Sample kinds (history | critique), for per-kind loss reporting."""

    @property
    def tokens(self) -> int:
        """Total tokens in the row."""
        return sum(self.seq_lens)


@dataclass
class PackedBatch:
    """One packed micro-batch: model inputs plus metadata."""

    inputs: dict[str, torch.Tensor]
    """Model inputs: ids, labels, positions and, with images, pixel values and grids."""
    meta: PackMeta
    """Ids, lengths and counts."""

    def to(self, device: torch.device | str) -> PackedBatch:
        """Move tensors to ``device`` (non-blocking when pinned)."""
        moved = {k: v.to(device, non_blocking=True) for k, v in self.inputs.items()}
        return PackedBatch(moved, self.meta)

    def pin_memory(self) -> PackedBatch:
        """Called by the DataLoader when ``pin_memory=True``."""
        return PackedBatch({k: v.pin_memory() for k, v in self.inputs.items()}, self.meta)


def _field(sample: Any, name: str) -> Any:
    if isinstance(sample, Mapping):
        return sample.get(name)
    return getattr(sample, name, None)


def _positions(sample: Any, n: int) -> torch.Tensor:
    pos = torch.as_tensor(_field(sample, "position_ids"))
    pos = pos.reshape(pos.shape[0], -1)  # accept (R, L) or (R, 1, L)
    if pos.shape[-1] != n:
        raise ValueError(f"position_ids cover {pos.shape[-1]} tokens, input_ids {n}")
    if pos.shape[0] == 3:
        # MRoPE rows only: prepend the plain per-sample text positions (row 0 is not MRoPE).
        pos = torch.cat([torch.arange(n, dtype=pos.dtype)[None], pos], dim=0)
    if pos.shape[0] != 4:
        raise ValueError(f"position_ids need 3 or 4 rows, got {pos.shape[0]}")
    return pos


def collate_pack(
    samples: Sequence[Any], sample_ids: Sequence[str] = (), pixel_dtype: torch.dtype | None = None
) -> PackedBatch:
    """Concatenate encoded samples into one padding-free row.

    Args:
        samples: Encoded samples (objects or mappings) with ``input_ids`` (L,), pre-shifted
            ``labels`` (L,), ``position_ids`` (4, L) or (3, L), and optionally
            ``pixel_values`` (P, D) and ``image_grid_thw`` (n, 3).
        sample_ids: Ids in the same order (default ``0..k-1``).
        pixel_dtype: Cast ``pixel_values`` to this dtype (the vision tower's own, which it would
            cast to anyway): bf16 halves what loader workers pass through shared memory.

    Returns:
        A ``PackedBatch`` with batch dimension 1.

    Raises:
        ValueError: Empty input or inconsistent shapes within a sample.
    """
    if not samples:
        raise ValueError("cannot collate an empty pack")
    ids, labels, pos, pixels, grids, lens, patches, kinds = [], [], [], [], [], [], [], []
    for s in samples:
        x = torch.as_tensor(_field(s, "input_ids")).reshape(-1)
        y = torch.as_tensor(_field(s, "labels")).reshape(-1)
        if x.shape != y.shape:
            raise ValueError(f"input_ids {tuple(x.shape)} and labels {tuple(y.shape)} differ")
        ids.append(x)
        labels.append(y)
        pos.append(_positions(s, x.numel()))
        lens.append(x.numel())
        kinds.append(str(_field(s, "kind") or ""))
        pv, grid = _field(s, "pixel_values"), _field(s, "image_grid_thw")
        if pv is not None and grid is not None and len(grid):
            pixels.append(torch.as_tensor(pv))
            grids.append(torch.as_tensor(grid).reshape(-1, 3))
            patches.extend(int(g.prod()) for g in grids[-1])
    label_row = torch.cat(labels)[None]
    inputs = {
        "input_ids": torch.cat(ids)[None].long(),
        "labels": label_row.long(),
        "position_ids": torch.cat(pos, dim=1)[:, None, :].long(),  # (4, 1, L)
    }
    if pixels:
        inputs["pixel_values"] = torch.cat(pixels).to(pixel_dtype or pixels[0].dtype)
        inputs["image_grid_thw"] = torch.cat(grids).long()
    names = [str(i) for i in sample_ids] if sample_ids else [str(i) for i in range(len(samples))]
    meta = PackMeta(
        sample_ids=names,
        seq_lens=lens,
        image_patches=patches,
        supervised=int((label_row != IGNORE_INDEX).sum()),
        kinds=kinds,
    )
    return PackedBatch(inputs, meta)


def cu_seq_lens(seq_lens: Sequence[int]) -> torch.Tensor:
    """Cumulative lengths ``[0, n1, n1+n2, ...]`` as int32 (the varlen attention boundaries)."""
    out = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    out[1:] = torch.cumsum(torch.as_tensor(seq_lens, dtype=torch.int32), 0)
    return out
