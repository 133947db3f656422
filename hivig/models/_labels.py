"""Label masks and MRoPE positions of one Qwen3-VL sample (re-exported by ``qwen_vl``).

Both work on token ids only, so they are shared by ``encode_sample`` and by tests that build
id sequences by hand.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hivig.models._errors import EncodeError

IGNORE_INDEX = -100
"""Label value that the cross-entropy ignores."""


def _find_last(seq: Sequence[int], pattern: Sequence[int]) -> int:
    n = len(pattern)
    for i in range(len(seq) - n, -1, -1):
        if seq[i] == pattern[0] and list(seq[i : i + n]) == list(pattern):
            return i
    return -1


def supervised_span(
    input_ids: Sequence[int],
    *,
    header_ids: Sequence[int],
    end_id: int,
    prefill_ids: Sequence[int] = (),
) -> tuple[int, int]:
    r"""Half-open token span ``[start, stop)`` of the last assistant answer.

    The turn is found by matching the whole ``<|im_start|>assistant\n`` token sequence, so the
    word "assistant" in user text cannot fool it. Supervision starts after the header (and after
    ``prefill_ids`` when the prompt pre-fills them) and runs through the next ``<|im_end|>``
    inclusive; the ``\n`` after ``<|im_end|>`` is not supervised.

    Args:
        input_ids: Token ids of one sample.
        header_ids: Token ids of ``<|im_start|>assistant\n``.
        end_id: Id of ``<|im_end|>``.
        prefill_ids: Tokens the generation prompt adds after the header (``<think>\n``).

    Returns:
        ``(start, stop)`` with ``input_ids[stop - 1] == end_id``.

    Raises:
        EncodeError: No assistant header, or the answer has no ``<|im_end|>``.
    """
    ids = [int(t) for t in input_ids]
    head = _find_last(ids, header_ids)
    if head < 0:
        raise EncodeError("no_assistant_turn", "no <|im_start|>assistant header in the sample")
    start = head + len(header_ids)
    if prefill_ids and ids[start : start + len(prefill_ids)] == list(prefill_ids):
        start += len(prefill_ids)
    try:
        stop = ids.index(end_id, start) + 1
    except ValueError:
        raise EncodeError("unterminated_answer", "the assistant answer has no <|im_end|>") from None
    return start, stop


def shifted_labels(input_ids: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Pre-shifted labels: ``labels[i]`` is the target for the logits at position ``i``.

    Args:
        input_ids: ``(L,)`` token ids.
        start: First supervised token (must be at least 1: a sample never starts supervised).
        stop: One past the last supervised token.

    Returns:
        ``(L,)`` labels, ``IGNORE_INDEX`` except ``labels[start-1 : stop-1] = ids[start:stop]``.
    """
    if not 1 <= start <= stop <= input_ids.shape[0]:
        raise ValueError(f"bad span [{start}, {stop}) for {input_ids.shape[0]} tokens")
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[start - 1 : stop - 1] = input_ids[start:stop]
    return labels


def mrope_position_ids(
    input_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None,
    *,
    image_token_id: int,
    spatial_merge_size: int = 2,
) -> torch.Tensor:
    """MRoPE (t, h, w) positions of one sample.

    Text tokens (vision delimiters included) get ``(p, p, p)`` and advance ``p`` by one. An image
    with merged grid ``H x W`` starting at ``s = p`` gets ``(s + t, s + i, s + j)`` for its tokens
    in row-major order, then ``p = s + max(H, W)``.

    Args:
        input_ids: ``(L,)`` token ids of one sample.
        image_grid_thw: ``(N, 3)`` patch grids in image order, or ``None`` without images.
        image_token_id: Id of ``<|image_pad|>``.
        spatial_merge_size: ViT patches merged per side into one LLM token.

    Returns:
        ``(3, L)`` long tensor.

    Raises:
        EncodeError: The image-token runs do not match the grids.
    """
    if input_ids.ndim != 1:
        raise ValueError(f"input_ids must be 1-D, got shape {tuple(input_ids.shape)}")
    grids = [] if image_grid_thw is None else [tuple(int(v) for v in g) for g in image_grid_thw]
    is_image = (input_ids == image_token_id).tolist()
    n = len(is_image)
    out = torch.empty(3, n, dtype=torch.long)
    pos, i, g = 0, 0, 0
    while i < n:
        if not is_image[i]:
            j = i
            while j < n and not is_image[j]:
                j += 1
            out[:, i:j] = torch.arange(pos, pos + j - i)
            pos, i = pos + j - i, j
            continue
        if g == len(grids):
            raise EncodeError("image_token_mismatch", "more image tokens than image grids")
        t, h, w = grids[g]
        rows, cols = h // spatial_merge_size, w // spatial_merge_size
        count = t * rows * cols
        if i + count > n or not all(is_image[i : i + count]):
            raise EncodeError("image_token_mismatch", f"image {g} needs {count} tokens in a row")
        grid = torch.stack(
            torch.meshgrid(torch.arange(t), torch.arange(rows), torch.arange(cols), indexing="ij")
        ).reshape(3, -1)
        out[:, i : i + count] = grid + pos
        pos, i, g = pos + max(rows, cols), i + count, g + 1
    if g != len(grids):
        raise EncodeError("image_token_mismatch", f"{len(grids) - g} image grids without tokens")
    return out
