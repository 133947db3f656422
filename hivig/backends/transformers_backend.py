"""In-process generation with a loaded Hugging Face vision-language model and its processor.

For CPU runs, a single GPU and tests with the tiny random model. Generation runs in a worker
thread (one at a time per backend) so ``await backend.generate(...)`` never blocks the event loop.

Example::

    backend = TransformersBackend(model, processor, model_name="tiny-qwen3-vl")
    gen = await backend.generate(messages, Sampling(max_tokens=64))
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import torch
from transformers import GenerationConfig

from hivig.backends.base import (
    Backend,
    BackendBadRequest,
    Generation,
    Sampling,
    Usage,
    split_reasoning,
)
from hivig.backends.base import request_hash as hash_request
from hivig.logging import get_logger
from hivig.messages import ChatMessage
from hivig.models import qwen_vl

logger = get_logger(__name__)


class TransformersBackend(Backend):
    """``InferenceBackend`` over ``model.generate``, prompts encoded as in training.

    The sampling parameters are passed as an explicit ``GenerationConfig``, so defaults stored
    in a checkpoint's ``generation_config.json`` never change decoding silently.
    """

    def __init__(
        self,
        model: Any,
        processor: Any,
        device: str | torch.device | None = None,
        *,
        model_name: str | None = None,
    ) -> None:
        """Wrap a loaded model.

        Args:
            model: A ``transformers`` generative model (already on its device, in eval mode or
                not; generation runs under ``torch.inference_mode``).
            processor: Its processor (chat template, tokenizer, image processor).
            device: Where inputs go; by default the device of the model's first parameter.
            model_name: Name recorded in results and request hashes; by default the model's
                ``name_or_path``.
        """
        self.model = model
        self.processor = processor
        self.device = torch.device(device) if device is not None else _model_device(model)
        name = model_name or getattr(getattr(model, "config", None), "_name_or_path", "")
        self.model_name = name or type(model).__name__
        self._lock = threading.Lock()

    async def generate(
        self, messages: list[ChatMessage], sampling: Sampling, *, request_hash: str | None = None
    ) -> Generation:
        """Generate one answer in a worker thread (``InferenceBackend.generate``).

        Returns:
            The answer with any ``<think>`` block split off.

        Raises:
            BackendBadRequest: The messages cannot be encoded (unmaterialised or non-canonical
                images, special-token strings in text, a trailing assistant turn, non-image
                payloads); callers that fail open on ``BackendError`` keep working.
        """
        try:
            rhash = request_hash or hash_request(self.model_name, messages, sampling)
        except TypeError as e:
            raise BackendBadRequest(f"cannot hash the request: {e}") from e
        return await asyncio.to_thread(self._generate_blocking, messages, sampling, rhash)

    async def aclose(self) -> None:
        """Nothing to release; present for symmetry with the HTTP client."""

    # ----------------------------------------------------------------------------------------

    def _generate_blocking(
        self, messages: list[ChatMessage], sampling: Sampling, rhash: str
    ) -> Generation:
        try:
            inputs = self._encode(messages)
        except (qwen_vl.EncodeError, TypeError) as e:
            raise BackendBadRequest(f"cannot encode the messages: {e}") from e
        prompt_len = int(inputs["input_ids"].shape[1])
        config = self._generation_config(sampling)
        extra: dict[str, Any] = {}
        if sampling.stop:
            extra["tokenizer"] = _tokenizer(self.processor)
        # One generation at a time: a model is not safe to share between concurrent forwards.
        with self._lock, torch.inference_mode():
            start = time.perf_counter()
            # fork_rng keeps a per-request seed from disturbing the caller's global RNG state.
            with torch.random.fork_rng(devices=_rng_devices(self.device)):
                if sampling.seed is not None:
                    torch.manual_seed(sampling.seed)
                out = self.model.generate(**inputs, generation_config=config, **extra)
            latency = time.perf_counter() - start
        new_ids = out[0, prompt_len:].tolist()
        new_ids, finish, generated = _trim(new_ids, _eos_ids(config), sampling.max_tokens)
        raw = _tokenizer(self.processor).decode(new_ids, skip_special_tokens=True)
        reasoning, text = split_reasoning(raw)
        return Generation(
            text=text,
            reasoning=reasoning,
            usage=Usage(prompt_tokens=prompt_len, completion_tokens=generated),
            finish_reason=finish,
            model=self.model_name,
            sampling=sampling,
            request_hash=rhash,
            latency_s=latency,
        )

    def _encode(self, messages: list[ChatMessage]) -> dict[str, Any]:
        # The same encoder as training, so the served prompt is the trained prompt token for
        # token up to the first generated token.
        sample = qwen_vl.encode_sample(self.processor, messages)
        ids = sample.input_ids[None]
        inputs: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "mm_token_type_ids": sample.mm_token_type_ids[None],
        }
        if sample.pixel_values is not None:
            inputs["pixel_values"] = sample.pixel_values
            inputs["image_grid_thw"] = sample.image_grid_thw
        return {k: v.to(self.device) for k, v in inputs.items()}

    def _generation_config(self, sampling: Sampling) -> GenerationConfig:
        base = getattr(self.model, "generation_config", None)
        tokenizer = _tokenizer(self.processor)
        eos = getattr(base, "eos_token_id", None)
        if eos is None:
            eos = tokenizer.eos_token_id
        pad = getattr(base, "pad_token_id", None)
        if pad is None:
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
        fields: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "do_sample": not sampling.greedy,
            # Training checkpoints may disable the KV cache; generation always wants it.
            "use_cache": True,
            "eos_token_id": eos,
            "pad_token_id": pad if not isinstance(pad, list) else pad[0],
        }
        if not sampling.greedy:
            fields.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        if sampling.stop:
            fields["stop_strings"] = list(sampling.stop)
        return GenerationConfig(**fields)


def _tokenizer(processor: Any) -> Any:
    return getattr(processor, "tokenizer", processor)


def _model_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def _rng_devices(device: torch.device) -> list[int]:
    if device.type == "cuda":
        return [device.index if device.index is not None else torch.cuda.current_device()]
    return []


def _eos_ids(config: GenerationConfig) -> set[int]:
    eos = config.eos_token_id
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}


def _trim(ids: list[int], eos: set[int], max_tokens: int) -> tuple[list[int], str, int]:
    """Cut at the first end-of-sequence token.

    Returns:
        ``(answer ids, finish reason, tokens generated)``; like vLLM, the count includes the
        end-of-sequence token and excludes padding after it.
    """
    for i, tok in enumerate(ids):
        if tok in eos:
            return ids[:i], "stop", i + 1
    return ids, "length" if len(ids) >= max_tokens else "stop", len(ids)
