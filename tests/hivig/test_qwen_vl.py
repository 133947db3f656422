"""hivig.models.qwen_vl on the tiny CPU model: template, budget, labels, MRoPE, freezing, saving."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoProcessor, LlamaConfig

from hivig.contracts import render_critique_target
from hivig.messages import ChatMessage, ImagePart, ImageRef, TextPart
from hivig.models import qwen_vl
from hivig.models.qwen_vl import IGNORE_INDEX, EncodeError, encode_sample
from hivig.tiny import (
    qwen_tokenizer,
    synthetic_conversation,
    synthetic_screenshot,
    tiny_model,
    tiny_processor,
)
from hivig.vision import canonical_frame


@pytest.fixture(scope="module")
def processor():
    return tiny_processor()


@pytest.fixture(scope="module")
def think_processor():
    return tiny_processor(thinking=True)


def _loss(model, sample):
    logits = model(**sample.model_inputs()).logits[0].float()
    return F.cross_entropy(logits, sample.labels, ignore_index=IGNORE_INDEX, reduction="sum")


def _supervised_text(processor, sample):
    kept = sample.labels[sample.labels != IGNORE_INDEX]
    return processor.tokenizer.decode(kept.tolist())


# ---------------------------------------------------------------------------------------------
# Chat template and think policy

GOLDEN_CONVERSATION = [
    ChatMessage("system", [TextPart("You judge agents.")]),
    ChatMessage(
        "user",
        [ImagePart(ImageRef("a.png")), ImagePart(ImageRef("b.png")), TextPart("Step 3: click.")],
    ),
]
GOLDEN_PROMPT = (
    "<|im_start|>system\nYou judge agents.<|im_end|>\n"
    "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
    "<|vision_start|><|image_pad|><|vision_end|>Step 3: click.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_golden_prompt_default_policy(processor):
    assert qwen_vl.render_prompt(processor, GOLDEN_CONVERSATION) == GOLDEN_PROMPT


def test_golden_prompt_prefill_think_policy(think_processor):
    rendered = qwen_vl.render_prompt(think_processor, GOLDEN_CONVERSATION)
    assert rendered == GOLDEN_PROMPT + "<think>\n"


def test_no_default_system_prompt_and_full_conversation(processor):
    user = [ChatMessage("user", [TextPart("hi")])]
    assert qwen_vl.render_prompt(processor, user) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    target = render_critique_target("r", "Good", None, "x")
    full = [*GOLDEN_CONVERSATION, ChatMessage("assistant", [TextPart(target)])]
    # A finished conversation is prompt + target + "<|im_end|>\n", as encode_sample builds it.
    rendered = qwen_vl.render_prompt(processor, full, add_generation_prompt=False)
    assert rendered == GOLDEN_PROMPT + target + "<|im_end|>\n"


def test_generation_prompt_ids(processor, think_processor):
    tok = processor.tokenizer
    assert qwen_vl.generation_prompt_ids(processor) == tok.encode(
        "<|im_start|>assistant\n", add_special_tokens=False
    )
    assert qwen_vl.generation_prompt_ids(think_processor) == tok.encode(
        "<|im_start|>assistant\n<think>\n", add_special_tokens=False
    )


def test_generation_prefill(processor, think_processor):
    assert qwen_vl.generation_prefill(processor) == ""
    assert qwen_vl.generation_prefill(think_processor) == "<think>\n"
    broken = tiny_processor()
    broken.chat_template = "{% if add_generation_prompt %}<think>\n{% endif %}"
    with pytest.raises(ValueError, match="does not start with"):
        qwen_vl.generation_prefill(broken)


def test_load_chat_template_rejects_unknown_policy():
    with pytest.raises(ValueError, match="think_policy"):
        qwen_vl.load_chat_template("nothink")
    with pytest.raises(FileNotFoundError):
        qwen_vl.load_chat_template("default", version=99)


# ---------------------------------------------------------------------------------------------
# Model fixture validity


def test_forward_backward_and_deepstack_gradients(processor):
    model = tiny_model(processor)
    qwen_vl.apply_freezing(model, train_deepstack=True)
    sample = encode_sample(processor, *synthetic_conversation(2))
    loss = _loss(model, sample)
    assert torch.isfinite(loss)
    loss.backward()
    deepstack = model.model.visual.deepstack_merger_list
    assert len(deepstack) == 2
    for projector in deepstack:
        grads = [p.grad for p in projector.parameters()]
        assert all(g is not None for g in grads)
        assert sum(float(g.abs().sum()) for g in grads) > 0


@pytest.mark.parametrize("num_images", [1, 2, 3])
def test_placeholder_count_equals_grid(processor, num_images):
    messages, target = synthetic_conversation(num_images, seed=num_images)
    sample = encode_sample(processor, messages, target)
    grid = sample.image_grid_thw
    assert grid.shape == (num_images, 3)
    expected = int(grid.prod(dim=-1).sum()) // 4
    assert sample.num_image_tokens == expected
    assert int((sample.input_ids == processor.image_token_id).sum()) == expected
    assert sample.pixel_values.shape == (int(grid.prod(dim=-1).sum()), 3 * 2 * 16 * 16)
    for frame, (t, h, w) in zip(messages[1].images(), grid.tolist(), strict=True):
        assert (t, h * 16, w * 16) == (1, frame.height, frame.width)
    # Our token types match what the installed processor returns for the same prompt.
    direct = processor(
        text=[qwen_vl.render_prompt(processor, messages)],
        images=messages[1].images(),
        do_resize=False,
        return_tensors="pt",
    )
    n = sample.prompt_length
    assert torch.equal(direct["input_ids"][0], sample.input_ids[:n])
    assert torch.equal(direct["mm_token_type_ids"][0].int(), sample.mm_token_type_ids[:n])


@pytest.mark.parametrize(
    ("min_pixels", "max_pixels", "grid"),
    [
        (65_536, 1_048_576, (1, 48, 84)),  # hivig cap: 1344x768 -> 1,008 tokens
        (65_536, 16_777_216, (1, 68, 120)),  # model default: 1920x1088 -> 2,040 tokens
    ],
)
def test_full_hd_grid(min_pixels, max_pixels, grid):
    proc = tiny_processor(min_pixels=min_pixels, max_pixels=max_pixels)
    frame = canonical_frame(
        synthetic_screenshot(1920, 1080), min_pixels=min_pixels, max_pixels=max_pixels
    )
    messages = [ChatMessage("user", [ImagePart(frame), TextPart("x")])]
    sample = encode_sample(proc, messages)
    assert tuple(sample.image_grid_thw[0].tolist()) == grid
    assert sample.num_image_tokens == grid[1] * grid[2] // 4
    # The processor's own estimate agrees, so its budget is ours.
    assert proc.image_processor.get_number_of_image_patches(1080, 1920, {}) == grid[1] * grid[2]


# ---------------------------------------------------------------------------------------------
# Labels


def test_labels_cover_exactly_answer_and_im_end(processor):
    messages, target = synthetic_conversation(2)
    sample = encode_sample(processor, messages, target)
    ids, labels, n = sample.input_ids, sample.labels, sample.prompt_length
    tok = processor.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert _supervised_text(processor, sample) == target + "<|im_end|>"
    assert sample.num_supervised == len(tok.encode(target, add_special_tokens=False)) + 1
    assert sample.num_supervised == int((labels != IGNORE_INDEX).sum())
    # Pre-shifted: the logits at the last prompt token predict the first answer token.
    assert (labels[: n - 1] == IGNORE_INDEX).all()
    assert labels[n - 1] == ids[n]
    # The input ends with "<|im_end|>\n"; "\n" is in the input but never supervised.
    assert ids[-2] == im_end and tok.decode([int(ids[-1])]) == "\n"
    assert labels[-3] == im_end and (labels[-2:] == IGNORE_INDEX).all()
    supervised = set(labels[labels != IGNORE_INDEX].tolist())
    vision = {
        processor.image_token_id,
        processor.vision_start_token_id,
        processor.vision_end_token_id,
    }
    assert not supervised & vision


STORED_TARGET = render_critique_target(
    "The X sits beside Save.", "Bad", "Grounding/Spatial Error", "The click missed Save."
)


@pytest.mark.parametrize("thinking", [False, True])
def test_stored_target_encodes_once_under_both_policies(thinking):
    # Stored targets always open with "<think>\n" (the contract renderers' format); the prompt of
    # prefill_think already ends with it, so the answer must not repeat it.
    proc = tiny_processor(thinking=thinking)
    messages, _ = synthetic_conversation(1)
    assert STORED_TARGET.startswith("<think>\n") and "</think>\n<criticism>" in STORED_TARGET
    sample = encode_sample(proc, messages, STORED_TARGET)
    tok = proc.tokenizer
    think_open = tok.convert_tokens_to_ids("<think>")
    assert int((sample.input_ids == think_open).sum()) == 1
    # Whole sequence == the template's rendering of the finished conversation.
    done = [*messages, ChatMessage("assistant", [TextPart(STORED_TARGET)])]
    full = qwen_vl.render_prompt(proc, done, add_generation_prompt=False)
    assert tok.decode(sample.input_ids.tolist()) == full.replace(
        "<|image_pad|>", "<|image_pad|>" * sample.num_image_tokens
    )
    prefill = "<think>\n" if thinking else ""
    prompt = tok.decode(sample.input_ids[: sample.prompt_length].tolist())
    assert prompt.endswith("<|im_start|>assistant\n" + prefill)
    supervised = STORED_TARGET.removeprefix(prefill) + "<|im_end|>"
    assert _supervised_text(proc, sample) == supervised
    assert sample.num_supervised == len(tok.encode(supervised, add_special_tokens=False))


def test_target_without_the_prefill_is_rejected(think_processor, processor):
    messages, _ = synthetic_conversation(1)
    reasoning_first = STORED_TARGET.removeprefix("<think>\n")
    with pytest.raises(EncodeError) as err:
        encode_sample(think_processor, messages, reasoning_first)
    assert err.value.reason == "prefill_mismatch"
    with pytest.raises(EncodeError) as err:
        encode_sample(think_processor, messages, "<think>" + reasoning_first)  # no newline
    assert err.value.reason == "prefill_mismatch"
    # The default policy pre-fills nothing, so any answer is taken as it is.
    sample = encode_sample(processor, messages, reasoning_first)
    assert _supervised_text(processor, sample) == reasoning_first + "<|im_end|>"


def test_user_text_with_assistant_does_not_fool_the_mask(processor):
    # "\nassistant\n" inside user text is the header's own token pair (BPE gives " assistant" a
    # different id after a space, so a line of its own is what a matcher could confuse).
    tricky = "The assistant\nreplied;\nassistant\n said it twice, then assistant\n"
    messages, target = synthetic_conversation(1, user_text=tricky)
    target = target.replace("The click", "The assistant\nclick")  # and in the answer itself
    sample = encode_sample(processor, messages, target)
    assert _supervised_text(processor, sample) == target + "<|im_end|>"
    ids = sample.input_ids.tolist()
    header = qwen_vl.token_ids(processor).assistant_header
    end = qwen_vl.token_ids(processor).im_end
    assert qwen_vl.supervised_span(ids, header_ids=header, end_id=end)[0] == sample.prompt_length
    # Negative control: the role word alone (without <|im_start|>) first matches inside the user
    # turn, so a matcher keyed on it would supervise user text.
    word = processor.tokenizer.encode("assistant\n", add_special_tokens=False)
    first = next(i for i in range(len(ids)) if ids[i : i + len(word)] == word)
    assert first < sample.prompt_length - len(header)
    assert ids[first - 1] != header[0]


def test_supervised_span_rules():
    header, end = [7, 8, 9], 5
    ids = [1, 7, 8, 9, 20, 21, 5, 10, 7, 8, 9, 30, 31, 5, 10]
    assert qwen_vl.supervised_span(ids, header_ids=header, end_id=end) == (11, 14)
    assert qwen_vl.supervised_span(ids, header_ids=header, end_id=end, prefill_ids=[30]) == (12, 14)
    with pytest.raises(EncodeError) as err:
        qwen_vl.supervised_span([1, 2, 3], header_ids=header, end_id=end)
    assert err.value.reason == "no_assistant_turn"
    with pytest.raises(EncodeError) as err:
        qwen_vl.supervised_span([1, 7, 8, 9, 20], header_ids=header, end_id=end)
    assert err.value.reason == "unterminated_answer"
    labels = qwen_vl.shifted_labels(torch.tensor(ids), 11, 14)
    assert labels.tolist() == [IGNORE_INDEX] * 10 + [30, 31, 5] + [IGNORE_INDEX] * 2
    with pytest.raises(ValueError):
        qwen_vl.shifted_labels(torch.tensor(ids), 0, 3)  # a sample never starts supervised


def test_serving_encoding_is_the_training_prefix(processor):
    messages, target = synthetic_conversation(2)
    train = encode_sample(processor, messages, target)
    serve = encode_sample(processor, messages)
    assert serve.labels is None and serve.num_supervised == 0
    assert serve.prompt_length == serve.input_ids.shape[0] == train.prompt_length
    assert torch.equal(serve.input_ids, train.input_ids[: serve.prompt_length])
    assert torch.equal(serve.position_ids, train.position_ids[:, : serve.prompt_length])
    assert torch.equal(serve.pixel_values, train.pixel_values)
    assert torch.equal(serve.image_grid_thw, train.image_grid_thw)


# ---------------------------------------------------------------------------------------------
# Bad input


def _one_image(frame, text="x"):
    return [ChatMessage("user", [ImagePart(frame), TextPart(text)])]


@pytest.mark.parametrize(
    ("messages", "target", "reason"),
    [
        (_one_image(ImageRef("shot.png")), None, "not_materialised"),
        (_one_image(synthetic_screenshot(100, 60)), None, "not_canonical"),
        (
            _one_image(synthetic_screenshot(64, 64), "a <|image_pad|> b"),
            None,
            "special_token_in_text",
        ),
        (_one_image(synthetic_screenshot(64, 64)), "ok<|im_end|>more", "special_token_in_text"),
        (
            [ChatMessage("user", [TextPart("x")]), ChatMessage("assistant", [TextPart("y")])],
            None,
            "bad_message",
        ),
        ([ChatMessage("tool", [TextPart("x")])], None, "bad_message"),
    ],
)
def test_bad_input_gets_a_typed_error(processor, messages, target, reason):
    with pytest.raises(EncodeError) as err:
        encode_sample(processor, messages, target)
    assert err.value.reason == reason


def test_think_tags_in_text_are_allowed(processor):
    sample = encode_sample(processor, _one_image(synthetic_screenshot(64, 64), "<think>ok"), "y")
    assert sample.num_supervised == 2


def test_long_samples_are_never_truncated():
    proc = tiny_processor()
    proc.tokenizer.model_max_length = 32  # far below the sample length
    messages, target = synthetic_conversation(2)
    sample = encode_sample(proc, messages, target)
    assert sample.input_ids.shape[0] > 2 * proc.tokenizer.model_max_length
    assert sample.num_image_tokens == int(sample.image_grid_thw.prod(dim=-1).sum()) // 4
    assert _supervised_text(proc, sample) == target + "<|im_end|>"


def test_text_only_sample(processor):
    sample = encode_sample(processor, [ChatMessage("user", [TextPart("hi")])], "ok")
    assert sample.pixel_values is None and sample.image_grid_thw is None
    assert sample.num_image_tokens == 0
    assert torch.equal(sample.position_ids[1], sample.position_ids[0])


# ---------------------------------------------------------------------------------------------
# Positions


@pytest.mark.parametrize("num_images", [0, 1, 2, 3])
def test_mrope_matches_installed_get_rope_index(processor, num_images):
    model = tiny_model(processor)
    if num_images:
        messages, target = synthetic_conversation(num_images, seed=7)
    else:
        messages, target = [ChatMessage("user", [TextPart("text only")])], "ok"
    sample = encode_sample(processor, messages, target)
    theirs, _ = model.model.get_rope_index(
        sample.input_ids[None],
        mm_token_type_ids=sample.mm_token_type_ids[None],
        image_grid_thw=sample.image_grid_thw,
    )
    assert torch.equal(sample.position_ids[1:], theirs[:, 0])
    assert torch.equal(sample.position_ids[0], torch.arange(sample.input_ids.shape[0]))


def test_mrope_rule_on_a_hand_example():
    # text, text, 2x3 merged image (grid 1x4x6), text
    img = 9
    ids = torch.tensor([1, 2] + [img] * 6 + [3])
    pos = qwen_vl.mrope_position_ids(ids, torch.tensor([[1, 4, 6]]), image_token_id=img)
    assert pos[0].tolist() == [0, 1, 2, 2, 2, 2, 2, 2, 5]
    assert pos[1].tolist() == [0, 1, 2, 2, 2, 3, 3, 3, 5]
    assert pos[2].tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5]
    with pytest.raises(EncodeError):
        qwen_vl.mrope_position_ids(ids, torch.tensor([[1, 4, 4]]), image_token_id=img)
    with pytest.raises(EncodeError):
        qwen_vl.mrope_position_ids(ids, None, image_token_id=img)


def test_four_row_positions_equal_the_models_own(processor):
    model = tiny_model(processor).eval()
    sample = encode_sample(processor, *synthetic_conversation(2))
    inputs = sample.model_inputs()
    with torch.no_grad():
        ours = model(**inputs).logits
        inputs.pop("position_ids")
        internal = model(**inputs).logits
        # Negative control: plain 1-D positions ignore the image layout and change the logits.
        inputs["position_ids"] = torch.arange(sample.input_ids.shape[0])[None]
        flat = model(**inputs).logits
    assert torch.allclose(ours, internal, atol=1e-5)
    assert not torch.allclose(ours, flat, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# Freezing and optimizer groups


def test_module_groups_partition_the_parameters(processor):
    model = tiny_model(processor)
    groups = qwen_vl.module_groups(model)
    assert tuple(groups) == qwen_vl.MODULE_GROUPS
    names = [n for g in groups.values() for n in g]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert len(names) == len(set(names))
    assert all(n.startswith("model.visual.deepstack_merger_list.") for n in groups["deepstack"])
    assert all(n.startswith("model.visual.merger.") for n in groups["merger"])
    assert all(n.startswith("model.language_model.") for n in groups["llm"])
    assert groups["lm_head"] == ["lm_head.weight"]
    assert any(n.startswith("model.visual.blocks.") for n in groups["vit"])
    assert not any("merger" in n for n in groups["vit"])


FREEZE_CONFIGS = [
    {},  # hivig default: ViT and DeepStack frozen, merger + LLM + head trained
    {"train_vit": True, "train_deepstack": True},
    {"train_merger": False, "train_llm": False, "train_lm_head": True},
]


@pytest.mark.parametrize("flags", FREEZE_CONFIGS)
def test_freezing_controls_gradients(processor, flags):
    model = tiny_model(processor)
    counts = qwen_vl.apply_freezing(model, **flags)
    expected = {
        "vit": flags.get("train_vit", False),
        "merger": flags.get("train_merger", True),
        "deepstack": flags.get("train_deepstack", False),
        "llm": flags.get("train_llm", True),
        "lm_head": flags.get("train_lm_head", flags.get("train_llm", True)),
    }
    assert {g: c > 0 for g, c in counts.items()} == expected
    _loss(model, encode_sample(processor, *synthetic_conversation(1))).backward()
    params = dict(model.named_parameters())
    for group, names in qwen_vl.module_groups(model).items():
        for name in names:
            assert params[name].requires_grad is expected[group], name
            assert (params[name].grad is not None) is expected[group], name
        if expected[group]:
            assert sum(float(params[n].grad.abs().sum()) for n in names) > 0, group


def test_parameter_groups(processor):
    model = tiny_model(processor)
    qwen_vl.apply_freezing(model, train_vit=True)
    groups = qwen_vl.parameter_groups(
        model, lr_llm=1e-5, lr_merger=2e-5, lr_vit=1e-6, weight_decay=0.1
    )
    by_name = {g["name"]: g for g in groups}
    assert set(by_name) == {
        "vit",
        "vit_no_decay",
        "merger",
        "merger_no_decay",
        "llm",
        "llm_no_decay",
        "lm_head",
    }
    assert by_name["vit"]["lr"] == 1e-6 and by_name["merger"]["lr"] == 2e-5
    assert by_name["llm"]["lr"] == by_name["lm_head"]["lr"] == 1e-5
    assert all(g["weight_decay"] == 0.0 for n, g in by_name.items() if n.endswith("_no_decay"))
    assert by_name["llm"]["weight_decay"] == 0.1
    ids = {id(p) for g in groups for p in g["params"]}
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert ids == trainable and sum(len(g["params"]) for g in groups) == len(trainable)
    norm = model.model.language_model.norm.weight
    assert any(p is norm for p in by_name["llm_no_decay"]["params"])
    torch.optim.AdamW(groups)  # accepted as is
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable"):
        qwen_vl.parameter_groups(model, lr_llm=1, lr_merger=1, lr_vit=1, weight_decay=0)


def test_groups_and_counts_of_zero3_partitioned_parameters(processor):
    # Under ZeRO-3 init every parameter is an empty 1-D partition; its real shape is ds_shape.
    def names_by_group(model):
        groups = qwen_vl.parameter_groups(
            model, lr_llm=1e-5, lr_merger=2e-5, lr_vit=1e-6, weight_decay=0.1
        )
        names = {id(p): n for n, p in model.named_parameters()}
        return {g["name"]: sorted(names[id(p)] for p in g["params"]) for g in groups}

    whole = tiny_model(processor)
    counts = qwen_vl.apply_freezing(whole, train_vit=True)
    expected = names_by_group(whole)
    parted = tiny_model(processor)
    for p in parted.parameters():
        p.ds_shape, p.ds_numel = p.shape, p.numel()
        p.data = torch.empty(0, dtype=p.dtype)
    assert qwen_vl.apply_freezing(parted, train_vit=True) == counts
    assert counts["llm"] > 0
    assert names_by_group(parted) == expected


# ---------------------------------------------------------------------------------------------
# Processor budget, loading and saving


def test_budget_is_asserted(processor):
    proc = tiny_processor()
    qwen_vl.check_pixel_budget(proc, min_pixels=1024, max_pixels=65_536)
    with pytest.raises(ValueError, match="budget"):
        qwen_vl.check_pixel_budget(proc, min_pixels=1024, max_pixels=1_048_576)
    # A class that ignores ``size`` (4.57's slow processor) is caught by the probe.
    proc.image_processor.get_number_of_image_patches = lambda h, w, kw: 46 * 82
    with pytest.raises(ValueError, match="probe"):
        qwen_vl.check_pixel_budget(proc, min_pixels=1024, max_pixels=65_536)
    qwen25 = tiny_processor()
    qwen25.image_processor.patch_size = 14
    with pytest.raises(ValueError, match="geometry"):
        qwen_vl.check_pixel_budget(qwen25, min_pixels=1024, max_pixels=65_536)
    with pytest.raises(ValueError):
        qwen_vl.set_pixel_budget(tiny_processor(), min_pixels=4096, max_pixels=1024)


def test_build_processor_needs_a_checkpoint_and_installs_the_budget(tiny_checkpoint):
    # No library default reaches the test fixtures: offline processors are assembled explicitly.
    with pytest.raises(ValueError, match="assemble_processor"):
        qwen_vl.build_processor(None, min_pixels=2048, max_pixels=32_768)
    offline = tiny_processor(min_pixels=2048, max_pixels=32_768)
    assert qwen_vl.pixel_budget(offline) == (2048, 32_768)
    ckpt = tiny_checkpoint
    # from_pretrained would keep the saved budget; build_processor installs the requested one.
    proc = qwen_vl.build_processor(ckpt, min_pixels=4096, max_pixels=1_048_576)
    assert qwen_vl.pixel_budget(proc) == (4096, 1_048_576)
    assert proc.image_processor.get_number_of_image_patches(1080, 1920, {}) == 48 * 84
    assert qwen_vl.think_policy_of(proc) == "default"


def test_save_load_round_trip_keeps_template_tokens_and_budget(tmp_path):
    template = qwen_vl.load_chat_template("prefill_think")
    proc = qwen_vl.assemble_processor(
        qwen_tokenizer(), min_pixels=2048, max_pixels=131_072, chat_template=template
    )
    model = tiny_model(proc)
    out = tmp_path / "ckpt"
    model.save_pretrained(out)
    proc.save_pretrained(out)  # after the model, so the processor files win
    again = AutoProcessor.from_pretrained(out)
    assert again.chat_template == template
    assert qwen_vl.pixel_budget(again) == (2048, 131_072)
    assert qwen_vl.token_ids(again) == qwen_vl.token_ids(proc)
    assert again.tokenizer.get_added_vocab() == proc.tokenizer.get_added_vocab()
    assert again.tokenizer.all_special_tokens == proc.tokenizer.all_special_tokens
    rebuilt = qwen_vl.build_processor(out, min_pixels=2048, max_pixels=131_072)
    assert qwen_vl.think_policy_of(rebuilt) == "prefill_think"  # ours: kept, not replaced
    messages, target = synthetic_conversation(2)
    a, b = encode_sample(proc, messages, target), encode_sample(rebuilt, messages, target)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.pixel_values, b.pixel_values)


def test_foreign_template_is_replaced_with_a_warning(tmp_path, caplog):
    proc = tiny_processor()
    proc.chat_template = "{% for m in messages %}{{ m['role'] }}{% endfor %}"
    proc.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        rebuilt = qwen_vl.build_processor(tmp_path, min_pixels=1024, max_pixels=65_536)
    assert qwen_vl.think_policy_of(rebuilt) == "default"
    assert "replacing the chat template" in caplog.text


def _returns_cache(model):
    sample = encode_sample(tiny_processor(), [ChatMessage("user", [TextPart("hi")])])
    with torch.no_grad():
        out = model.eval()(**sample.model_inputs())
    return getattr(out, "cache", None) is not None or out.get("past_key_values") is not None


@pytest.mark.parametrize("use_cache", [False, True])
def test_set_use_cache_reaches_the_text_model(processor, use_cache):
    model = tiny_model(processor)
    qwen_vl.set_use_cache(model, use_cache)
    assert model.config.text_config.use_cache is use_cache
    assert _returns_cache(model) is use_cache


def test_load_model_by_model_type(tiny_checkpoint, tmp_path):
    ckpt = tiny_checkpoint
    model = qwen_vl.load_model(ckpt, dtype=torch.bfloat16, attn_implementation="sdpa")
    assert type(model).__name__ == "Qwen3VLForConditionalGeneration"
    assert model.dtype == torch.bfloat16 and model.config.text_config.use_cache is False
    # The text model reads text_config.use_cache (5.x has no top-level field).
    cached = qwen_vl.load_model(
        ckpt, dtype=torch.float32, attn_implementation="sdpa", use_cache=True
    )
    assert cached.config.text_config.use_cache is True
    assert _returns_cache(cached) and not _returns_cache(model.float())
    LlamaConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2).save_pretrained(
        tmp_path / "llama"
    )
    with pytest.raises(ValueError, match="unsupported model_type 'llama'"):
        qwen_vl.load_model(tmp_path / "llama", dtype=torch.float32, attn_implementation="sdpa")


# ---------------------------------------------------------------------------------------------
# GPU


@pytest.mark.gpu
def test_bf16_cuda_logits_close_to_fp32_cpu(processor):
    sample = encode_sample(processor, *synthetic_conversation(2))
    reference = tiny_model(processor).eval()
    gpu = tiny_model(processor, dtype=torch.bfloat16).cuda().eval()
    inputs = {k: v.cuda() for k, v in sample.model_inputs().items()}
    inputs["pixel_values"] = inputs["pixel_values"].bfloat16()
    with torch.no_grad():
        want = reference(**sample.model_inputs()).logits
        got = gpu(**inputs).logits.float().cpu()
    # bf16 keeps ~3 significant digits; on CPU the same comparison stays under 1 % of the scale.
    assert (got - want).abs().max() < 0.05 * want.abs().max()
