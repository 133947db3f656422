r"""Everything Qwen3-VL specific: processor, chat template, sample encoding, MRoPE, freezing.

No other module branches on the model family. Training and serving both encode a conversation
with ``encode_sample``, so the prompt tokens and pixels are byte-identical in both::

    processor = build_processor(ckpt, min_pixels=65_536, max_pixels=1_048_576)
    sample = encode_sample(processor, messages, target)   # training: labels + 4-row positions
    prompt = encode_sample(processor, messages)           # serving: ends at the generation prompt

Images in ``messages`` must already be canonical frames (``hivig.vision.canonical_frame`` or
``materialise``); the processor is called with ``do_resize=False`` and checks the grid.

Targets are stored in one format whatever the think policy (``THINK_POLICIES``): the text of
``hivig.contracts.render_*_target``, ``<think>\n…\n</think>\n<criticism>…``. Under
``prefill_think`` the template's generation prompt already holds ``<think>\n``, and
``encode_sample`` removes it from the target so the tag is never doubled.

Version shims (transformers 4.57 vs 5.x) live here only:

- the pixel budget is written to ``size`` and, where the class still reads them, to the
  ``min_pixels``/``max_pixels`` attributes, because ``max_pixels=`` given to ``from_pretrained``
  is ignored (https://github.com/huggingface/transformers/issues/41955) and 4.57's slow image
  processor resets ``size``; the budget is then asserted with a probe image;
- ``use_cache`` is set on ``text_config``, which the 5.x text model reads (its top-level config
  has no such field);
- ``mm_token_type_ids`` (5.x only) is computed from the token ids rather than read from the
  processor output;
- MRoPE positions come from our own rule, not from the version-specific ``get_rope_index``.

The parts live in private modules (``_processor``, ``_labels``, ``_freezing``) and are
re-exported here; import them from this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import (
    AutoConfig,
    PreTrainedModel,
    ProcessorMixin,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeForConditionalGeneration,
)

from hivig.logging import get_logger
from hivig.messages import ChatMessage, ImagePart, TextPart
from hivig.models._attention import (
    ATTENTION_BACKENDS,
    FLEX_BLOCK_SIZE,
    AttentionBackendError,
    attention_backend_of,
    flash_attn_available,
    packed_attention_inputs,
    packed_block_mask,
    resolve_attention,
    sample_lengths,
    set_attention,
    transformers_implementation,
)
from hivig.models._errors import EncodeError
from hivig.models._freezing import (
    MODULE_GROUPS,
    apply_freezing,
    checkpointed_layers,
    enable_activation_checkpointing,
    module_groups,
    parameter_groups,
)
from hivig.models._labels import (
    IGNORE_INDEX,
    mrope_position_ids,
    shifted_labels,
    supervised_span,
)
from hivig.models._processor import (
    CHAT_TEMPLATE_VERSION,
    THINK_POLICIES,
    assemble_processor,
    build_processor,
    check_pixel_budget,
    load_chat_template,
    pixel_budget,
    set_pixel_budget,
    think_policy_of,
)

__all__ = [
    "ATTENTION_BACKENDS",
    "CHAT_TEMPLATE_VERSION",
    "FLEX_BLOCK_SIZE",
    "AttentionBackendError",
    "ModelPathError",
    "attention_backend_of",
    "checkpointed_layers",
    "flash_attn_available",
    "packed_attention_inputs",
    "packed_block_mask",
    "resolve_attention",
    "resolve_model_path",
    "sample_lengths",
    "set_attention",
    "transformers_implementation",
    "IGNORE_INDEX",
    "MODULE_GROUPS",
    "THINK_POLICIES",
    "EncodeError",
    "EncodedSample",
    "TokenIds",
    "apply_freezing",
    "assemble_processor",
    "build_processor",
    "check_pixel_budget",
    "enable_activation_checkpointing",
    "encode_sample",
    "generation_prefill",
    "generation_prompt_ids",
    "load_chat_template",
    "load_model",
    "module_groups",
    "mrope_position_ids",
    "parameter_groups",
    "pixel_budget",
    "render_prompt",
    "set_pixel_budget",
    "set_use_cache",
    "shifted_labels",
    "supervised_span",
    "think_policy_of",
    "token_ids",
]

logger = get_logger(__name__)

_ROLES = ("system", "user", "assistant")

_MODEL_CLASSES: dict[str, type[PreTrainedModel]] = {
    "qwen3_vl": Qwen3VLForConditionalGeneration,
    "qwen3_vl_moe": Qwen3VLMoeForConditionalGeneration,
}


# --------------------------------------------------------------------------------------------
# Model loading


class ModelPathError(ValueError):
    """``model.path`` names neither a local checkpoint nor a reachable Hugging Face model."""


def _looks_like_repo_id(path: str) -> bool:
    parts = path.split("/")
    return len(parts) == 2 and all(parts) and not path.startswith((".", "~"))


def resolve_model_path(path: str | Path, *, revision: str | None = None) -> Path:
    """A local checkpoint directory for a directory or a Hugging Face model id.

    A hub id (``Qwen/Qwen3-VL-8B-Thinking``) is looked up in the local Hugging Face cache first
    (``HF_HOME``/``HF_HUB_CACHE``) and downloaded only when it is missing there and the hub is
    reachable (``HF_HUB_OFFLINE`` unset).

    Args:
        path: Directory holding ``config.json``, or ``org/name``.
        revision: Hub branch, tag or commit (``None`` = the default branch).

    Returns:
        The checkpoint directory.

    Raises:
        ModelPathError: Neither a checkpoint directory nor a model the cache or hub holds.
    """
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelPathError(f"`model.path`: {local} has no config.json (not a checkpoint)")
        return local
    text = str(path)
    if not _looks_like_repo_id(text):
        raise ModelPathError(
            f"`model.path`: {text} is neither a directory nor a Hugging Face id (org/name)"
        )
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(text, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    try:
        return Path(snapshot_download(text, revision=revision))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError) as e:
        raise ModelPathError(
            f"`model.path`: {text} is not in the local Hugging Face cache and could not be "
            f"downloaded ({type(e).__name__}); download it first (huggingface-cli download "
            f"{text}) or pass a local directory"
        ) from e


def load_model(
    path: str | Path,
    *,
    dtype: torch.dtype,
    attn_implementation: str,
    use_cache: bool = False,
) -> PreTrainedModel:
    """Load a Qwen3-VL checkpoint, choosing the class from ``config.model_type``.

    Args:
        path: Checkpoint directory (``resolve_model_path`` turns a hub id into one).
        dtype: Parameter dtype, e.g. ``torch.bfloat16``.
        attn_implementation: A resolved backend (``resolve_attention``): ``"flash_attention_2"``,
            ``"flex"`` (text tower on the packed flex path, vision tower on SDPA), ``"sdpa"``
            or ``"eager"``.
        use_cache: KV cache in forward; ``False`` for training (a cache object disables packed
            sequence detection), ``True`` for generation.

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
    model = cls.from_pretrained(
        str(path), dtype=dtype, attn_implementation=transformers_implementation(attn_implementation)
    )
    set_use_cache(model, use_cache)
    return model


def set_use_cache(model: PreTrainedModel, use_cache: bool) -> None:
    """Switch the KV cache of a Qwen3-VL model's forward on or off (in place).

    The text model takes its ``use_cache`` default from ``config.text_config`` (5.x's top-level
    config has no such field, so setting ``model.config.use_cache`` alone changes nothing there);
    the top-level field is set too where a version still has one.

    Args:
        model: A Qwen3-VL model (or anything whose config has a ``text_config``).
        use_cache: ``False`` for training, ``True`` for generation.
    """
    model.config.text_config.use_cache = use_cache
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = use_cache


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


def _generation_prompt_text(processor: ProcessorMixin) -> str:
    # The template's suffix for add_generation_prompt=True, measured on a one-turn conversation.
    probe = [{"role": "user", "content": [{"type": "text", "text": "x"}]}]
    without = processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
    with_prompt = processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    if not with_prompt.startswith(without):
        raise ValueError("the chat template changes earlier turns when adding a generation prompt")
    return with_prompt[len(without) :]


def generation_prompt_ids(processor: ProcessorMixin) -> list[int]:
    r"""Token ids of the template's generation prompt (``<|im_start|>assistant\n`` [+ think])."""
    text = _generation_prompt_text(processor)
    return processor.tokenizer.encode(text, add_special_tokens=False)


def generation_prefill(processor: ProcessorMixin) -> str:
    r"""Text the template's generation prompt adds after ``<|im_start|>assistant\n``.

    ``""`` under the ``default`` think policy, ``"<think>\n"`` under ``prefill_think``. A
    stored target starts with this text; ``encode_sample`` supervises only what follows it.

    Raises:
        ValueError: The generation prompt does not open an assistant turn.
    """
    text = _generation_prompt_text(processor)
    header = "<|im_start|>assistant\n"
    if not text.startswith(header):
        raise ValueError(f"the generation prompt {text!r} does not start with {header!r}")
    return text[len(header) :]


def _strip_prefill(target: str, prefill: str) -> str:
    # The stored target holds the whole answer; the prompt already ends with the prefill, so
    # appending the target verbatim would write it twice ("<think>\n<think>\n...").
    if not target.startswith(prefill):
        raise EncodeError(
            "prefill_mismatch",
            f"the chat template pre-fills {prefill!r} but the target starts with "
            f"{target[: len(prefill) + 10]!r}; store targets as hivig.contracts renders them",
        )
    return target[len(prefill) :]


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


def _append_target(
    processor: ProcessorMixin, ids: TokenIds, prompt_ids: torch.Tensor, target: str
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(input_ids, labels, num_supervised)`` of the prompt followed by the answer."""
    _check_text(target, _forbidden_strings(processor), "target")
    body = _strip_prefill(target, generation_prefill(processor))
    answer = processor.tokenizer.encode(
        body + "<|im_end|>\n", add_special_tokens=False, return_tensors="pt"
    )[0].long()
    input_ids = torch.cat([prompt_ids, answer])
    prefill_ids = generation_prompt_ids(processor)[len(ids.assistant_header) :]
    start, stop = supervised_span(
        input_ids.tolist(),
        header_ids=ids.assistant_header,
        end_id=ids.im_end,
        prefill_ids=prefill_ids,
    )
    if start != len(prompt_ids):
        raise EncodeError("label_boundary", f"answer starts at {start}, not {len(prompt_ids)}")
    return input_ids, shifted_labels(input_ids, start, stop), stop - start


def encode_sample(
    processor: ProcessorMixin,
    messages: Sequence[ChatMessage],
    target: str | None = None,
) -> EncodedSample:
    r"""Encode a conversation for training (with ``target``) or serving (without).

    The prompt is rendered with the generation prompt and processed with the images
    (``do_resize=False``, no truncation). The target, less the part the generation prompt
    already holds (``generation_prefill``: ``<think>\n`` under ``prefill_think``), plus
    ``<|im_end|>\n`` is tokenized on its own and appended. The serving encoding is therefore a
    byte-identical prefix of the training encoding, up to the first generated token.

    Args:
        processor: A Qwen3-VL processor from ``build_processor``.
        messages: System/user turns whose image parts hold canonical PIL frames.
        target: The stored assistant answer as ``hivig.contracts.render_*_target`` produce it
            (``<think>\n…\n</think>\n<criticism>…``, the same under both think policies),
            without ``<|im_end|>``; ``None`` for serving.

    Returns:
        The encoded sample.

    Raises:
        EncodeError: Bad messages, non-canonical or unmaterialised images, special-token strings
            in text, a target that lacks the template's prefill (``prefill_mismatch``), or a
            token/grid mismatch.
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
        input_ids, labels, num_supervised = _append_target(processor, ids, prompt_ids, target)

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
