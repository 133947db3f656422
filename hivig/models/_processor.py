"""Qwen3-VL processor construction: our chat templates and a pixel budget that cannot drift.

Re-exported by ``hivig.models.qwen_vl``; import it from there.
"""

from __future__ import annotations

import importlib.resources
from functools import lru_cache
from pathlib import Path

from transformers import (
    AutoProcessor,
    PreTrainedTokenizerBase,
    ProcessorMixin,
    Qwen2VLImageProcessor,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

from hivig.logging import get_logger
from hivig.vision import smart_resize

logger = get_logger(__name__)

CHAT_TEMPLATE_VERSION = 1
"""Current version of the chat-template files in ``hivig/prompts``."""

THINK_POLICIES = ("default", "prefill_think")
r"""Think-tag policies.

Stored targets are the same under both: the text ``hivig.contracts.render_history_target`` /
``render_critique_target`` produce, which opens with ``<think>\n`` (the public HiViG release's
format). ``default``: the prompt ends at ``<|im_start|>assistant\n`` and the whole target is
supervised, so the model emits ``<think>`` itself. ``prefill_think``: the prompt ends at
``<|im_start|>assistant\n<think>\n``; ``encode_sample`` strips that opening from the target
(``EncodeError("prefill_mismatch")`` when it is not there), so the model continues inside the
think block.
"""

# Qwen3-VL geometry: one LLM token covers a 2x2 block of 16-px ViT patches (32x32 px).
_PATCH_SIZE = 16
_MERGE_SIZE = 2
_TEMPORAL_PATCH_SIZE = 2
# Qwen3-VL normalises pixels to [-1, 1] (preprocessor config: mean = std = 0.5).
_IMAGE_MEAN_STD = (0.5, 0.5, 0.5)
# A 16:9 screen used to check that the processor resizes with our budget.
_PROBE_HW = (1080, 1920)


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
    """Load a checkpoint's Qwen3-VL processor with a budget that cannot silently change.

    The budget is written to ``size`` (and to ``min_pixels``/``max_pixels`` where the class still
    reads them), then checked with a probe image, so neither an ignored ``from_pretrained``
    argument nor a fallback image-processor class can change the visual-token count.

    Args:
        path_or_none: Checkpoint directory (``resolve_model_path`` turns a hub id into one).
            ``None`` is refused: offline processors come from ``assemble_processor`` (the test
            fixtures in ``hivig.tiny`` build them), never from a library default.
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
        raise ValueError(
            "build_processor needs a checkpoint; offline processors are assembled with "
            "assemble_processor (hivig.tiny.tiny_processor for tests and the demo)"
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
    # 4.57 image processors read these attributes instead of ``size``; 5.x classes have no
    # such attributes and warn when given them, so set only if present.
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
