"""Inference backends: one protocol, an OpenAI-compatible HTTP client, in-process transformers.

``build_backend(cfg.backend)`` is the one place a ``BackendConfig`` becomes an object; the
classes themselves take plain arguments. Images are encoded (PNG data URL) and hashed once per
PIL image object and reused while it lives (``ImagePayloadCache``), so hand the same frame object
to every request that shows it and do not edit its pixels in place afterwards.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from hivig.backends.base import (
    Backend,
    BackendBadRequest,
    BackendBadResponse,
    BackendError,
    BackendErrorBody,
    BackendHTTPError,
    BackendTimeout,
    BackendTransportError,
    ErrorReason,
    Generation,
    InferenceBackend,
    PreparesImages,
    RetriesExhausted,
    Sampling,
    SyncBackend,
    Usage,
    backend_cancellable,
    backend_model_name,
    backend_png_payloads,
    close_backend,
    content_hash,
    generate_many,
    image_digest,
    messages_skeleton,
    png_bytes,
    request_hash,
    split_reasoning,
)
from hivig.backends.images import ImageCacheStats, ImagePayloadCache, default_image_cache
from hivig.backends.openai_client import ClientStats, OpenAIClient, parse_chat_completion
from hivig.config import BackendConfig, ConfigError, FrameConfig, SamplingConfig

if TYPE_CHECKING:
    import torch


def sampling_from_config(cfg: SamplingConfig) -> Sampling:
    """The ``Sampling`` a ``SamplingConfig`` describes."""
    return Sampling(
        temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens, seed=cfg.seed
    )


def build_backend(
    cfg: BackendConfig,
    *,
    frame: FrameConfig | None = None,
    offline: InferenceBackend | None = None,
    device: str | None = None,
    dtype: torch.dtype | None = None,
    chat_template: str | None = None,
) -> InferenceBackend:
    """Build the backend a ``BackendConfig`` describes.

    Args:
        cfg: The backend config. ``openai`` reads its API key from the environment variable
            named by ``cfg.api_key_env``; ``transformers`` loads ``cfg.model`` (a checkpoint
            directory) with ``hivig.models.qwen_vl``.
        frame: Pixel budget of the processor (``transformers`` kind); the defaults otherwise.
        offline: The backend to return for ``kind: offline`` (offline backends answer from
            stage-specific rules, so the stage provides them).
        device: Device for the ``transformers`` kind; CUDA when available, else CPU.
        dtype: Parameter dtype for the ``transformers`` kind; bf16 on CUDA, fp32 on CPU.
        chat_template: The chat template of the critic profile served (``transformers`` kind);
            ``None``: the checkpoint's own when it is one of hivig's, else hivig's default.

    Returns:
        An ``InferenceBackend``.

    Raises:
        ConfigError: A field the chosen kind needs is missing.
    """
    if cfg.kind == "openai":
        if not cfg.base_url or not cfg.model:
            raise ConfigError("`backend.base_url` and `backend.model` are required for kind openai")
        return OpenAIClient(
            cfg.base_url,
            cfg.model,
            api_key=os.environ.get(cfg.api_key_env) or None,
            concurrency=cfg.concurrency,
            timeout_s=cfg.timeout_s,
            max_retries=cfg.max_retries,
            backoff_s=cfg.backoff_s,
            max_response_bytes=cfg.max_response_bytes or None,
        )
    if cfg.kind == "transformers":
        if not cfg.model:
            raise ConfigError("`backend.model` must name a checkpoint for kind transformers")
        return _load_transformers_backend(
            cfg.model, frame or FrameConfig(), device, dtype, chat_template
        )
    if offline is None:
        raise ConfigError("`backend.kind` offline needs the stage's offline backend (offline=...)")
    return offline


def _load_transformers_backend(
    checkpoint: str,
    frame: FrameConfig,
    device: str | None,
    dtype: torch.dtype | None,
    chat_template: str | None = None,
) -> InferenceBackend:
    # Imported here: only the transformers kind needs torch and the model code, and HTTP-only
    # users should not pay for importing them.
    import torch

    from hivig.backends.transformers_backend import TransformersBackend
    from hivig.models import qwen_vl

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    processor = qwen_vl.build_processor(
        checkpoint,
        min_pixels=frame.min_pixels,
        max_pixels=frame.max_pixels,
        chat_template=chat_template,
    )
    model = qwen_vl.load_model(checkpoint, dtype=dtype, attn_implementation="sdpa", use_cache=True)
    return TransformersBackend(model.to(device).eval(), processor, model_name=checkpoint)


def __getattr__(name: str) -> object:
    # ``TransformersBackend`` loads on first use: importing transformers takes seconds, which
    # HTTP-only users should not pay.
    if name == "TransformersBackend":
        from hivig.backends.transformers_backend import TransformersBackend

        return TransformersBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Backend",
    "BackendBadRequest",
    "BackendBadResponse",
    "BackendError",
    "BackendErrorBody",
    "BackendHTTPError",
    "BackendTimeout",
    "BackendTransportError",
    "ClientStats",
    "ErrorReason",
    "Generation",
    "ImageCacheStats",
    "ImagePayloadCache",
    "InferenceBackend",
    "PreparesImages",
    "OpenAIClient",
    "RetriesExhausted",
    "Sampling",
    "SyncBackend",
    "TransformersBackend",
    "Usage",
    "backend_cancellable",
    "backend_model_name",
    "backend_png_payloads",
    "build_backend",
    "close_backend",
    "default_image_cache",
    "generate_many",
    "image_digest",
    "parse_chat_completion",
    "png_bytes",
    "content_hash",
    "messages_skeleton",
    "request_hash",
    "sampling_from_config",
    "split_reasoning",
]
