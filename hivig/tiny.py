"""A tiny random-weight Qwen3-VL, its offline processor and synthetic inputs (demo and tests).

Nothing is downloaded. Two tokenizers:

- ``qwen_tokenizer()`` (the default of ``tiny_processor``): the real Qwen3-VL tokenizer, built
  from the Qwen byte-level BPE ranks that the ``dashscope`` wheel ships
  (``dashscope/resources/qwen.tiktoken``, 151,643 ranks, the same BPE as Qwen2/Qwen3) plus the
  26 added tokens at ids 151643–151668 (``QWEN_ADDED_TOKENS``). Token ids, counts and budgets are
  the production ones (``Hello`` = 9707, `` world`` = 1879, ``<|image_pad|>`` = 151655);
- ``tiny_tokenizer()``: a byte-level BPE (the 256 byte symbols, no merges) with the Qwen control
  tokens, for the few tests that need one token per byte.

The model uses tiny values (3 text layers, hidden 64, vision depth 2); with the real vocabulary its
embedding and head are 151,669 × 64 each (about 19.7M parameters; forward + backward of a
short sample still well under a second on CPU)::

    processor = tiny_processor()                       # real Qwen tokenizer
    model = tiny_model(processor, seed=0)
    ckpt = save_tiny_checkpoint(tmp_path / "tiny")   # loadable with AutoModelForImageTextToText

Code must still read token ids from the tokenizer: the byte-level fixture has other ids.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import random
import shutil
import tempfile
from functools import lru_cache
from multiprocessing.util import Finalize
from pathlib import Path

import torch
from PIL import Image, ImageDraw
from tokenizers import AddedToken
from transformers import (
    PreTrainedTokenizerBase,
    Qwen2TokenizerFast,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode

from hivig.contracts import render_critique_target
from hivig.messages import ChatMessage, ImagePart, TextPart
from hivig.models.qwen_vl import assemble_processor, load_chat_template, set_use_cache, token_ids
from hivig.vision import canonical_frame

TINY_MIN_PIXELS = 1024
"""Default lower image budget of the tiny processor, in pixels (1 visual token)."""

TINY_MAX_PIXELS = 65_536
"""Default upper image budget of the tiny processor, in pixels (64 visual tokens)."""

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""Qwen control tokens of the tiny tokenizer, with ids 256.. in this order."""

THINK_TOKENS = ("<think>", "</think>")
"""Reasoning delimiters: added but not special, as in the real Qwen3 tokenizer (they survive
``skip_special_tokens``)."""

QWEN_ADDED_TOKENS = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
"""The Qwen3-VL added tokens, ``(content, special)``, in id order from ``QWEN_FIRST_ADDED_ID``
(as in the checkpoints' ``tokenizer_config.json``); only the control tokens are special, so tool
and think tags survive ``skip_special_tokens``."""

QWEN_FIRST_ADDED_ID = 151643
"""Id of ``<|endoftext|>``: the BPE ranks occupy 0..151642."""

QWEN_RANKS_RESOURCE = ("dashscope", "resources/qwen.tiktoken")
"""(package, file) holding the Qwen BPE ranks: one ``base64(token) rank`` pair per line."""

# Tiny Qwen3-VL. More LLM layers (3) than DeepStack entries (2),
# or the last projector's output lands after the final layer and gets no gradient; every
# DeepStack index below the vision depth; out_hidden_size == text hidden size;
# num_position_embeddings a perfect square; mrope_section sums to head_dim / 2.
_TEXT_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    # 32: the smallest head size vLLM's CPU attention runs (16 starts, then fails each request).
    "head_dim": 32,
    "max_position_embeddings": 4096,
    # The legacy rope_scaling form works in 4.57 and 5.x (5.x converts it to rope_parameters).
    "rope_scaling": {"rope_type": "default", "mrope_section": [6, 5, 5], "mrope_interleaved": True},
    "rope_theta": 5e6,
    "use_cache": False,
}
_VISION_CONFIG = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "patch_size": 16,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "in_channels": 3,
    "out_hidden_size": 64,
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [0, 1],
}


@lru_cache(maxsize=1)
def _byte_vocab() -> tuple[tuple[str, int], ...]:
    # Byte b has id b; the symbols are the byte-level BPE alphabet (printable stand-ins).
    alphabet = bytes_to_unicode()
    return tuple((alphabet[b], b) for b in range(256))


def _qwen_ranks_text() -> str:
    # Located without importing the package: dashscope's own __init__ pulls in an HTTP stack
    # that the fixture does not need (and a bare GPU image may lack).
    package, name = QWEN_RANKS_RESOURCE
    override = os.environ.get("HIVIG_QWEN_RANKS")
    spec = importlib.util.find_spec(package)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    candidates = [Path(override)] if override else [Path(r) / name for r in roots]
    for path in candidates:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise ModuleNotFoundError(
        f"the real Qwen tokenizer fixture reads {package}/{name}: install the test extra "
        f"(pip install -e '.[test]') or `pip install {package}` (or set HIVIG_QWEN_RANKS)"
    )


@lru_cache(maxsize=1)
def _qwen_vocab_and_merges() -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    """Byte-level BPE vocabulary and merges equivalent to the tiktoken ranks.

    tiktoken merges, at every step, the adjacent pair whose concatenation has the lowest rank.
    A Hugging Face BPE gives the same result when every split ``(a, b)`` of a token ``t`` with
    ``a`` and ``b`` in the vocabulary is a merge ranked by ``rank(t)`` (ties broken by the ranks
    of ``a`` and ``b``): the pair chosen first is then always the one tiktoken chooses.
    """
    alphabet = bytes_to_unicode()
    ranks: dict[bytes, int] = {}
    for line in _qwen_ranks_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)

    def symbols(b: bytes) -> str:
        return "".join(alphabet[x] for x in b)

    vocab = {symbols(b): rank for b, rank in ranks.items()}
    merges: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], symbols(left), symbols(right)))
    merges.sort()
    return vocab, tuple((m[3], m[4]) for m in merges)


@lru_cache(maxsize=1)
def _qwen_tokenizer_json() -> str:
    vocab, merges = _qwen_vocab_and_merges()
    # The wrapper contributes Qwen's pre-tokenizer split, NFC normaliser and byte-level decoder;
    # the added tokens go onto the backend one by one so their ids follow QWEN_ADDED_TOKENS.
    backend = Qwen2TokenizerFast(vocab=vocab, merges=list(merges), unk_token=None).backend_tokenizer
    for content, special in QWEN_ADDED_TOKENS:
        token = AddedToken(content, special=special, normalized=False)
        if special:
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
    return backend.to_str()


class _TokenizerFile:
    """The tokenizer JSON written once per process into a private folder (removed at exit)."""

    def __init__(self, text: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="hivig-tokenizer-"))
        self.path = self.folder / "tokenizer.json"
        self.path.write_text(text, encoding="utf-8")
        # multiprocessing's finalizer runs in the process that made the folder only (a forked
        # worker never removes its parent's) and also when a multiprocessing worker exits.
        Finalize(self, shutil.rmtree, args=(self.folder, True), exitpriority=0)


@lru_cache(maxsize=1)
def _qwen_tokenizer_file() -> _TokenizerFile:
    return _TokenizerFile(_qwen_tokenizer_json())


def _add_qwen_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    # The ids exist already; this registers the special ones with the wrapper.
    special = [t for t, is_special in QWEN_ADDED_TOKENS if is_special]
    tokenizer.add_special_tokens({"additional_special_tokens": special[1:]})


def qwen_tokenizer() -> PreTrainedTokenizerBase:
    """The real Qwen3-VL tokenizer, built offline from the ``dashscope`` BPE ranks.

    Ranks 0..151642 are the Qwen byte-level BPE; ``QWEN_ADDED_TOKENS`` follow at 151643..151668.
    Pad is ``<|endoftext|>`` and EOS ``<|im_end|>``, as in Qwen3-VL. The vocabulary is built
    once per process (about 2 s) and every call returns a fresh object (under a second).

    Returns:
        A ``Qwen2TokenizerFast`` with 151,669 entries.

    Raises:
        ModuleNotFoundError: ``dashscope`` (part of the train and test extras) is not installed.
    """
    # From a file rather than ``tokenizer_object=``: transformers deep-copies a passed object
    # (a pickle round trip of the whole vocabulary), which made every call about 4x slower.
    tokenizer = Qwen2TokenizerFast(
        tokenizer_file=str(_qwen_tokenizer_file().path),
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    _add_qwen_tokens(tokenizer)
    ids = tokenizer.convert_tokens_to_ids([t for t, _ in QWEN_ADDED_TOKENS])
    expected = list(range(QWEN_FIRST_ADDED_ID, QWEN_FIRST_ADDED_ID + len(QWEN_ADDED_TOKENS)))
    if ids != expected:
        raise RuntimeError(f"Qwen added tokens at {ids}, expected {expected}")
    return tokenizer


def tiny_tokenizer() -> PreTrainedTokenizerBase:
    """A byte-level Qwen2 tokenizer with the Qwen special tokens (fresh object per call).

    Every byte is one token (ids 0–255); the control tokens follow in ``SPECIAL_TOKENS`` order,
    then ``<think>``/``</think>``. Pad is ``<|endoftext|>`` and EOS ``<|im_end|>``, as in Qwen3-VL.

    Returns:
        A ``Qwen2TokenizerFast`` (the class 4.57's ``Qwen3VLProcessor`` type-checks).
    """
    vocab = dict(_byte_vocab())
    vocab.update({tok: 256 + k for k, tok in enumerate(SPECIAL_TOKENS + THINK_TOKENS)})
    tokenizer = Qwen2TokenizerFast(
        vocab=vocab,
        merges=[],
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": list(SPECIAL_TOKENS)})
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    return tokenizer


TOKENIZERS = ("qwen", "bytes")
"""``tiny_processor`` tokenizers: the real Qwen one (default) or the byte-level one."""


def tiny_processor(
    thinking: bool = False,
    min_pixels: int = TINY_MIN_PIXELS,
    max_pixels: int = TINY_MAX_PIXELS,
    tokenizer: str = "qwen",
) -> Qwen3VLProcessor:
    """A real ``Qwen3VLProcessor`` with an offline tokenizer, an explicit budget and our template.

    Args:
        thinking: Use the ``prefill_think`` chat template (generation prompt opens ``<think>``)
            instead of the default one.
        min_pixels: Lower bound on an image's area, in pixels.
        max_pixels: Upper bound on an image's area, in pixels.
        tokenizer: ``"qwen"`` (``qwen_tokenizer``, real ids) or ``"bytes"``
            (``tiny_tokenizer``, one token per byte).

    Returns:
        A fresh processor (callers may change it).

    Raises:
        ValueError: Unknown ``tokenizer``.
    """
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
    policy = "prefill_think" if thinking else "default"
    return assemble_processor(
        qwen_tokenizer() if tokenizer == "qwen" else tiny_tokenizer(),
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        chat_template=load_chat_template(policy),
    )


def tiny_config(processor: Qwen3VLProcessor) -> Qwen3VLConfig:
    """The tiny Qwen3-VL config, with vocabulary and special ids from the processor's tokenizer."""
    ids = token_ids(processor)
    tokenizer = processor.tokenizer
    text = dict(_TEXT_CONFIG, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    return Qwen3VLConfig(
        text_config=text,
        vision_config=dict(_VISION_CONFIG),
        image_token_id=ids.image,
        video_token_id=ids.video,
        vision_start_token_id=ids.vision_start,
        vision_end_token_id=ids.vision_end,
        tie_word_embeddings=False,
    )


def tiny_model(
    processor: Qwen3VLProcessor,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    use_cache: bool = False,
) -> Qwen3VLForConditionalGeneration:
    """A deterministic random-weight tiny Qwen3-VL with SDPA attention.

    Args:
        processor: Processor whose tokenizer fixes the vocabulary and special ids.
        seed: Weight-initialisation seed; the global RNG state is left untouched.
        dtype: Parameter dtype (fp32 for golden-value tests).
        use_cache: KV cache in forward, set on ``text_config`` where the text model reads it
            (``hivig.models.qwen_vl.set_use_cache``); ``False`` for training.

    Returns:
        The model in train mode.
    """
    config = tiny_config(processor)
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config)
    set_use_cache(model, use_cache)
    return model.to(dtype).train()


def save_tiny_checkpoint(out_dir: str | Path, thinking: bool = False, seed: int = 0) -> Path:
    """Write a tiny model and its processor as a normal Hugging Face checkpoint directory.

    The model is saved first and the processor second, so the processor files (and the chat
    template) are the ones left on disk.

    Args:
        out_dir: Target directory (created if missing).
        thinking: Save the ``prefill_think`` chat template instead of the default one.
        seed: Weight-initialisation seed.

    Returns:
        The checkpoint directory, loadable with ``AutoModelForImageTextToText`` and
        ``AutoProcessor``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    processor = tiny_processor(thinking=thinking)
    tiny_model(processor, seed=seed).save_pretrained(out)
    processor.save_pretrained(out)
    return out


def synthetic_screenshot(width: int, height: int, seed: int = 0) -> Image.Image:
    """A small deterministic RGB "screen": title bar, panels, buttons and text-like strokes.

    Args:
        width: Width in pixels.
        height: Height in pixels.
        seed: Layout and colour seed.

    Returns:
        A new RGB image; the same arguments always give the same pixels.
    """
    if width <= 0 or height <= 0:
        raise ValueError(f"sizes must be positive, got {width}x{height}")
    rng = random.Random(seed)
    image = Image.new("RGB", (width, height), (rng.randint(220, 250),) * 3)
    draw = ImageDraw.Draw(image)
    bar = max(2, height // 12)
    draw.rectangle((0, 0, width - 1, bar), fill=(rng.randint(30, 90), rng.randint(60, 120), 160))
    for _ in range(rng.randint(2, 5)):
        x0, y0 = rng.randrange(width), rng.randrange(bar, height)
        x1 = min(width - 1, x0 + rng.randint(4, max(5, width // 3)))
        y1 = min(height - 1, y0 + rng.randint(4, max(5, height // 4)))
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        draw.rectangle((x0, y0, x1, y1), fill=colour, outline=(0, 0, 0))
    for row in range(bar + 3, height - 2, max(3, height // 10)):
        x, end = rng.randint(1, max(1, width // 8)), rng.randint(width // 3, width - 1)
        draw.line((x, row, end, row), fill=(40, 40, 40), width=1)
    return image


def synthetic_conversation(
    num_images: int = 1,
    *,
    seed: int = 0,
    min_pixels: int = TINY_MIN_PIXELS,
    max_pixels: int = TINY_MAX_PIXELS,
    user_text: str = "Judge the last action of the agent.",
) -> tuple[list[ChatMessage], str]:
    """A critique-shaped conversation with canonical synthetic frames, and its target.

    Args:
        num_images: Screenshots in the user turn (stable parts first: system, images, text).
        seed: Seed of the screenshots; image ``k`` uses ``seed + k`` and a size that varies with
            ``k`` so grids differ.
        min_pixels: Canonical-frame lower budget, in pixels.
        max_pixels: Canonical-frame upper budget, in pixels.
        user_text: Text after the images.

    Returns:
        ``(messages, target)``; the target is a stored-format critique
        (``hivig.contracts.render_critique_target``), valid under both think policies.
    """
    sizes = ((200, 90), (100, 60), (64, 64), (160, 120))
    frames = [
        canonical_frame(
            synthetic_screenshot(*sizes[k % len(sizes)], seed=seed + k),
            min_pixels=min_pixels,
            max_pixels=max_pixels,
        )
        for k in range(num_images)
    ]
    messages = [
        ChatMessage("system", [TextPart("You are a critic of computer-use agents.")]),
        ChatMessage("user", [*(ImagePart(f) for f in frames), TextPart(user_text)]),
    ]
    target = render_critique_target(
        "The click hit the Save button.", "Good", None, "The file is saved."
    )
    return messages, target
