"""Train/serve parity: a stored record and a serving request meet the model as the same tokens.

The training side goes builder → ``SFTRecord`` → Parquet → ``record_messages`` → ``materialise`` →
``encode_sample(..., target)``; the serving side goes builder → ``materialise`` →
``encode_sample(...)`` without a target. Up to the first generated token both must be identical:
prompt ids, positions, pixels and grids.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from hivig.actions import action_from_arguments, marks_for_actions
from hivig.media import ImageRef
from hivig.models.qwen_vl import IGNORE_INDEX, encode_sample, render_prompt
from hivig.prompts import build_critique_messages, build_history_messages, format_step
from hivig.records import Labels, read_records, record_from_messages, record_messages, write_records
from hivig.testing import synthetic_screenshot, tiny_model, tiny_processor
from hivig.vision import materialise, smart_resize

MIN_PIXELS, MAX_PIXELS = 1024, 65_536
TASK, PLATFORM = "Save the report as PDF", "windows"
SHOTS = {"before.png": (320, 200), "after.png": (300, 180), "current.png": (256, 160)}
TARGETS = {
    "critique": (
        "<think>\nAction String Check: the call is valid; the X sits on Save.\n\n"
        "The dialog will close.\n\nThis moves the task forward.\n</think>\n\n"
        "<criticism>\nOverall Grading: Good\nExplanation: Save writes the file.\n</criticism>"
    ),
    "history": (
        "<think>\nThe second screenshot shows the saved file.\n</think>\n\n"
        "<summary>\nProgress Summary: the report is open.\n"
        "Last Action Result: the click opened the Save dialog.\n</summary>"
    ),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shots")
    for k, (name, (w, h)) in enumerate(SHOTS.items()):
        synthetic_screenshot(w, h, seed=k).save(folder / name)
    return folder


def _step():
    action = action_from_arguments({"action": "left_click", "coordinate": [500, 540]})
    return format_step("Click Save", [action], "computer_use"), tuple(marks_for_actions([action]))


def _prompt(kind):
    """What data_gen stores and what serve builds from a live request: the same builder call."""
    step, marks = _step()
    if kind == "critique":
        shot = ImageRef("current.png", marks=marks, size_class="desktop")
        return build_critique_messages(TASK, PLATFORM, "", shot, step)
    return build_history_messages(
        TASK, PLATFORM, "Nothing yet.", ImageRef("before.png"), ImageRef("after.png"), step
    )


def _stored_record(kind, tmp_path):
    messages = _prompt(kind)
    labels = Labels(verdict="Good") if kind == "critique" else Labels()
    record = record_from_messages(
        messages,
        TARGETS[kind],
        id=f"rec-{kind}",
        kind=kind,
        platform=PLATFORM,
        prompt_version=messages.prompt_id,
        trajectory_id="traj-0",
        episode_key="ep-0",
        step_index=1,
        split="train",
        labels=labels,
    )
    write_records([record], tmp_path / kind)
    (back,) = read_records(tmp_path / kind)
    assert back == record
    return back


def _frames(messages, root):
    return materialise(messages, root, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["critique", "history"])
def test_record_and_serving_request_encode_identically(kind, root, tmp_path):
    processor = tiny_processor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    record = _stored_record(kind, tmp_path)

    # Training side.
    *prompt, answer = record_messages(record)
    assert answer.role == "assistant"
    train = encode_sample(processor, _frames(prompt, root), answer.text())

    # Image tokens equal the canonical grids.
    sizes = [SHOTS[ref.path] for ref in record.images]
    grids = [
        (1, h // 16, w // 16)
        for h, w in (smart_resize(h, w, 32, MIN_PIXELS, MAX_PIXELS) for w, h in sizes)
    ]
    assert [tuple(g) for g in train.image_grid_thw.tolist()] == grids
    assert train.num_image_tokens == sum(t * h * w for t, h, w in grids) // 4

    # Labels cover exactly the answer plus <|im_end|>.
    kept = train.labels[train.labels != IGNORE_INDEX].tolist()
    assert processor.tokenizer.decode(kept) == TARGETS[kind] + "<|im_end|>"
    assert (train.labels[: train.prompt_length - 1] == IGNORE_INDEX).all()

    # The loss is finite on the tiny model (the critic system prompt is ~6k byte tokens).
    model = tiny_model(processor).eval()
    with torch.no_grad():
        logits = model(**train.model_inputs()).logits[0]
    loss = F.cross_entropy(logits, train.labels, ignore_index=IGNORE_INDEX, reduction="sum")
    assert torch.isfinite(loss) and loss.item() > 0

    # Serving side: the same builder call, no target, generation prompt.
    live = _frames(_prompt(kind), root)
    assert render_prompt(processor, live) == render_prompt(processor, _frames(prompt, root))
    serve = encode_sample(processor, live)
    n = serve.input_ids.shape[0]
    assert n == train.prompt_length
    assert torch.equal(serve.input_ids, train.input_ids[:n])
    assert torch.equal(serve.position_ids, train.position_ids[:, :n])
    assert torch.equal(serve.pixel_values, train.pixel_values)
    assert torch.equal(serve.image_grid_thw, train.image_grid_thw)
    header = processor.tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert serve.input_ids[-len(header) :].tolist() == header


def test_parity_check_detects_a_drift(root, tmp_path):
    # Negative control: a marker drawn at serve time but not in the record changes the pixels.
    processor = tiny_processor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    record = _stored_record("critique", tmp_path)
    *prompt, answer = record_messages(record)
    train = encode_sample(processor, _frames(prompt, root), answer.text())
    unmarked = replace(record, images=(ImageRef("current.png", size_class="desktop"),))
    *drifted, _ = record_messages(unmarked)
    serve = encode_sample(processor, _frames(drifted, root))
    assert torch.equal(serve.input_ids, train.input_ids[: serve.input_ids.shape[0]])
    assert not torch.equal(serve.pixel_values, train.pixel_values)
