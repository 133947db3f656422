"""Train/serve parity: a stored record and a serving request meet the model as the same tokens.

Training goes builder → ``SFTRecord`` → Parquet → ``record_messages`` → ``materialise`` →
``encode_sample(..., target)``. Serving goes builder → ``materialise`` → ``OpenAIClient`` → HTTP →
the server, which decodes the PNG data URLs, turns ``image_url`` parts into image items (as vLLM
does) and renders them with the checkpoint's chat template and processor. Up to the first
generated token both must be identical: prompt ids, pixels and grids, under both think policies.

Most tests use short hand-written prompts; the real builders' ~6k-token critic system prompt is
cheap to encode but slow through the tiny model, so only the loss check on it is ``slow``.
"""

from __future__ import annotations

import asyncio
import io
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from hivig.actions import action_from_arguments, marks_for_actions
from hivig.backends import OpenAIClient, Sampling
from hivig.contracts import render_critique_target, render_history_target
from hivig.messages import ChatMessage, ImagePart, ImageRef, TextPart
from hivig.models.qwen_vl import (
    IGNORE_INDEX,
    encode_sample,
    generation_prefill,
    generation_prompt_ids,
    render_prompt,
)
from hivig.prompts import build_critique_messages, build_history_messages, format_step
from hivig.records import Labels, read_records, record_from_messages, record_messages, write_records
from hivig.tiny import synthetic_screenshot, tiny_model, tiny_processor
from hivig.vision import materialise, smart_resize
from tests.fakes.openai_server import ScriptedServer, request_images

MIN_PIXELS, MAX_PIXELS = 1024, 65_536
TASK, PLATFORM = "Save the report as PDF", "windows"
SHOTS = {"before.png": (320, 200), "after.png": (300, 180), "current.png": (256, 160)}
POLICIES = ("default", "prefill_think")
KINDS = ("critique", "history")
# Stored targets are what the contract renderers produce, whatever the think policy.
TARGETS = {
    "critique": render_critique_target(
        "Action String Check: the call is valid; the X sits on Save.\n\n"
        "The dialog will close.\n\nThis moves the task forward.",
        "Good",
        None,
        "Save writes the file.",
    ),
    "history": render_history_target(
        "The second screenshot shows the saved file.",
        "the report is open.",
        "the click opened the Save dialog.",
    ),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shots")
    for k, (name, (w, h)) in enumerate(SHOTS.items()):
        synthetic_screenshot(w, h, seed=k).save(folder / name)
    return folder


@pytest.fixture(scope="module")
def processors():
    return {
        policy: tiny_processor(
            thinking=policy == "prefill_think", min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS
        )
        for policy in POLICIES
    }


def _step():
    action = action_from_arguments({"action": "left_click", "coordinate": [500, 540]})
    return format_step("Click Save", [action], "computer_use"), tuple(marks_for_actions([action]))


def _builder_prompt(kind):
    """What data_gen stores and what serve builds from a live request: the same builder call."""
    step, marks = _step()
    if kind == "critique":
        shot = ImageRef("current.png", marks=marks, size_class="desktop")
        return build_critique_messages(TASK, PLATFORM, "", shot, step)
    return build_history_messages(
        TASK, PLATFORM, "Nothing yet.", ImageRef("before.png"), ImageRef("after.png"), step
    )


def _short_prompt(kind):
    """The builders' shape (system text; user images with marks and text) with a short system."""
    step, marks = _step()
    if kind == "critique":
        shot = ImageRef("current.png", marks=marks, size_class="desktop")
        user = [TextPart(f"Task: {TASK}\nScreen:"), ImagePart(shot), TextPart(step)]
    else:
        user = [
            TextPart(f"Task: {TASK}\nBefore:"),
            ImagePart(ImageRef("before.png")),
            TextPart("After:"),
            ImagePart(ImageRef("after.png")),
            TextPart(step),
        ]
    return [
        ChatMessage("system", [TextPart(f"You judge a {kind} step.")]),
        ChatMessage("user", user),
    ]


PROMPTS = {"short": _short_prompt, "builder": _builder_prompt}


def _stored_record(messages, kind, tmp_path):
    """The record as data_gen writes it and train reads it back (a Parquet round trip)."""
    record = record_from_messages(
        messages,
        TARGETS[kind],
        id=f"rec-{kind}",
        kind=kind,
        platform=PLATFORM,
        prompt_version=getattr(messages, "prompt_id", f"test_{kind}_v1"),
        trajectory_id="traj-0",
        episode_key="ep-0",
        step_index=1,
        split="train",
        labels=Labels(verdict="Good") if kind == "critique" else Labels(),
    )
    write_records([record], tmp_path / kind)
    (back,) = read_records(tmp_path / kind)
    assert back == record
    return back


def _frames(messages, root):
    return materialise(messages, root, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


def _train_sample(processor, record, root):
    *prompt, answer = record_messages(record)
    assert answer.role == "assistant" and answer.text() == TARGETS[record.kind]
    return encode_sample(processor, _frames(prompt, root), answer.text())


# ---------------------------------------------------------------------------------------------
# The serving side over HTTP


async def _send(server, messages):
    async with OpenAIClient(server.base_url, "critic", max_retries=0) as client:
        return await client.generate(messages, Sampling(max_tokens=16))


def _served_request(messages):
    """The JSON body a real OpenAI-compatible server receives for these messages."""
    with ScriptedServer(replies=["ok"]) as server:
        asyncio.run(_send(server, messages))
        (body,) = server.requests
    return body


def _vllm_conversation(body):
    """vLLM's "openai" content format: string content → one text item, image_url → image item."""
    conversation = []
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            items = [{"type": "text", "text": content}]
        else:
            items = [
                {"type": "image"}
                if p["type"] == "image_url"
                else {"type": "text", "text": p["text"]}
                for p in content
            ]
        conversation.append({"role": message["role"], "content": items})
    return conversation


def _decode_images(body):
    # vLLM opens the data URL with PIL and converts to RGB.
    return [Image.open(io.BytesIO(png)).convert("RGB") for png in request_images(body)]


def _server_encoding(processor, body, images):
    """Prompt ids and pixels as the server's template and processor produce them."""
    prompt = processor.apply_chat_template(
        _vllm_conversation(body), tokenize=False, add_generation_prompt=True
    )
    return processor(
        text=[prompt], images=images or None, do_resize=False, padding=False, return_tensors="pt"
    )


def _assert_server_matches_training(processor, kind, prompt_fn, root, tmp_path):
    record = _stored_record(prompt_fn(kind), kind, tmp_path)
    train = _train_sample(processor, record, root)

    live = _frames(prompt_fn(kind), root)  # serve: the same builder call, no target
    body = _served_request(live)
    assert [m["role"] for m in body["messages"]] == ["system", "user"]  # no target sent
    images = _decode_images(body)
    sent = [part.image for part in live[1].content if isinstance(part, ImagePart)]
    # The PNG round trip is lossless: same size, same pixels.
    assert [(i.size, i.tobytes()) for i in images] == [(i.size, i.tobytes()) for i in sent]

    served = _server_encoding(processor, body, images)
    n = train.prompt_length
    assert torch.equal(served["input_ids"][0], train.input_ids[:n])
    assert torch.equal(served["pixel_values"], train.pixel_values)
    assert torch.equal(served["image_grid_thw"], train.image_grid_thw)
    # The server's prompt ends at the generation prompt of the checkpoint's think policy.
    tail = "<|im_start|>assistant\n" + generation_prefill(processor)
    assert processor.tokenizer.decode(served["input_ids"][0].tolist()).endswith(tail)
    return train, served


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_http_request_and_stored_record_give_the_same_prompt(
    processors, policy, kind, root, tmp_path
):
    _assert_server_matches_training(processors[policy], kind, _short_prompt, root, tmp_path)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_http_parity_with_the_real_prompt_builders(processors, policy, kind, root, tmp_path):
    _assert_server_matches_training(processors[policy], kind, _builder_prompt, root, tmp_path)


def test_http_parity_check_detects_lossy_images(processors, root, tmp_path):
    # Negative control: a lossy transport (JPEG instead of PNG) changes the pixels the server
    # sees, and the comparison catches it.
    processor = processors["default"]
    record = _stored_record(_short_prompt("critique"), "critique", tmp_path)
    train = _train_sample(processor, record, root)
    body = _served_request(_frames(_short_prompt("critique"), root))
    lossy = []
    for image in _decode_images(body):
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=75)
        lossy.append(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB"))
    served = _server_encoding(processor, body, lossy)
    assert torch.equal(served["input_ids"][0], train.input_ids[: train.prompt_length])
    assert not torch.equal(served["pixel_values"], train.pixel_values)


def test_http_parity_check_detects_a_template_mismatch(processors, root, tmp_path):
    # Negative control: a server started with the other think policy's template renders a
    # different generation prompt, and the comparison catches it.
    record = _stored_record(_short_prompt("history"), "history", tmp_path)
    train = _train_sample(processors["default"], record, root)
    body = _served_request(_frames(_short_prompt("history"), root))
    served = _server_encoding(processors["prefill_think"], body, _decode_images(body))
    assert torch.equal(served["pixel_values"], train.pixel_values)
    assert not torch.equal(served["input_ids"][0], train.input_ids[: train.prompt_length])


# ---------------------------------------------------------------------------------------------
# Stored records under both think policies


def _assert_record_encoding(processor, record, root):
    train = _train_sample(processor, record, root)
    target = TARGETS[record.kind]
    prefill = generation_prefill(processor)
    tok = processor.tokenizer

    # Image tokens equal the canonical grids.
    sizes = [SHOTS[ref.path] for ref in record.images]
    grids = [
        (1, h // 16, w // 16)
        for h, w in (smart_resize(h, w, 32, MIN_PIXELS, MAX_PIXELS) for w, h in sizes)
    ]
    assert [tuple(g) for g in train.image_grid_thw.tolist()] == grids
    assert train.num_image_tokens == sum(t * h * w for t, h, w in grids) // 4

    # The assistant turn opens the think block once: in the generation prompt under
    # prefill_think, in the answer otherwise (the critic system prompt mentions the tag too).
    think = tok.convert_tokens_to_ids("<think>")
    turn = train.input_ids[train.prompt_length - len(generation_prompt_ids(processor)) :]
    assert int((turn == think).sum()) == 1
    prompt = tok.decode(train.input_ids[: train.prompt_length].tolist())
    assert prompt.endswith("<|im_start|>assistant\n" + prefill)
    # Prompt + answer is exactly "<|im_start|>assistant\n" + stored target + "<|im_end|>\n".
    whole = tok.decode(train.input_ids.tolist())
    assert whole.endswith("<|im_start|>assistant\n" + target + "<|im_end|>\n")

    # Labels cover exactly the answer after the prefill, plus <|im_end|>.
    kept = train.labels[train.labels != IGNORE_INDEX].tolist()
    assert tok.decode(kept) == target.removeprefix(prefill) + "<|im_end|>"
    assert (train.labels[: train.prompt_length - 1] == IGNORE_INDEX).all()
    return train


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_stored_record_encodes_under_both_policies(processors, policy, kind, root, tmp_path):
    processor = processors[policy]
    record = _stored_record(_short_prompt(kind), kind, tmp_path)
    train = _assert_record_encoding(processor, record, root)

    # Serving the same prompt in-process gives the training prefix.
    live = _frames(_short_prompt(kind), root)
    *stored_prompt, _ = record_messages(record)
    assert render_prompt(processor, live) == render_prompt(processor, _frames(stored_prompt, root))
    serve = encode_sample(processor, live)
    n = serve.input_ids.shape[0]
    assert n == train.prompt_length
    assert torch.equal(serve.input_ids, train.input_ids[:n])
    assert torch.equal(serve.position_ids, train.position_ids[:, :n])
    assert torch.equal(serve.pixel_values, train.pixel_values)
    assert torch.equal(serve.image_grid_thw, train.image_grid_thw)


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("kind", KINDS)
def test_builder_record_trains_under_both_policies(processors, policy, kind, root, tmp_path):
    processor = processors[policy]
    record = _stored_record(_builder_prompt(kind), kind, tmp_path)
    train = _assert_record_encoding(processor, record, root)
    # The loss is finite on the tiny model (the critic system prompt is ~6k byte tokens).
    model = tiny_model(processor).eval()
    with torch.no_grad():
        logits = model(**train.model_inputs()).logits[0]
    loss = F.cross_entropy(logits, train.labels, ignore_index=IGNORE_INDEX, reduction="sum")
    assert torch.isfinite(loss) and loss.item() > 0


def test_parity_check_detects_a_drift(processors, root, tmp_path):
    # Negative control: a marker drawn at serve time but not in the record changes the pixels.
    processor = processors["default"]
    record = _stored_record(_short_prompt("critique"), "critique", tmp_path)
    train = _train_sample(processor, record, root)
    unmarked = replace(record, images=(ImageRef("current.png", size_class="desktop"),))
    *drifted, _ = record_messages(unmarked)
    serve = encode_sample(processor, _frames(drifted, root))
    assert torch.equal(serve.input_ids, train.input_ids[: serve.input_ids.shape[0]])
    assert not torch.equal(serve.pixel_values, train.pixel_values)
