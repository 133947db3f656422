"""Attention backends for padding-free packed rows (re-exported by ``qwen_vl``).

Three ways to keep samples of one packed row apart:

- ``flash_attention_2`` (optional extra ``hivig[flash-attn]``): transformers detects the sample
  boundaries from the restarts in position row 0 and runs the varlen kernel;
- ``flex`` (needs nothing beyond torch >= 2.5): PyTorch flex attention with a *per-sample block
  mask* built here from the sample lengths, in O(blocks²) memory, never an L × L mask. Tiles that
  cross two samples or lie above the diagonal are skipped, K/V are not repeated (GQA in the
  kernel). transformers' own ``flex_attention`` path would build the mask by evaluating a
  position-id closure with ``create_block_mask``, which compiles or materialises L × L;
- ``sdpa`` / ``eager``: transformers builds a dense L × L block-diagonal mask per forward (fine on
  CPU at test sizes, wasteful at 16k tokens).

The vision tower runs per image in every backend: varlen under FA2, one SDPA call per image
otherwise (``flex`` sets the vision tower to ``sdpa``).

``resolve_attention`` turns the configured name into an installed backend before any weights
load, so a missing package fails in the first second instead of after the job holds its GPUs.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch

from hivig.config import ATTENTION_BACKENDS as _ATTENTION_BACKENDS
from hivig.logging import get_logger

logger = get_logger(__name__)

# ``auto`` picks FA2 when installed on CUDA, else ``flex`` on CUDA and ``sdpa`` on CPU.
ATTENTION_BACKENDS = _ATTENTION_BACKENDS

FLEX_IMPLEMENTATION = "hivig_flex"
"""Name under which the flex backend is registered with transformers' attention interface."""

FLEX_BLOCK_SIZE = 128
"""Tile edge of the flex block mask, in tokens (the flex kernels' default)."""

FLASH_ATTN_HINT = (
    "flash-attn is not installed: `pip install hivig[flash-attn]` (builds from source, needs "
    "CUDA and a matching torch; see docs/training.md) or choose model.attn_implementation=flex, "
    "which needs no extra package"
)


class AttentionBackendError(ValueError):
    """The configured attention backend cannot run here (missing package or device)."""


def flash_attn_available() -> bool:
    """Whether the ``flash_attn`` package is importable (checked without importing it)."""
    return importlib.util.find_spec("flash_attn") is not None


def flex_available() -> bool:
    """Whether this torch has ``torch.nn.attention.flex_attention`` (torch >= 2.5)."""
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def resolve_attention(name: str, *, cuda: bool | None = None, training: bool = True) -> str:
    """Map an ``ATTENTION_BACKENDS`` value to the backend this process will use.

    Args:
        name: The configured value.
        cuda: Whether the model runs on CUDA; ``None`` asks torch.
        training: Whether gradients are needed (flex has no CPU backward).

    Returns:
        ``flash_attention_2``, ``flex``, ``sdpa`` or ``eager``.

    Raises:
        AttentionBackendError: Unknown name, or a backend whose package or device is missing.
    """
    if name not in ATTENTION_BACKENDS:
        raise AttentionBackendError(
            f"`model.attn_implementation` must be one of {ATTENTION_BACKENDS}, got {name!r}"
        )
    cuda = torch.cuda.is_available() if cuda is None else cuda
    if name == "auto":
        if cuda and flash_attn_available():
            return "flash_attention_2"
        return "flex" if cuda and flex_available() else "sdpa"
    if name == "flash_attention_2":
        if not flash_attn_available():
            raise AttentionBackendError(FLASH_ATTN_HINT)
        if not cuda:
            raise AttentionBackendError(
                "flash_attention_2 needs a CUDA device; use model.attn_implementation=sdpa on CPU"
            )
    if name == "flex" and not flex_available():
        raise AttentionBackendError(
            f"flex attention needs torch >= 2.5 (installed: {torch.__version__}); "
            "choose model.attn_implementation=sdpa"
        )
    if name == "flex" and training and not cuda:
        raise AttentionBackendError(
            "flex attention has no backward pass on CPU; train with "
            "model.attn_implementation=sdpa (or auto) on CPU"
        )
    return name


def transformers_implementation(backend: str) -> str | dict[str, str]:
    """The ``attn_implementation`` argument transformers gets for a resolved backend.

    ``flex`` registers ``FLEX_IMPLEMENTATION`` for the text model and keeps the vision tower on
    SDPA, which already runs one call per image.
    """
    if backend != "flex":
        return backend
    register_flex()
    return {"text_config": FLEX_IMPLEMENTATION, "vision_config": "sdpa"}


def set_attention(model: Any, backend: str) -> None:
    """Switch a built model (e.g. the tiny random one) to a resolved backend, in place."""
    implementation = transformers_implementation(backend)
    if isinstance(implementation, dict):
        model.config.text_config._attn_implementation = implementation["text_config"]
        model.config.vision_config._attn_implementation = implementation["vision_config"]
    else:
        model.set_attn_implementation(implementation)


def attention_backend_of(model: Any) -> str:
    """The backend a Qwen3-VL model's text tower runs (``flex`` for ours)."""
    name = model.config.text_config._attn_implementation
    return "flex" if name == FLEX_IMPLEMENTATION else name


# --------------------------------------------------------------------------------------------
# Per-sample block mask


def _block_bounds(lengths: Sequence[int], total: int, block: int) -> tuple[torch.Tensor, ...]:
    # Sample index of the first and last token of every tile: samples are contiguous and in
    # order, so two tiles share a sample iff their [first, last] sample ranges overlap.
    starts = torch.tensor([0, *lengths], dtype=torch.long).cumsum(0)[:-1]
    n_blocks = -(-total // block)
    first_tok = torch.arange(n_blocks, dtype=torch.long) * block
    last_tok = torch.clamp(first_tok + block - 1, max=total - 1)
    first = torch.searchsorted(starts, first_tok, right=True) - 1
    last = torch.searchsorted(starts, last_tok, right=True) - 1
    return first, last


def packed_block_mask(
    lengths: Sequence[int], *, device: torch.device | str = "cpu", block_size: int = FLEX_BLOCK_SIZE
) -> Any:
    """Flex-attention ``BlockMask`` for a row of samples: causal inside each, nothing across.

    Built from the sample lengths with (blocks × blocks) tensors: at 16k tokens and 128-token
    tiles that is 128 × 128 entries instead of a 16k × 16k mask. A tile is *full* (no mask_mod
    call in the kernel) when it lies strictly below the diagonal inside one sample, *partial*
    when it touches the diagonal or a sample boundary, and skipped otherwise.

    Args:
        lengths: Token count of every sample, in row order (sum = row length L).
        device: Where the mask lives (the row's device).
        block_size: Tile edge in tokens.

    Returns:
        A ``torch.nn.attention.flex_attention.BlockMask`` of shape (1, 1, L, L).

    Raises:
        ValueError: No samples or a non-positive length.
    """
    from torch.nn.attention.flex_attention import BlockMask

    if not lengths or min(lengths) <= 0:
        raise ValueError(f"sample lengths must be positive, got {list(lengths)}")
    total = int(sum(lengths))
    first, last = _block_bounds(lengths, total, block_size)
    n = first.numel()
    q_idx = torch.arange(n)[:, None]
    kv_idx = torch.arange(n)[None, :]
    below = kv_idx <= q_idx
    # (n, n): some token pair of tile (q, kv) is in one sample and causal.
    touches = below & (first[None, :] <= last[:, None]) & (last[None, :] >= first[:, None])
    single = first == last
    full = (kv_idx < q_idx) & single[:, None] & single[None, :] & (first[:, None] == first[None, :])
    if total % block_size:
        # The last tile row and column hold padding: let mask_mod see them.
        full[:, -1] = False
        full[-1, :] = False
    partial = touches & ~full

    def pack(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        counts = blocks.sum(-1).to(torch.int32)
        # Chosen tiles first, in ascending order (a stable sort of "not chosen").
        order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[None, None].to(device), order[None, None].to(device)

    doc = torch.repeat_interleave(
        torch.arange(len(lengths), dtype=torch.int32), torch.tensor(list(lengths))
    )
    pad = n * block_size - total
    doc = torch.cat([doc, torch.full((pad,), -1, dtype=torch.int32)]).to(device)

    def same_sample_causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return (doc[q] == doc[kv]) & (q >= kv)

    kv_num, kv_indices = pack(partial)
    full_num, full_indices = pack(full)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_indices,
        full_num,
        full_indices,
        BLOCK_SIZE=block_size,
        mask_mod=same_sample_causal,
        seq_lengths=(total, total),
    )


def sample_lengths(text_positions: torch.Tensor) -> list[int]:
    """Sample lengths of a packed row from its text positions (row 0 restarts at 0 per sample).

    Args:
        text_positions: ``(L,)`` or ``(1, L)`` position row 0.
    """
    row = text_positions.reshape(-1)
    starts = torch.nonzero(row == 0).flatten().tolist()
    if not starts or starts[0] != 0:
        raise ValueError("a packed row must start with text position 0")
    bounds = [*starts, row.numel()]
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]


# --------------------------------------------------------------------------------------------
# The attention function registered with transformers

_COMPILED: dict[str, Any] = {}


def _flex_kernel(device_type: str) -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    if device_type != "cuda":
        return flex_attention  # eager reference path: CPU tests at small shapes
    if "cuda" not in _COMPILED:
        # Compiled once per process; pack lengths vary, so dynamo marks L dynamic after the
        # first recompilation instead of compiling per length.
        _COMPILED["cuda"] = torch.compile(flex_attention)
    return _COMPILED["cuda"]


def flex_packed_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Transformers attention function: flex with a ``BlockMask``, SDPA for anything else.

    Packed training rows arrive with the ``BlockMask`` of ``packed_block_mask`` as their
    attention mask (a 4-D mask passes through transformers' mask creation unchanged).
    Generation and unpacked calls carry a dense mask or none, and go to SDPA.
    """
    from torch.nn.attention.flex_attention import BlockMask
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not isinstance(attention_mask, BlockMask):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if dropout:
        raise ValueError("the flex backend does not support attention dropout")
    kernel = _flex_kernel(query.device.type)
    out = kernel(query, key, value, block_mask=attention_mask, scale=scaling, enable_gqa=True)
    # (B, H, L, D) -> (B, L, H, D), what the attention modules reshape from.
    return out.transpose(1, 2).contiguous(), None


def register_flex() -> None:
    """Register ``FLEX_IMPLEMENTATION`` with transformers (idempotent).

    The mask function is SDPA's: unpacked calls (generation) get a normal padding/causal mask;
    packed rows bypass it with their own ``BlockMask``.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(FLEX_IMPLEMENTATION, flex_packed_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(FLEX_IMPLEMENTATION, sdpa_mask)


def packed_attention_inputs(model: Any, position_ids: torch.Tensor) -> dict[str, Any]:
    """Extra forward kwargs that make a packed row use its backend's packed path.

    Args:
        model: The Qwen3-VL model (or a peft wrapper) that runs the row.
        position_ids: ``(4, 1, L)`` position ids of the row.

    Returns:
        ``{"attention_mask": BlockMask}`` under ``flex``; ``{}`` otherwise (FA2 and SDPA find
        the boundaries from position row 0 themselves).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if attention_backend_of(base) != "flex":
        return {}
    lengths = sample_lengths(position_ids[0])
    return {"attention_mask": packed_block_mask(lengths, device=position_ids.device)}
