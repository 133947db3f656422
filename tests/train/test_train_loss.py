"""The loss path on the tiny Qwen3-VL: chunked CE, packed == unpacked, normalisation, guards."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hivig.models.qwen_vl import encode_sample
from hivig.tiny import synthetic_conversation, tiny_model, tiny_processor
from train.collate import collate_pack
from train.loss import CriticLoss, chunked_cross_entropy, normalise, supervised_positions

pytestmark = pytest.mark.invariant


@pytest.fixture(scope="module")
def processor():
    return tiny_processor()


@pytest.fixture(scope="module")
def samples(processor):
    # Mixed 1-3 images, different answers: the packing boundaries fall in different places.
    out = []
    for k, n_img in enumerate((1, 3, 2, 1)):
        messages, target = synthetic_conversation(n_img, seed=10 * k)
        out.append(encode_sample(processor, messages, target + " x" * (5 * k)))
    return out


@pytest.fixture()
def model(processor):
    torch.manual_seed(0)
    return tiny_model(processor, seed=0)


def _token_losses(loss: CriticLoss, batch) -> torch.Tensor:
    """Per-token CE at supervised positions, in row order (for exact comparisons)."""
    hidden = loss.hidden_states(batch.inputs)
    h, y = supervised_positions(hidden, batch.inputs["labels"])
    head = loss.model.lm_head
    return F.cross_entropy(head(h).float(), y, reduction="none")


def test_chunked_ce_equals_plain_ce_value_and_grad():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(37, 16, requires_grad=True)
    labels = torch.randint(0, 50, (37,))
    ref = F.cross_entropy(head(hidden).float(), labels, reduction="sum")
    g_ref = torch.autograd.grad(ref, [hidden, head.weight])
    got = chunked_cross_entropy(hidden, labels, head, chunk_tokens=8)  # 5 chunks, last partial
    g_got = torch.autograd.grad(got, [hidden, head.weight])
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-5)
    for a, b in zip(g_got, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_padded_chunk_count_keeps_the_value_and_counts_every_head_call():
    # ZeRO-3: ranks agree on the largest chunk count; extra calls run on zero rows.
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    calls = []
    head.register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    hidden = torch.randn(10, 16, requires_grad=True)
    labels = torch.randint(0, 50, (10,))
    ref = F.cross_entropy(head(hidden).float(), labels, reduction="sum")
    calls.clear()
    got = chunked_cross_entropy(hidden, labels, head, chunk_tokens=4, n_chunks=5)
    assert calls == [4, 4, 2, 0, 0]
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-5)
    got.backward()  # the recomputation in backward calls the head again, as often (reversed)
    assert calls[5:] == [0, 0, 2, 4, 4]
    empty = chunked_cross_entropy(hidden[:0], labels[:0], head, chunk_tokens=4, n_chunks=2)
    assert float(empty) == 0.0
    with pytest.raises(ValueError, match="n_chunks=2 < 3"):
        chunked_cross_entropy(hidden, labels, head, chunk_tokens=4, n_chunks=2)


def test_packed_equals_unpacked_per_token(model, samples):
    loss = CriticLoss(model, chunk_tokens=64).eval()
    with torch.no_grad():
        unpacked = torch.cat([_token_losses(loss, collate_pack([s])) for s in samples])
        packed = _token_losses(loss, collate_pack(samples))
        total, n = loss(collate_pack(samples).inputs)
    assert packed.shape == unpacked.shape
    torch.testing.assert_close(packed, unpacked, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(total, unpacked.sum(), rtol=1e-5, atol=1e-4)
    assert int(n) == sum(s.num_supervised for s in samples)


@pytest.mark.parametrize("break_it", ["three_rows", "no_positions"])
def test_negative_controls_change_the_packed_loss(model, samples, break_it):
    loss = CriticLoss(model).eval()
    batch = collate_pack(samples)
    with torch.no_grad():
        good, _ = loss(batch.inputs)
        inputs = dict(batch.inputs)
        if break_it == "three_rows":
            inputs["position_ids"] = inputs["position_ids"][1:]  # MRoPE rows only
        else:
            inputs["position_ids"] = None
            inputs["mm_token_type_ids"] = (inputs["input_ids"] == model.config.image_token_id).int()
        bad = _broken_loss(loss, inputs)
    assert not torch.isclose(good, bad, rtol=1e-4), "the packing test could not fail"


def _broken_loss(loss: CriticLoss, inputs) -> torch.Tensor:
    inner = loss.model.model
    out = inner(
        input_ids=inputs["input_ids"],
        pixel_values=inputs["pixel_values"],
        image_grid_thw=inputs["image_grid_thw"],
        position_ids=inputs["position_ids"],
        mm_token_type_ids=inputs.get("mm_token_type_ids"),
        attention_mask=None,
        use_cache=False,
    )
    h, y = supervised_positions(out.last_hidden_state, inputs["labels"])
    return chunked_cross_entropy(h, y, loss.model.lm_head)


def _grads_after(model, micro_batches, *, per_micro_mean: bool = False) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss = CriticLoss(model, chunk_tokens=128)
    n_global = sum(b.meta.supervised for b in micro_batches)
    for b in micro_batches:
        s, n = loss(b.inputs)
        # The rule with W = 1; the control is HF's mean of micro-batch means.
        scaled = s / n / len(micro_batches) if per_micro_mean else normalise(s, n_global, 1)
        scaled.backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
def test_accumulation_invariance_mb4_ga1_equals_mb1_ga4(model, samples):
    one_pack = _grads_after(model, [collate_pack(samples)])
    four_micro = _grads_after(model, [collate_pack([s]) for s in samples])
    assert one_pack.keys() == four_micro.keys() and one_pack
    for k in one_pack:
        torch.testing.assert_close(four_micro[k], one_pack[k], rtol=1e-4, atol=1e-6, msg=k)
    # Negative control: averaging per-micro-batch means weights short answers up.
    wrong = _grads_after(model, [collate_pack([s]) for s in samples], per_micro_mean=True)
    diff = max((wrong[k] - one_pack[k]).abs().max().item() for k in one_pack)
    assert diff > 1e-4


def test_data_parallel_scaling_two_ranks_simulated(model, samples):
    # Two ranks with two samples each: each backward uses × W / N, then DDP averages.
    ref = _grads_after(model, [collate_pack(samples)])
    n_global = sum(s.num_supervised for s in samples)
    loss = CriticLoss(model)
    per_rank = []
    for shard in (samples[:2], samples[2:]):
        model.zero_grad(set_to_none=True)
        s, _ = loss(collate_pack(shard).inputs)
        normalise(s, n_global, world=2).backward()
        per_rank.append(
            {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        )
    for k in ref:
        averaged = (per_rank[0][k] + per_rank[1][k]) / 2
        torch.testing.assert_close(averaged, ref[k], rtol=1e-4, atol=1e-6, msg=k)


def test_pack_without_images_still_runs_the_vit(model, processor):
    from hivig.messages import ChatMessage, TextPart

    messages = [ChatMessage("user", [TextPart("no screenshot here")])]
    sample = encode_sample(processor, messages, "<think>\nok\n</think>\n\n<summary>s</summary>")
    calls = []
    handle = model.model.visual.register_forward_hook(lambda *a: calls.append(1))
    try:
        CriticLoss(model, vit_guard=True)(collate_pack([sample]).inputs)
        assert calls, "the dummy ViT pass did not run"
        calls.clear()
        CriticLoss(model, vit_guard=False)(collate_pack([sample]).inputs)
        assert not calls
    finally:
        handle.remove()


def test_single_call_mode_and_empty_rows_call_the_head_exactly_once():
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    calls = []
    head.register_forward_hook(lambda *a: calls.append(1))
    hidden, labels = torch.randn(37, 16), torch.randint(0, 50, (37,))
    ref = F.cross_entropy(head(hidden), labels, reduction="sum")
    calls.clear()
    torch.testing.assert_close(chunked_cross_entropy(hidden, labels, head, chunk_tokens=0), ref)
    assert len(calls) == 1
    calls.clear()
    empty = chunked_cross_entropy(hidden[:0], labels[:0], head, chunk_tokens=8)
    assert float(empty) == 0.0 and len(calls) == 1  # ZeRO-3: same collectives on every rank
