"""TransformersBackend with the tiny random Qwen3-VL and with a scripted stand-in model."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from hivig.backends import (
    BackendBadRequest,
    BackendError,
    Generation,
    InferenceBackend,
    Sampling,
    request_hash,
)
from hivig.backends.transformers_backend import TransformersBackend
from hivig.messages import ChatMessage, ImagePart, ImageRef, TextPart
from hivig.models import qwen_vl
from hivig.tiny import synthetic_conversation, tiny_model, tiny_processor

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def processor():
    return tiny_processor()


@pytest.fixture(scope="module")
def model(processor):
    return tiny_model(processor, seed=0).eval()


@pytest.fixture(scope="module")
def messages():
    return synthetic_conversation(num_images=1, seed=3)[0]


class ScriptedModel(torch.nn.Module):
    """Stands in for a model: echoes the prompt, then emits fixed tokens."""

    def __init__(self, tokens: list[int], delay_s: float = 0.0) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.tokens = tokens
        self.delay_s = delay_s
        self.calls: list[dict] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def generate(self, input_ids, generation_config, **kwargs):
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.calls.append({"input_ids": input_ids, "config": generation_config, **kwargs})
        time.sleep(self.delay_s)
        with self._lock:
            self.active -= 1
        new = torch.tensor([self.tokens], dtype=input_ids.dtype)
        return torch.cat([input_ids, new], dim=1)


def _encode(processor, text: str) -> list[int]:
    return processor.tokenizer.encode(text, add_special_tokens=False)


def test_scripted_tokens_decode_split_and_count(processor, messages):
    answer = "<think>marker is on the button</think>\n\n<criticism>Good</criticism>"
    im_end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = processor.tokenizer.pad_token_id
    tokens = _encode(processor, answer) + [im_end, pad, pad]
    stub = ScriptedModel(tokens)
    backend = TransformersBackend(stub, processor, model_name="stub")
    assert isinstance(backend, InferenceBackend)
    sampling = Sampling(max_tokens=len(tokens))
    gen = asyncio.run(backend.generate(messages, sampling))

    assert isinstance(gen, Generation)
    assert gen.reasoning == "marker is on the button"
    assert gen.text == "<criticism>Good</criticism>"
    assert gen.finish_reason == "stop"
    # Counted like vLLM: answer tokens plus the end token, padding excluded.
    assert gen.usage.completion_tokens == len(tokens) - 2
    expected = qwen_vl.encode_sample(processor, messages)
    assert gen.usage.prompt_tokens == len(expected.input_ids)
    assert gen.request_hash == request_hash("stub", messages, sampling)
    # The prompt is the training encoder's, images included.
    call = stub.calls[0]
    assert torch.equal(call["input_ids"][0], expected.input_ids)
    assert torch.equal(call["pixel_values"], expected.pixel_values)
    assert torch.equal(call["image_grid_thw"], expected.image_grid_thw)
    assert call["config"].do_sample is False and call["config"].max_new_tokens == len(tokens)


def test_running_out_of_tokens_is_length(processor, messages):
    tokens = _encode(processor, "<think>still thinking")
    backend = TransformersBackend(ScriptedModel(tokens), processor, model_name="stub")
    gen = asyncio.run(backend.generate(messages, Sampling(max_tokens=len(tokens))))
    assert gen.finish_reason == "length" and gen.truncated
    assert (gen.reasoning, gen.text) == ("still thinking", "")


def test_sampling_parameters_reach_the_generation_config(processor, messages):
    stub = ScriptedModel(_encode(processor, "x"))
    backend = TransformersBackend(stub, processor)
    asyncio.run(backend.generate(messages, Sampling(temperature=0.7, top_p=0.8, max_tokens=5)))
    config = stub.calls[0]["config"]
    assert config.do_sample is True
    assert (config.temperature, config.top_p, config.max_new_tokens) == (0.7, 0.8, 5)


def test_generation_does_not_block_the_event_loop_and_is_serialised(processor, messages):
    stub = ScriptedModel(_encode(processor, "ok"), delay_s=0.3)
    backend = TransformersBackend(stub, processor)

    async def go():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.02)
                ticks += 1

        tick_task = asyncio.ensure_future(ticker())
        await asyncio.gather(
            *(backend.generate(messages, Sampling(max_tokens=2)) for _ in range(2))
        )
        tick_task.cancel()
        return ticks

    ticks = asyncio.run(go())
    # Two 0.3 s generations run one after the other while the loop keeps ticking.
    assert ticks >= 10
    assert stub.max_active == 1 and len(stub.calls) == 2


def test_unmaterialised_image_is_rejected_before_generation(processor):
    stub = ScriptedModel([1])
    backend = TransformersBackend(stub, processor)
    bad = [ChatMessage("user", [ImagePart(ImageRef("shot.png")), TextPart("x")])]
    with pytest.raises(BackendBadRequest, match="materialise") as err:
        asyncio.run(backend.generate(bad, Sampling()))
    assert err.value.reason == "bad_request"
    assert isinstance(err.value, BackendError)  # callers that fail open catch this
    assert stub.calls == []


def test_unencodable_text_is_a_backend_error(processor):
    stub = ScriptedModel([1])
    backend = TransformersBackend(stub, processor)
    bad = [ChatMessage("user", [TextPart("sneaky <|im_end|> token")])]
    with pytest.raises(BackendBadRequest):
        asyncio.run(backend.generate(bad, Sampling()))
    assert stub.calls == []


# --------------------------------------------------------------------------------------------
# The tiny random Qwen3-VL


def test_tiny_model_greedy_matches_direct_generate(model, processor, messages):
    backend = TransformersBackend(model, processor, model_name="tiny")
    sampling = Sampling(max_tokens=6)
    first = asyncio.run(backend.generate(messages, sampling))
    second = asyncio.run(backend.generate(messages, sampling))
    assert first.text == second.text and first.usage == second.usage
    assert first.model == "tiny" and first.usage.prompt_tokens > 0

    sample = qwen_vl.encode_sample(processor, messages)
    ids = sample.input_ids[None]
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            mm_token_type_ids=sample.mm_token_type_ids[None],
            pixel_values=sample.pixel_values,
            image_grid_thw=sample.image_grid_thw,
            do_sample=False,
            max_new_tokens=6,
            use_cache=True,
        )
    new = out[0, ids.shape[1] :].tolist()
    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    if eos in new:
        new = new[: new.index(eos)]
    assert first.text == processor.tokenizer.decode(new, skip_special_tokens=True)


def test_tiny_model_seeded_sampling_is_reproducible_and_isolated(model, processor, messages):
    backend = TransformersBackend(model, processor)
    state = torch.get_rng_state()
    a = asyncio.run(backend.generate(messages, Sampling(temperature=1.0, max_tokens=8, seed=1)))
    b = asyncio.run(backend.generate(messages, Sampling(temperature=1.0, max_tokens=8, seed=1)))
    c = asyncio.run(backend.generate(messages, Sampling(temperature=1.0, max_tokens=8, seed=2)))
    assert a.text == b.text
    # Negative control: another seed gives another sample (8 draws over ~270 tokens).
    assert a.text != c.text
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.gpu
def test_tiny_model_generates_on_gpu(processor, messages):
    gpu_model = tiny_model(processor, seed=0).eval().to("cuda")
    backend = TransformersBackend(gpu_model, processor)
    assert backend.device.type == "cuda"
    gen = asyncio.run(backend.generate(messages, Sampling(max_tokens=4)))
    again = asyncio.run(backend.generate(messages, Sampling(max_tokens=4)))
    assert gen.usage.completion_tokens > 0
    # Greedy decoding is repeatable on the device (CPU equality is not asserted: cuDNN may use
    # TF32 convolutions, and a random model's near-uniform logits can then tie-break apart).
    assert gen.text == again.text and gen.usage == again.usage


def test_build_backend_loads_a_checkpoint(tiny_checkpoint, messages):
    from hivig.backends import build_backend
    from hivig.config import BackendConfig, FrameConfig
    from hivig.tiny import TINY_MAX_PIXELS, TINY_MIN_PIXELS

    ckpt = tiny_checkpoint
    frame = FrameConfig(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)
    cfg = BackendConfig(kind="transformers", model=str(ckpt))
    backend = build_backend(cfg, frame=frame, device="cpu")
    assert isinstance(backend, TransformersBackend)
    assert backend.model.dtype == torch.float32 and backend.device.type == "cpu"
    gen = asyncio.run(backend.generate(messages, Sampling(max_tokens=3)))
    assert gen.model == str(ckpt) and gen.usage.completion_tokens > 0
