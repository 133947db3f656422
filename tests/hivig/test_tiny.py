"""The offline fixtures: tiny tokenizer, processor, model, checkpoint and synthetic screenshots."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor, Qwen2TokenizerFast

from hivig.contracts import ContractError, parse_critique
from hivig.messages import ChatMessage, TextPart
from hivig.models import qwen_vl
from hivig.tiny import (
    QWEN_ADDED_TOKENS,
    SPECIAL_TOKENS,
    THINK_TOKENS,
    TINY_MAX_PIXELS,
    TINY_MIN_PIXELS,
    qwen_tokenizer,
    save_tiny_checkpoint,
    synthetic_conversation,
    synthetic_screenshot,
    tiny_model,
    tiny_processor,
    tiny_tokenizer,
)


def test_real_qwen_tokenizer_gives_the_production_ids():
    tok = qwen_tokenizer()
    assert isinstance(tok, Qwen2TokenizerFast)
    assert len(tok) == 151_669
    # Known ids of the Qwen2/Qwen3 byte-level BPE.
    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert tok.encode("<|im_start|>assistant\n", add_special_tokens=False) == [151644, 77091, 198]
    ids = tok.convert_tokens_to_ids([t for t, _ in QWEN_ADDED_TOKENS])
    assert ids == list(range(151_643, 151_669))
    assert tok.convert_tokens_to_ids(["<|image_pad|>", "<think>", "</think>"]) == [
        151655,
        151667,
        151668,
    ]
    assert tok.pad_token_id == 151643 and tok.eos_token_id == 151645
    text = "Klick auf »Speichern« ✓\n  indented\tcode() 12345"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    # Think and tool tags are added but not special, as in Qwen3-VL.
    ids = tok.encode("<think>\nx\n</think>\nok<|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>\nok"
    # Real BPE: far fewer tokens than bytes for English prose (byte-level: one per byte).
    prose = "The agent clicked the Save button and the dialog closed as expected. " * 20
    assert len(tok.encode(prose, add_special_tokens=False)) < len(prose) / 3.5


def test_tiny_processor_uses_the_real_tokenizer_unless_asked():
    assert len(tiny_processor().tokenizer) == 151_669
    assert len(tiny_processor(tokenizer="bytes").tokenizer) == 256 + 9
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        tiny_processor(tokenizer="sentencepiece")


def test_tokenizer_is_byte_level_with_qwen_specials():
    tok = tiny_tokenizer()
    assert isinstance(tok, Qwen2TokenizerFast)
    text = "Klick auf »Speichern« ✓\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == list(text.encode("utf-8"))  # one token per byte, id == byte value
    assert tok.decode(ids) == text
    special_ids = tok.convert_tokens_to_ids(list(SPECIAL_TOKENS + THINK_TOKENS))
    assert special_ids == list(range(256, 256 + len(SPECIAL_TOKENS) + len(THINK_TOKENS)))
    assert len(tok) == 256 + len(SPECIAL_TOKENS) + len(THINK_TOKENS)
    assert tok.pad_token == "<|endoftext|>" and tok.eos_token == "<|im_end|>"
    # Each control token is one id inside text, never split into bytes.
    ids = tok.encode("a<|im_start|>b<think>c", add_special_tokens=False)
    assert ids == [97, tok.convert_tokens_to_ids("<|im_start|>"), 98, 263, 99]


def test_think_tags_survive_skip_special_tokens():
    tok = tiny_tokenizer()
    ids = tok.encode("<think>\nx\n</think>\nok<|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>\nok"


def test_processor_budget_and_templates():
    proc = tiny_processor()
    assert qwen_vl.pixel_budget(proc) == (TINY_MIN_PIXELS, TINY_MAX_PIXELS)
    assert qwen_vl.think_policy_of(proc) == "default"
    assert qwen_vl.think_policy_of(tiny_processor(thinking=True)) == "prefill_think"
    big = tiny_processor(min_pixels=4096, max_pixels=1_048_576)
    assert qwen_vl.pixel_budget(big) == (4096, 1_048_576)
    assert big.image_processor.get_number_of_image_patches(1080, 1920, {}) == 48 * 84


def test_tiny_model_config_and_size():
    proc = tiny_processor()
    model = tiny_model(proc)
    cfg = model.config
    assert cfg.text_config.num_hidden_layers == 3 and cfg.text_config.hidden_size == 64
    assert cfg.vision_config.depth == 2 and cfg.vision_config.hidden_size == 32
    # More LLM layers than DeepStack entries, so every projector reaches the loss.
    assert len(cfg.vision_config.deepstack_visual_indexes) < cfg.text_config.num_hidden_layers
    assert cfg.image_token_id == proc.image_token_id
    assert cfg.text_config.vocab_size == len(proc.tokenizer)
    assert cfg.text_config.use_cache is False
    assert cfg._attn_implementation == "sdpa"
    # About 288k parameters besides the two 151,669 x 64 vocabulary matrices.
    vocab = 2 * 151_669 * 64
    assert 250_000 < sum(p.numel() for p in model.parameters()) - vocab < 350_000
    assert (
        model.lm_head.weight.data_ptr() != model.model.language_model.embed_tokens.weight.data_ptr()
    )


def test_tiny_model_is_deterministic_and_leaves_global_rng_alone():
    proc = tiny_processor()
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = tiny_model(proc, seed=0)
    after = torch.rand(3)
    assert torch.equal(before, after)
    b = tiny_model(proc, seed=0)
    c = tiny_model(proc, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # Negative control: the seed matters.
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_tiny_model_sets_use_cache_on_the_text_config():
    proc = tiny_processor()
    sample = qwen_vl.encode_sample(proc, [ChatMessage("user", [TextPart("hi")])])
    for flag in (False, True):
        model = tiny_model(proc, use_cache=flag).eval()
        # transformers 5.x's text model reads text_config.use_cache, not the top-level config.
        assert model.config.text_config.use_cache is flag
        with torch.no_grad():
            out = model(**sample.model_inputs())
        assert (out.get("cache", out.get("past_key_values")) is not None) is flag


def test_tiny_model_dtype():
    model = tiny_model(tiny_processor(), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_synthetic_screenshot_is_deterministic_and_structured():
    a = synthetic_screenshot(200, 90, seed=3)
    assert a.size == (200, 90) and a.mode == "RGB"
    assert a.tobytes() == synthetic_screenshot(200, 90, seed=3).tobytes()
    assert a.tobytes() != synthetic_screenshot(200, 90, seed=4).tobytes()
    colours = {a.getpixel((x, y)) for x in range(200) for y in range(90)}
    assert len(colours) >= 4  # background, title bar, panels, strokes


def test_synthetic_conversation_has_canonical_frames():
    messages, target = synthetic_conversation(3, seed=1)
    assert [m.role for m in messages] == ["system", "user"]
    frames = messages[1].images()
    assert len(frames) == 3
    for frame in frames:
        w, h = frame.size
        assert w % 32 == 0 and h % 32 == 0
        assert TINY_MIN_PIXELS <= w * h <= TINY_MAX_PIXELS
    assert len({f.size for f in frames}) > 1
    assert target.startswith("<think>\n") and target.endswith("</criticism>")
    # The stored format is whatever the contract renderers produce, and it parses back.
    parsed = parse_critique(target)
    assert not isinstance(parsed, ContractError) and parsed.verdict == "Good"
    assert "</think>\n<criticism>" in target


def test_saved_checkpoint_loads_with_auto_classes(tmp_path):
    ckpt = save_tiny_checkpoint(tmp_path / "tiny", thinking=True, seed=5)
    processor = AutoProcessor.from_pretrained(ckpt)
    model = AutoModelForImageTextToText.from_pretrained(ckpt).eval()
    assert qwen_vl.think_policy_of(processor) == "prefill_think"
    assert qwen_vl.pixel_budget(processor) == (TINY_MIN_PIXELS, TINY_MAX_PIXELS)
    reference = tiny_model(tiny_processor(thinking=True), seed=5).eval()
    messages, target = synthetic_conversation(1)
    sample = qwen_vl.encode_sample(processor, messages, target)
    with torch.no_grad():
        got = model(**sample.model_inputs()).logits
        want = reference(**sample.model_inputs()).logits
    assert torch.equal(got, want)
