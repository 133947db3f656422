"""Everything Qwen3-VL specific: processor, chat template, sample encoding, MRoPE, freezing.

No other module branches on the model family. Training and serving both encode a conversation
with ``encode_sample``, so the prompt tokens and pixels are byte-identical in both::

    processor = build_processor(ckpt, min_pixels=65_536, max_pixels=1_048_576)
    sample = encode_sample(processor, messages, target)   # training: labels + 4-row positions
    prompt = encode_sample(processor, messages)           # serving: ends at the generation prompt

Images in ``messages`` must already be canonical frames (``hivig.vision.canonical_frame`` or
``materialise``); the processor is called with ``do_resize=False`` and checks the grid.

Version shims (transformers 4.57 vs 5.x, ``qwen3vl_training.md`` §2.3) live here only:

- the pixel budget is written to ``size`` and, where the class still reads them, to the
  ``min_pixels``/``max_pixels`` attributes, because ``max_pixels=`` given to ``from_pretrained``
  is ignored (https://github.com/huggingface/transformers/issues/41955) and 4.57's slow image
  processor resets ``size`` (§6.6); the budget is then asserted with a probe image;
- ``mm_token_type_ids`` (5.x only) is computed from the token ids rather than read from the
  processor output;
- MRoPE positions come from our own rule (§9), not from the version-specific ``get_rope_index``.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import nn
from transformers import (
    AutoConfig,
    AutoProcessor,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProcessorMixin,
    Qwen2VLImageProcessor,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

from hivig.logging import get_logger
from hivig.media import ChatMessage, ImagePart, TextPart
from hivig.vision import smart_resize

logger = get_logger(__name__)

IGNORE_INDEX = -100
"""Label value that the cross-entropy ignores."""

CHAT_TEMPLATE_VERSION = 1
"""Current version of the chat-template files in ``hivig/prompts``."""

THINK_POLICIES = ("default", "prefill_think")
r"""Think-tag policies (``qwen3vl_training.md`` §5.3).

``default``: the prompt ends at ``<|im_start|>assistant\n`` and the target starts with
``<think>\n…\n</think>\n\n<criticism>…`` (the public HiViG release's convention, so its
checkpoint is servable). ``prefill_think``: the prompt ends at
``<|im_start|>assistant\n<think>\n`` and the target starts with the reasoning itself.
"""

MODULE_GROUPS = ("vit", "merger", "deepstack", "llm", "lm_head")
"""Parameter groups for freezing and optimizer settings (``qwen3vl_training.md`` §11)."""

# Qwen3-VL geometry: one LLM token covers a 2x2 block of 16-px ViT patches (32x32 px).
_PATCH_SIZE = 16
_MERGE_SIZE = 2
_TEMPORAL_PATCH_SIZE = 2
# Qwen3-VL normalises pixels to [-1, 1] (preprocessor config: mean = std = 0.5).
_IMAGE_MEAN_STD = (0.5, 0.5, 0.5)
_ROLES = ("system", "user", "assistant")
# A 16:9 screen used to check that the processor resizes with our budget.
_PROBE_HW = (1080, 1920)

_MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    "qwen3_vl": Qwen3VLForConditionalGeneration,
    "qwen3_vl_moe": Qwen3VLMoeForConditionalGeneration,
}


class EncodeError(ValueError):
    """A conversation cannot be encoded for the model.

    Attributes:
        reason: Short stable code: ``bad_message``, ``not_materialised``, ``not_canonical``,
            ``special_token_in_text``, ``image_token_mismatch``, ``no_assistant_turn``,
            ``unterminated_answer``, ``label_boundary``.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


# --------------------------------------------------------------------------------------------
# Chat template


def _template_file(think_policy: str, version: int) -> str:
    if think_policy not in THINK_POLICIES:
        raise ValueError(f"think_policy must be one of {THINK_POLICIES}, got {think_policy!r}")
    stem = "chat_template" if think_policy == "default" else f"chat_template_{think_policy}"
    return f"{stem}_v{version}.jinja"


@lru_cache(maxsize=16)
def load_chat_template(think_policy: str = "default", version: int = CHAT_TEMPLATE_VERSION) -> str:
    """Read one of our Jinja chat templates from ``hivig/prompts``.

    Args:
        think_policy: ``"default"`` or ``"prefill_think"`` (see ``THINK_POLICIES``).
        version: Template version; released versions are never edited.

    Returns:
        The template text, as saved into checkpoints and given to vLLM's ``--chat-template``.

    Raises:
        ValueError: Unknown policy.
        FileNotFoundError: No template file for that version.
    """
    path = importlib.resources.files("hivig") / "prompts" / _template_file(think_policy, version)
    return path.read_text(encoding="utf-8")


def think_policy_of(processor: ProcessorMixin) -> str | None:
    """Which of our templates the processor carries: a ``THINK_POLICIES`` entry or ``None``."""
    template = getattr(processor, "chat_template", None)
    for policy in THINK_POLICIES:
        if template == load_chat_template(policy):
            return policy
    return None


# --------------------------------------------------------------------------------------------
# Processor construction and the pixel budget


def assemble_processor(
    tokenizer: PreTrainedTokenizerBase,
    *,
    min_pixels: int,
    max_pixels: int,
    chat_template: str | None = None,
) -> Qwen3VLProcessor:
    """Build a Qwen3-VL processor around a tokenizer, with an explicit pixel budget.

    Used for offline processors (tests, CPU demos); checkpoints go through ``build_processor``.

    Args:
        tokenizer: A Qwen2 tokenizer carrying the Qwen special tokens.
        min_pixels: Lower bound on an image's area, in pixels (not edge length).
        max_pixels: Upper bound on an image's area, in pixels (not edge length).
        chat_template: Template text; ``None`` uses our default-policy template.

    Returns:
        A processor whose budget has been checked with a probe image.
    """
    image_processor = Qwen2VLImageProcessor(
        patch_size=_PATCH_SIZE,
        merge_size=_MERGE_SIZE,
        temporal_patch_size=_TEMPORAL_PATCH_SIZE,
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels},
        image_mean=list(_IMAGE_MEAN_STD),
        image_std=list(_IMAGE_MEAN_STD),
    )
    # Qwen3VLProcessor requires (and type-checks) a video processor even for images only.
    video_processor = Qwen3VLVideoProcessor(
        patch_size=_PATCH_SIZE, merge_size=_MERGE_SIZE, temporal_patch_size=_TEMPORAL_PATCH_SIZE
    )
    processor = Qwen3VLProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=chat_template or load_chat_template(),
    )
    check_pixel_budget(processor, min_pixels=min_pixels, max_pixels=max_pixels)
    return processor


def build_processor(
    path_or_none: str | Path | None,
    *,
    min_pixels: int,
    max_pixels: int,
    chat_template: str | None = None,
) -> Qwen3VLProcessor:
    """Load (or assemble offline) a Qwen3-VL processor with a budget that cannot silently change.

    The budget is written to ``size`` (and to ``min_pixels``/``max_pixels`` where the class still
    reads them), then checked with a probe image, so neither an ignored ``from_pretrained``
    argument nor a fallback image-processor class can change the visual-token count.

    Args:
        path_or_none: Checkpoint directory (or hub id); ``None`` assembles the offline tiny
            processor of ``hivig.testing`` (tests and CPU demos).
        min_pixels: Lower bound on an image's area, in pixels.
        max_pixels: Upper bound on an image's area, in pixels (1,048,576 ≈ 1,024 tokens).
        chat_template: Template text to install. ``None`` keeps the checkpoint's template when it
            is one of ours and otherwise installs our default-policy template.

    Returns:
        The processor.

    Raises:
        ValueError: Not a Qwen3-VL processor, a bad budget, or the budget did not take.
    """
    if path_or_none is None:
        from hivig.testing import tiny_tokenizer

        return assemble_processor(
            tiny_tokenizer(),
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            chat_template=chat_template,
        )
    processor = AutoProcessor.from_pretrained(str(path_or_none))
    if not hasattr(processor, "image_processor") or not hasattr(processor, "tokenizer"):
        raise ValueError(f"{path_or_none} does not hold a vision-language processor")
    set_pixel_budget(processor, min_pixels=min_pixels, max_pixels=max_pixels)
    if chat_template is not None:
        processor.chat_template = chat_template
    elif think_policy_of(processor) is None:
        if getattr(processor, "chat_template", None):
            logger.warning("replacing the chat template of %s with hivig's default", path_or_none)
        processor.chat_template = load_chat_template()
    check_pixel_budget(processor, min_pixels=min_pixels, max_pixels=max_pixels)
    return processor


def set_pixel_budget(processor: ProcessorMixin, *, min_pixels: int, max_pixels: int) -> None:
    """Write the image budget everywhere a Qwen-VL image processor may read it.

    Args:
        processor: A Qwen-VL processor (modified in place).
        min_pixels: Lower bound on an image's area, in pixels.
        max_pixels: Upper bound on an image's area, in pixels.

    Raises:
        ValueError: Non-positive bounds or ``min_pixels > max_pixels``.
    """
    if min_pixels <= 0 or max_pixels <= 0 or min_pixels > max_pixels:
        raise ValueError(f"need 0 < min_pixels <= max_pixels, got {min_pixels}, {max_pixels}")
    ip = processor.image_processor
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    # Keep the container type (5.x uses SizeDict, 4.57 a plain dict).
    ip.size = type(ip.size)(**size) if not isinstance(ip.size, dict) else size
    # 4.57 image processors read these attributes instead of ``size`` (qwen3vl_training.md
    # §6.6); 5.x classes have no such attributes and warn when given them, so set only if present.
    for name, value in (("min_pixels", min_pixels), ("max_pixels", max_pixels)):
        if hasattr(ip, name):
            setattr(ip, name, value)


def pixel_budget(processor: ProcessorMixin) -> tuple[int, int]:
    """The processor's ``(min_pixels, max_pixels)`` as stored in ``size``."""
    size = processor.image_processor.size
    return int(size["shortest_edge"]), int(size["longest_edge"])


def check_pixel_budget(processor: ProcessorMixin, *, min_pixels: int, max_pixels: int) -> None:
    """Assert the processor resizes exactly as ``hivig.vision.smart_resize`` with this budget.

    Args:
        processor: A Qwen-VL processor.
        min_pixels: Expected lower bound, in pixels.
        max_pixels: Expected upper bound, in pixels.

    Raises:
        ValueError: Wrong patch geometry (for example a Qwen2.5-VL processor) or a budget that
            differs from the one asked for.
    """
    ip = processor.image_processor
    geometry = (ip.patch_size, ip.merge_size, ip.temporal_patch_size)
    if geometry != (_PATCH_SIZE, _MERGE_SIZE, _TEMPORAL_PATCH_SIZE):
        raise ValueError(f"not Qwen3-VL patch geometry (patch, merge, temporal): {geometry}")
    if pixel_budget(processor) != (min_pixels, max_pixels):
        raise ValueError(f"pixel budget {pixel_budget(processor)} != {(min_pixels, max_pixels)}")
    h, w = smart_resize(*_PROBE_HW, _PATCH_SIZE * _MERGE_SIZE, min_pixels, max_pixels)
    expected = (h // _PATCH_SIZE) * (w // _PATCH_SIZE)
    got = ip.get_number_of_image_patches(*_PROBE_HW, {})
    if got != expected:
        raise ValueError(
            f"the processor gives {got} patches for a {_PROBE_HW[1]}x{_PROBE_HW[0]} probe, "
            f"expected {expected} for the budget [{min_pixels}, {max_pixels}]"
        )


# --------------------------------------------------------------------------------------------
# Model loading


def load_model(
    path: str | Path,
    *,
    dtype: torch.dtype,
    attn_implementation: str,
    use_cache: bool = False,
) -> PreTrainedModel:
    """Load a Qwen3-VL checkpoint, choosing the class from ``config.model_type``.

    Args:
        path: Checkpoint directory (or hub id).
        dtype: Parameter dtype, e.g. ``torch.bfloat16``.
        attn_implementation: ``"flash_attention_2"``, ``"sdpa"`` or ``"eager"``.
        use_cache: KV cache in forward; ``False`` for training (a cache object disables packed
            sequence detection, ``qwen3vl_training.md`` §8.2), ``True`` for generation.

    Returns:
        The model.

    Raises:
        ValueError: The checkpoint is not a Qwen3-VL model.
    """
    config = AutoConfig.from_pretrained(str(path))
    cls = _MODEL_CLASSES.get(config.model_type)
    if cls is None:
        raise ValueError(
            f"unsupported model_type {config.model_type!r} in {path}; expected one of "
            f"{sorted(_MODEL_CLASSES)}"
        )
    model = cls.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation)
    # The text model reads use_cache from text_config; 5.x's top-level config has no such field.
    model.config.text_config.use_cache = use_cache
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = use_cache
    return model


# --------------------------------------------------------------------------------------------
# Token ids and prompt rendering


@dataclass(frozen=True)
class TokenIds:
    r"""Special-token ids read from the tokenizer (never hard-coded).

    Attributes:
        im_start: ``<|im_start|>``.
        im_end: ``<|im_end|>`` (EOS and stop token; supervised).
        image: ``<|image_pad|>``.
        video: ``<|video_pad|>``.
        vision_start: ``<|vision_start|>``.
        vision_end: ``<|vision_end|>``.
        assistant_header: Token sequence of ``<|im_start|>assistant\n``.
    """

    im_start: int
    im_end: int
    image: int
    video: int
    vision_start: int
    vision_end: int
    assistant_header: tuple[int, ...]


def token_ids(processor: ProcessorMixin) -> TokenIds:
    """Read the special-token ids of a Qwen-VL processor from its tokenizer.

    Raises:
        ValueError: A special token is missing from the vocabulary.
    """
    tok = processor.tokenizer
    names = {
        "im_start": "<|im_start|>",
        "im_end": "<|im_end|>",
        "image": processor.image_token,
        "video": processor.video_token,
        "vision_start": processor.vision_start_token,
        "vision_end": processor.vision_end_token,
    }
    ids = {key: tok.convert_tokens_to_ids(tokstr) for key, tokstr in names.items()}
    missing = [names[k] for k, v in ids.items() if v is None or v == tok.unk_token_id]
    if missing:
        raise ValueError(f"tokenizer lacks special tokens {missing}")
    header = tuple(tok.encode("<|im_start|>assistant\n", add_special_tokens=False))
    return TokenIds(assistant_header=header, **ids)


def _forbidden_strings(processor: ProcessorMixin) -> set[str]:
    # Control and placeholder tokens written as text would be parsed as the real tokens: a fake
    # turn boundary, or an image placeholder without pixels ("Image features and image tokens do
    # not match"). Think tags are ordinary added tokens and stay allowed.
    specials = set(processor.tokenizer.all_special_tokens)
    specials |= {
        processor.image_token,
        processor.video_token,
        processor.vision_start_token,
        processor.vision_end_token,
        "<|im_start|>",
        "<|im_end|>",
    }
    return {s for s in specials if s}


def _check_text(text: str, forbidden: set[str], where: str) -> None:
    found = sorted(s for s in forbidden if s in text)
    if found:
        raise EncodeError("special_token_in_text", f"{where} contains {found}")


def _to_conversation(messages: Sequence[ChatMessage], forbidden: set[str]) -> list[dict[str, Any]]:
    conversation = []
    for k, message in enumerate(messages):
        if not isinstance(message, ChatMessage) or message.role not in _ROLES:
            raise EncodeError("bad_message", f"message {k} is not a system/user/assistant turn")
        content: list[dict[str, Any]] = []
        for part in message.content:
            if isinstance(part, TextPart):
                _check_text(part.text, forbidden, f"message {k}")
                content.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart):
                # The template only needs the slot; pixels travel separately.
                content.append({"type": "image"})
            else:
                raise EncodeError("bad_message", f"message {k} has an unknown part {part!r}")
        conversation.append({"role": message.role, "content": content})
    return conversation


def render_prompt(
    processor: ProcessorMixin,
    messages: Sequence[ChatMessage],
    *,
    add_generation_prompt: bool = True,
) -> str:
    """Render messages through the processor's chat template (one image slot per image part).

    Args:
        processor: A processor carrying one of our chat templates.
        messages: System/user (and earlier assistant) turns; image payloads are not read.
        add_generation_prompt: End with the generation prompt of the template's think policy.

    Returns:
        The prompt text, with ``<|vision_start|><|image_pad|><|vision_end|>`` per image.

    Raises:
        EncodeError: A malformed message or a special-token string inside text.
        ValueError: The processor has no chat template.
    """
    if not getattr(processor, "chat_template", None):
        raise ValueError("the processor has no chat template")
    conversation = _to_conversation(messages, _forbidden_strings(processor))
    return processor.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def generation_prompt_ids(processor: ProcessorMixin) -> list[int]:
    r"""Token ids of the template's generation prompt (``<|im_start|>assistant\n`` [+ think])."""
    # The template's suffix for add_generation_prompt=True, measured on a one-turn conversation.
    probe = [{"role": "user", "content": [{"type": "text", "text": "x"}]}]
    without = processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
    with_prompt = processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    if not with_prompt.startswith(without):
        raise ValueError("the chat template changes earlier turns when adding a generation prompt")
    return processor.tokenizer.encode(with_prompt[len(without) :], add_special_tokens=False)


# --------------------------------------------------------------------------------------------
# Labels and positions


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
    """MRoPE (t, h, w) positions of one sample (``qwen3vl_training.md`` §9).

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


# --------------------------------------------------------------------------------------------
# Sample encoding


@dataclass
class EncodedSample:
    """One conversation as the model sees it; serving samples have no labels.

    Attributes:
        input_ids: ``(L,)`` token ids, image placeholders expanded.
        labels: ``(L,)`` pre-shifted labels (``IGNORE_INDEX`` except the answer and
            ``<|im_end|>``), or ``None`` for a serving prompt.
        position_ids: ``(4, L)``: row 0 = 0..L-1 (text positions), rows 1–3 = MRoPE t/h/w.
        mm_token_type_ids: ``(L,)`` 0 for text, 1 for image tokens (what 5.x ``generate`` needs).
        pixel_values: ``(P, 1536)`` float32 patches, or ``None`` without images.
        image_grid_thw: ``(N, 3)`` patch grids, or ``None`` without images.
        prompt_length: Tokens up to and including the generation prompt.
        num_supervised: Labels that are not ``IGNORE_INDEX``.
        num_image_tokens: ``<|image_pad|>`` tokens (Σ grid.prod() / 4).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor | None
    position_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    pixel_values: torch.Tensor | None
    image_grid_thw: torch.Tensor | None
    prompt_length: int
    num_supervised: int
    num_image_tokens: int

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments for one unpacked forward (batch of one, 4-row position ids)."""
        inputs: dict[str, Any] = {
            "input_ids": self.input_ids[None],
            "position_ids": self.position_ids[:, None],
            "mm_token_type_ids": self.mm_token_type_ids[None],
        }
        if self.pixel_values is not None:
            inputs["pixel_values"] = self.pixel_values
            inputs["image_grid_thw"] = self.image_grid_thw
        return inputs


def _images_of(messages: Sequence[ChatMessage]) -> list[Image.Image]:
    images = []
    for message in messages:
        for part in message.content:
            if isinstance(part, ImagePart):
                if not isinstance(part.image, Image.Image):
                    raise EncodeError(
                        "not_materialised",
                        f"image parts must be PIL frames, got {type(part.image).__name__}; "
                        "call hivig.vision.materialise first",
                    )
                images.append(part.image)
    return images


def _check_canonical(images: Sequence[Image.Image], processor: ProcessorMixin) -> None:
    # With do_resize=False the processor patchifies as given: a frame that is not a multiple of
    # 32 px fails inside a reshape, and one outside the budget silently changes the token count.
    min_px, max_px = pixel_budget(processor)
    factor = processor.image_processor.patch_size * processor.image_processor.merge_size
    for k, image in enumerate(images):
        w, h = image.size
        if w % factor or h % factor or not min_px <= w * h <= max_px:
            raise EncodeError(
                "not_canonical",
                f"image {k} is {w}x{h}; canonical frames have sides that are multiples of "
                f"{factor} and an area in [{min_px}, {max_px}] (use hivig.vision.canonical_frame)",
            )


def encode_sample(
    processor: ProcessorMixin,
    messages: Sequence[ChatMessage],
    target: str | None = None,
) -> EncodedSample:
    r"""Encode a conversation for training (with ``target``) or serving (without).

    The prompt is rendered with the generation prompt and processed with the images
    (``do_resize=False``, no truncation); the target plus ``<|im_end|>\n`` is tokenized on its
    own and appended. The serving encoding is therefore a byte-identical prefix of the training
    encoding, up to the first generated token.

    Args:
        processor: A Qwen3-VL processor from ``build_processor``.
        messages: System/user turns whose image parts hold canonical PIL frames.
        target: The assistant answer (``<think>…</think>\n\n<criticism>…`` under the default think
            policy), without ``<|im_end|>``; ``None`` for serving.

    Returns:
        The encoded sample.

    Raises:
        EncodeError: Bad messages, non-canonical or unmaterialised images, special-token strings
            in text, or a token/grid mismatch.
    """
    if messages and messages[-1].role == "assistant":
        # A trailing answer would be rendered as history and followed by a second header.
        raise EncodeError("bad_message", "the last turn is the assistant's; pass it as `target`")
    ids = token_ids(processor)
    images = _images_of(messages)
    _check_canonical(images, processor)
    prompt = render_prompt(processor, messages, add_generation_prompt=True)
    batch = processor(
        text=[prompt],
        images=images or None,
        do_resize=False,
        truncation=False,
        padding=False,
        return_tensors="pt",
    )
    prompt_ids = batch["input_ids"][0].long()
    grid = batch.get("image_grid_thw")
    pixel_values = batch.get("pixel_values")

    labels, num_supervised, input_ids = None, 0, prompt_ids
    if target is not None:
        _check_text(target, _forbidden_strings(processor), "target")
        answer = processor.tokenizer.encode(
            target + "<|im_end|>\n", add_special_tokens=False, return_tensors="pt"
        )[0].long()
        input_ids = torch.cat([prompt_ids, answer])
        prefill = generation_prompt_ids(processor)[len(ids.assistant_header) :]
        start, stop = supervised_span(
            input_ids.tolist(),
            header_ids=ids.assistant_header,
            end_id=ids.im_end,
            prefill_ids=prefill,
        )
        if start != len(prompt_ids):
            raise EncodeError("label_boundary", f"answer starts at {start}, not {len(prompt_ids)}")
        labels = shifted_labels(input_ids, start, stop)
        num_supervised = stop - start

    is_image = input_ids == ids.image
    num_image_tokens = int(is_image.sum())
    merge = processor.image_processor.merge_size
    expected = 0 if grid is None else int(grid.prod(dim=-1).sum()) // merge**2
    if num_image_tokens != expected:
        raise EncodeError(
            "image_token_mismatch", f"{num_image_tokens} image tokens for grids needing {expected}"
        )
    mrope = mrope_position_ids(input_ids, grid, image_token_id=ids.image, spatial_merge_size=merge)
    text_positions = torch.arange(input_ids.shape[0], dtype=torch.long)[None]
    return EncodedSample(
        input_ids=input_ids,
        labels=labels,
        position_ids=torch.cat([text_positions, mrope]),
        mm_token_type_ids=is_image.int(),
        pixel_values=pixel_values,
        image_grid_thw=grid,
        prompt_length=len(prompt_ids),
        num_supervised=num_supervised,
        num_image_tokens=num_image_tokens,
    )


# --------------------------------------------------------------------------------------------
# Freezing and optimizer groups


def _group_modules(model: nn.Module) -> dict[str, list[nn.Module]]:
    core = model.model
    visual = core.visual
    vit = [
        m for name, m in visual.named_children() if name not in ("merger", "deepstack_merger_list")
    ]
    return {
        "vit": vit,
        "merger": [visual.merger],
        "deepstack": [visual.deepstack_merger_list],
        "llm": [core.language_model],
        "lm_head": [model.lm_head],
    }


def module_groups(model: nn.Module) -> dict[str, list[str]]:
    """Parameter names per group of ``MODULE_GROUPS``.

    ``vit`` is the vision tower without its mergers, ``merger`` the main 2x2 merger, ``deepstack``
    the DeepStack projectors, ``llm`` the language model (embeddings, layers, norm) and
    ``lm_head`` the output head. A head tied to the embeddings counts under ``llm`` only.

    Args:
        model: A ``Qwen3VLForConditionalGeneration`` (or MoE variant).

    Returns:
        Group name → parameter names as in ``model.named_parameters()``.

    Raises:
        ValueError: A parameter falls in no group (an unknown module), so nothing goes untracked.
    """
    name_of = {id(p): n for n, p in model.named_parameters()}
    groups: dict[str, list[str]] = {}
    seen: set[str] = set()
    for group, modules in _group_modules(model).items():
        names = [name_of[id(p)] for m in modules for p in m.parameters() if id(p) in name_of]
        names = [n for n in names if n not in seen]
        seen.update(names)
        groups[group] = names
    stray = sorted(set(name_of.values()) - seen)
    if stray:
        raise ValueError(f"parameters outside every group: {stray[:5]}")
    return groups


def apply_freezing(
    model: nn.Module,
    train_vit: bool = False,
    train_merger: bool = True,
    train_deepstack: bool = False,
    train_llm: bool = True,
    train_lm_head: bool | None = None,
) -> dict[str, int]:
    """Set ``requires_grad`` on every parameter by group (``qwen3vl_training.md`` §11).

    Flags go on parameters, not module attributes: setting ``module.requires_grad`` is a silent
    no-op that leaves the weights trainable.

    Args:
        model: A Qwen3-VL model (modified in place).
        train_vit: Train the vision tower (HiViG: frozen).
        train_merger: Train the main merger.
        train_deepstack: Train the DeepStack projectors (frozen by default, a conservative choice).
        train_llm: Train the language model.
        train_lm_head: Train the output head; ``None`` follows ``train_llm``.

    Returns:
        Trainable parameter count per group.
    """
    flags = {
        "vit": train_vit,
        "merger": train_merger,
        "deepstack": train_deepstack,
        "llm": train_llm,
        "lm_head": train_llm if train_lm_head is None else train_lm_head,
    }
    params = dict(model.named_parameters())
    counts = {}
    for group, names in module_groups(model).items():
        for name in names:
            params[name].requires_grad_(flags[group])
        counts[group] = sum(params[n].numel() for n in names) if flags[group] else 0
    logger.info("trainable parameters per group: %s", counts)
    return counts


def _no_decay(name: str, param: nn.Parameter) -> bool:
    # Biases and norm scales are 1-D; decaying them only pulls them towards zero.
    return param.ndim < 2 or name.endswith(".bias")


def parameter_groups(
    model: nn.Module,
    lr_llm: float,
    lr_merger: float,
    lr_vit: float,
    weight_decay: float,
) -> list[dict[str, Any]]:
    """AdamW parameter groups: one per module group and decay setting, trainable params only.

    The LLM and ``lm_head`` use ``lr_llm``; the merger and DeepStack projectors ``lr_merger``; the
    vision tower ``lr_vit``. Biases and norm weights get no weight decay.

    Args:
        model: A Qwen3-VL model after ``apply_freezing``.
        lr_llm: Peak learning rate of the language model and head.
        lr_merger: Peak learning rate of the mergers.
        lr_vit: Peak learning rate of the vision tower.
        weight_decay: Decoupled weight decay of matrices.

    Returns:
        Dicts with ``params``, ``lr``, ``weight_decay`` and a ``name`` for logging.

    Raises:
        ValueError: No parameter is trainable.
    """
    lrs = {"vit": lr_vit, "merger": lr_merger, "deepstack": lr_merger, "llm": lr_llm}
    lrs["lm_head"] = lr_llm
    params = dict(model.named_parameters())
    out = []
    for group, names in module_groups(model).items():
        trainable = [n for n in names if params[n].requires_grad]
        for suffix, wd in (("", weight_decay), ("_no_decay", 0.0)):
            chosen = [params[n] for n in trainable if _no_decay(n, params[n]) == bool(suffix)]
            if chosen:
                out.append(
                    {"name": group + suffix, "params": chosen, "lr": lrs[group], "weight_decay": wd}
                )
    if not out:
        raise ValueError("no trainable parameters; check the freezing flags")
    return out
