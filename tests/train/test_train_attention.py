"""Attention backends: the flex packed path (no extra package, no dense L×L mask), checks."""

from __future__ import annotations

import time

import pytest
import torch

from hivig.models import qwen_vl
from hivig.models._attention import flex_packed_attention
from hivig.tiny import synthetic_conversation, tiny_model, tiny_processor
from train.loss import CriticLoss


@pytest.fixture(scope="module")
def processor():
    return tiny_processor()


@pytest.fixture(scope="module")
def samples(processor):
    # Three samples of different lengths and 1-3 images each: the row crosses sample
    # boundaries inside tiles, and tiles that are wholly inside one sample exist too.
    return [
        qwen_vl.encode_sample(processor, *synthetic_conversation(k + 1, seed=7 * k))
        for k in range(3)
    ]


def _to_cuda(sample):
    from dataclasses import replace

    fields = ("input_ids", "labels", "position_ids", "pixel_values", "image_grid_thw")
    return replace(sample, **{f: getattr(sample, f).cuda() for f in fields})


def _packed(samples):
    return {
        "input_ids": torch.cat([s.input_ids for s in samples])[None],
        "labels": torch.cat([s.labels for s in samples])[None],
        "position_ids": torch.cat([s.position_ids for s in samples], dim=1)[:, None],
        "pixel_values": torch.cat([s.pixel_values for s in samples]),
        "image_grid_thw": torch.cat([s.image_grid_thw for s in samples]),
    }


def _per_sample_reference(model, samples):
    """Each sample alone through SDPA: what packing must reproduce."""
    hidden, loss = [], torch.zeros(())
    qwen_vl.set_attention(model, "sdpa")
    module = CriticLoss(model, chunk_tokens=16)
    for s in samples:
        batch = _packed([s])
        hidden.append(module.hidden_states(batch)[0])
        loss = loss + module(batch)[0]
    return torch.cat(hidden), loss


@pytest.mark.invariant
@pytest.mark.parametrize("block_size", [16, 128])
def test_flex_packed_row_equals_per_sample_reference(processor, samples, block_size, monkeypatch):
    model = tiny_model(processor, seed=3).eval()
    with torch.no_grad():
        ref_hidden, ref_loss = _per_sample_reference(model, samples)
        qwen_vl.set_attention(model, "flex")
        module = CriticLoss(model, chunk_tokens=16)
        batch = _packed(samples)
        masks = []
        original = qwen_vl.packed_block_mask

        def spy(lengths, **kw):
            masks.append(original(lengths, block_size=block_size, **kw))
            return masks[-1]

        monkeypatch.setattr("hivig.models._attention.packed_block_mask", spy)
        hidden = module.hidden_states(batch)[0]
        loss = module(batch)[0]
    assert masks, "the flex backend did not build its block mask"
    assert (block_size, block_size) == masks[0].BLOCK_SIZE
    torch.testing.assert_close(hidden, ref_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex has no CPU backward; needs CUDA")
def test_flex_gradients_equal_the_per_sample_reference(processor, samples):
    ref_model = tiny_model(processor, seed=5).cuda()
    cuda = [_to_cuda(s) for s in samples]
    _, ref_loss = _per_sample_reference(ref_model, cuda)
    ref_loss.backward()
    model = tiny_model(processor, seed=5).cuda()
    qwen_vl.set_attention(model, "flex")
    loss, _ = CriticLoss(model, chunk_tokens=16)(_packed(cuda))
    loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        if p.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_negative_control_a_plain_causal_mask_lets_samples_see_each_other(processor, samples):
    from torch.nn.attention.flex_attention import create_block_mask

    model = tiny_model(processor, seed=3).eval()
    qwen_vl.set_attention(model, "flex")
    batch = _packed(samples)
    length = batch["input_ids"].shape[1]
    causal = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, length, length, device="cpu")
    inner = model.model
    with torch.no_grad():
        ref = inner(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False,
                    attention_mask=qwen_vl.packed_block_mask(qwen_vl.sample_lengths(
                        batch["position_ids"][0]))).last_hidden_state  # fmt: skip
        wrong = inner(**{k: v for k, v in batch.items() if k != "labels"}, use_cache=False,
                      attention_mask=causal).last_hidden_state  # fmt: skip
    first = samples[0].input_ids.numel()
    # The first sample sees only itself either way; later ones differ under the wrong mask.
    torch.testing.assert_close(wrong[0, :first], ref[0, :first], rtol=1e-5, atol=1e-5)
    assert (wrong[0, first:] - ref[0, first:]).abs().max() > 1e-3


def _dense_reference(lengths):
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    q, kv = torch.arange(doc.numel())[:, None], torch.arange(doc.numel())[None, :]
    return (doc[:, None] == doc[None, :]) & (kv <= q)


@pytest.mark.parametrize(
    "lengths", [[5], [16, 16], [7, 30, 3, 41], [1, 1, 1], [40, 9], [16, 48, 17]]
)
def test_block_mask_tiles_match_a_dense_per_sample_causal_mask(lengths):
    block = 8
    mask = qwen_vl.packed_block_mask(lengths, block_size=block)
    dense = _dense_reference(lengths)
    total = dense.shape[0]
    n = -(-total // block)
    padded = torch.zeros(n * block, n * block, dtype=torch.bool)
    padded[:total, :total] = dense
    tiles = padded.reshape(n, block, n, block).permute(0, 2, 1, 3)
    any_on, all_on = tiles.flatten(2).any(-1), tiles.flatten(2).all(-1)

    def chosen(num, idx):
        out = torch.zeros(n, n, dtype=torch.bool)
        for row in range(n):
            out[row, idx[0, 0, row, : num[0, 0, row]].long()] = True
        return out

    partial = chosen(mask.kv_num_blocks, mask.kv_indices)
    full = chosen(mask.full_kv_num_blocks, mask.full_kv_indices)
    assert not (partial & full).any()
    # Every tile with an allowed pair is visited; a full tile has only allowed pairs.
    assert torch.equal(partial | full, any_on)
    assert not (full & ~all_on).any()
    # mask_mod decides inside partial tiles: it must equal the dense rule element-wise.
    q, kv = torch.arange(total)[:, None], torch.arange(total)[None, :]
    assert torch.equal(mask.mask_mod(0, 0, q, kv), dense)


def test_block_mask_of_a_quarter_million_tokens_builds_without_a_dense_mask():
    # A dense L×L boolean mask at 262,144 tokens is 64 GiB (a bf16 bias 128 GiB): more memory
    # than this machine has. The block mask holds (L/128)² tile entries.
    lengths = [100_000, 100_000, 62_144]
    start = time.perf_counter()
    mask = qwen_vl.packed_block_mask(lengths)
    elapsed = time.perf_counter() - start
    n = -(-sum(lengths) // 128)
    assert mask.kv_indices.shape == (1, 1, n, n)
    assert mask.shape == (1, 1, sum(lengths), sum(lengths))
    tensors = [mask.kv_num_blocks, mask.kv_indices, mask.full_kv_num_blocks, mask.full_kv_indices]
    assert sum(t.numel() * t.element_size() for t in tensors) < 2 * 4 * n * n + 4 * 4 * n
    assert elapsed < 30
    # Causal tiles inside three samples: about half of the within-sample tiles are visited.
    visited = int(mask.kv_num_blocks.sum() + mask.full_kv_num_blocks.sum())
    within = sum((-(-s // 128)) ** 2 for s in lengths)
    assert visited < 0.6 * within


def test_sample_lengths_from_position_row_zero():
    row = torch.tensor([0, 1, 2, 0, 1, 0, 1, 2, 3])
    assert qwen_vl.sample_lengths(row) == [3, 2, 4]
    with pytest.raises(ValueError):
        qwen_vl.sample_lengths(torch.tensor([1, 2, 0]))


def test_unpacked_calls_of_the_flex_backend_use_sdpa(processor):
    # Generation passes a dense (or no) mask: the registered function must give SDPA's answer.
    model = tiny_model(processor, seed=1).eval()
    messages, _ = synthetic_conversation(1)
    prompt = qwen_vl.encode_sample(processor, messages)
    inputs = prompt.model_inputs()
    inputs.pop("position_ids")
    with torch.no_grad():
        ref = model.generate(**inputs, max_new_tokens=5, do_sample=False, use_cache=True)
        qwen_vl.set_attention(model, "flex")
        got = model.generate(**inputs, max_new_tokens=5, do_sample=False, use_cache=True)
    assert torch.equal(got, ref)
    # And the vision tower stays on SDPA, one call per image.
    assert model.config.vision_config._attn_implementation == "sdpa"
    assert qwen_vl.attention_backend_of(model) == "flex"


def test_flex_attention_rejects_dropout_on_packed_rows():
    mask = qwen_vl.packed_block_mask([4, 4], block_size=4)
    q = torch.zeros(1, 2, 8, 4)
    with pytest.raises(ValueError, match="dropout"):
        flex_packed_attention(torch.nn.Module(), q, q, q, mask, dropout=0.1)


def test_resolve_attention_names_the_backend_and_refuses_missing_packages(monkeypatch):
    monkeypatch.setattr("hivig.models._attention.flash_attn_available", lambda: False)
    assert qwen_vl.resolve_attention("auto", cuda=True) == "flex"
    assert qwen_vl.resolve_attention("auto", cuda=False) == "sdpa"
    assert qwen_vl.resolve_attention("sdpa", cuda=True) == "sdpa"
    with pytest.raises(qwen_vl.AttentionBackendError, match=r"hivig\[flash-attn\]"):
        qwen_vl.resolve_attention("flash_attention_2", cuda=True)
    with pytest.raises(qwen_vl.AttentionBackendError, match="must be one of"):
        qwen_vl.resolve_attention("flash_attention_3", cuda=True)
    monkeypatch.setattr("hivig.models._attention.flash_attn_available", lambda: True)
    assert qwen_vl.resolve_attention("auto", cuda=True) == "flash_attention_2"
    assert qwen_vl.resolve_attention("auto", cuda=False) == "sdpa"
    with pytest.raises(qwen_vl.AttentionBackendError, match="CUDA"):
        qwen_vl.resolve_attention("flash_attention_2", cuda=False)
    monkeypatch.setattr("hivig.models._attention.flex_available", lambda: False)
    with pytest.raises(qwen_vl.AttentionBackendError, match="torch >= 2.5"):
        qwen_vl.resolve_attention("flex", cuda=True)


def test_flex_training_on_cpu_is_refused_with_the_alternative():
    with pytest.raises(qwen_vl.AttentionBackendError, match="no backward pass on CPU"):
        qwen_vl.resolve_attention("flex", cuda=False)
    assert qwen_vl.resolve_attention("flex", cuda=False, training=False) == "flex"
