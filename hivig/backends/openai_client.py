"""Async client for OpenAI-compatible chat completion servers (vLLM, SGLang).

Pooled ``httpx`` transports per event loop, a slot queue bounding requests in progress,
a total per-attempt timeout, and bounded retries with exponential backoff and full jitter on
transport errors, timeouts, 429 and 5xx (``Retry-After`` honoured, capped). Other 4xx answers and
malformed bodies fail at once with a typed ``BackendError``.

Images are encoded (lossless PNG by default; ``image_format="jpeg"`` trades exact pixels for
4-6x less encoding CPU, not fewer bytes at high quality, for callers that only need the model to
read the screen) and hashed once per PIL image object (``hivig.backends.images``); a
request whose images are all cached is spliced from ready-made bytes on the event loop, costing
well under a millisecond, and only requests with a new image go to a worker thread.

Example::

    client = OpenAIClient("http://gpu-node:8000/v1", "hivig-critic-8b", concurrency=32)
    gen = await client.generate(messages, Sampling(temperature=0.0, max_tokens=512))
    gen.text, gen.reasoning, gen.usage.completion_tokens
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import json
import math
import random
import ssl
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import httpx

from hivig import jsonio
from hivig.backends.base import (
    Backend,
    BackendBadResponse,
    BackendError,
    BackendErrorBody,
    BackendHTTPError,
    BackendTimeout,
    BackendTransportError,
    Generation,
    RetriesExhausted,
    Sampling,
    Usage,
    generate_many,
    request_hash,
    split_reasoning,
)
from hivig.backends.images import (
    ImageFormat,
    ImagePayloadCache,
    check_transport,
    default_image_cache,
)
from hivig.logging import get_logger
from hivig.messages import ChatMessage, ImagePart, TextPart

logger = get_logger(__name__)


@dataclass
class ClientStats:
    """Cumulative counters of one client.

    Attributes:
        requests: ``generate`` calls started.
        succeeded: Calls that returned a ``Generation``.
        failed: Calls that raised a ``BackendError``.
        attempts: HTTP attempts (first tries plus retries).
        retries: Attempts after the first of a call.
        prompt_tokens: Prompt tokens reported by the server, summed over successes.
        completion_tokens: Completion tokens reported by the server, summed over successes.
        failures: Failed calls per ``BackendError.reason``.
    """

    requests: int = 0
    succeeded: int = 0
    failed: int = 0
    attempts: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """Plain-dict copy (for logs and summary tables)."""
        return asdict(self)


class OpenAIClient(Backend):
    """``InferenceBackend`` over HTTP ``POST {base_url}/chat/completions``.

    The client binds to the first event loop that uses it (pooled connections cannot move
    between loops); once that loop is closed a later loop gets a fresh pool.
    """

    cancellable = True
    """Cancelling a ``generate`` call ends its HTTP request (nothing keeps computing here)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        concurrency: int = 32,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_retry_after_s: float = 60.0,
        headers: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        image_format: ImageFormat = "png",
        jpeg_quality: int = 95,
        max_response_bytes: int | None = None,
    ) -> None:
        """Configure the client; no connection is made until the first request.

        Args:
            base_url: Endpoint root, e.g. ``http://host:8000/v1``.
            model: Served model name sent in every request.
            api_key: Bearer token, if the server wants one.
            concurrency: Maximum requests in progress (also the connection-pool size).
            timeout_s: Total time allowed for one attempt (connect, send, wait, read), seconds.
            connect_timeout_s: Connect-phase timeout, seconds (capped by ``timeout_s``).
            max_retries: Retries after the first attempt for retryable failures.
            backoff_s: Base of the exponential backoff, seconds; the cap doubles per retry and
                the actual sleep is uniform in [0, cap] (full jitter).
            max_backoff_s: Upper bound of the backoff cap, seconds.
            max_retry_after_s: Upper bound on a server's ``Retry-After``, seconds.
            headers: Extra HTTP headers.
            rng: Random source of the jitter (a fresh unseeded one by default).
            image_format: How images travel: ``png`` (lossless, the default: the critic must
                see exactly the training pixels) or ``jpeg``. The request hash is over pixels
                either way, so caches keyed on it do not depend on the format.
            jpeg_quality: JPEG quality (1-100) when ``image_format`` is ``jpeg``.
            max_response_bytes: Largest answer body read, in bytes; a longer one is a
                ``bad_response`` (not retried). ``None`` sizes it per request from the token cap
                (``response_limit``).

        Raises:
            ValueError: A limit is out of range, the URL or model is empty, or the image
                format or JPEG quality is invalid.
        """
        _check_args(base_url, model, concurrency, timeout_s, max_retries, backoff_s)
        if max_response_bytes is not None and max_response_bytes <= 0:
            raise ValueError(f"max_response_bytes must be positive, got {max_response_bytes}")
        self.max_response_bytes = max_response_bytes
        check_transport(image_format, jpeg_quality)
        self.image_format: ImageFormat = image_format
        self.jpeg_quality = jpeg_quality
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.stats = ClientStats()
        self._url = f"{self.base_url}/chat/completions"
        self._headers = {
            "content-type": "application/json",
            "user-agent": "hivig-openai-client",
            **dict(headers or {}),
        }
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._timeout = httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s))
        self._extensions = {"timeout": self._timeout.as_dict()}
        self._rng = rng or random.Random()
        self._pools: _PoolSet | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ----------------------------------------------------------------------------------------
    # Public API

    async def generate(
        self, messages: list[ChatMessage], sampling: Sampling, *, request_hash: str | None = None
    ) -> Generation:
        """Send one chat completion request, retrying as configured (``InferenceBackend``).

        Returns:
            The answer, with reasoning taken from ``reasoning_content``/``reasoning`` or split
            off an inline ``<think>`` block.

        Raises:
            BackendError: ``timeout``, ``http_status``, ``transport`` or ``bad_response`` for a
                failure that was not retried (or ``max_retries`` is 0), ``retries_exhausted``
                after ``max_retries + 1`` failed attempts.
            TypeError: A message holds something other than text and PIL images.
        """
        pools = self._bind()
        self.stats.requests += 1
        try:
            # The slot covers encoding, attempts and backoff, so at most `concurrency` requests
            # hold encoded images in memory and an overloaded server sees its load drop.
            async with pools.slot() as http:
                body, rhash = await encode_request(
                    self.model,
                    messages,
                    sampling,
                    self.image_format,
                    self.jpeg_quality,
                    request_hash,
                )
                start = time.perf_counter()
                limit = self.max_response_bytes or response_limit(sampling.max_tokens)
                data, attempts = await self._post_with_retries(http, body, limit)
                text, reasoning, finish, usage, model = parse_chat_completion(data, attempts)
                latency = time.perf_counter() - start
        except BackendError as e:
            self.stats.failed += 1
            self.stats.failures[e.reason] = self.stats.failures.get(e.reason, 0) + 1
            raise
        self.stats.succeeded += 1
        self.stats.prompt_tokens += usage.prompt_tokens
        self.stats.completion_tokens += usage.completion_tokens
        return Generation(
            text=text,
            reasoning=reasoning,
            usage=usage,
            finish_reason=finish,
            model=model or self.model,
            sampling=sampling,
            request_hash=rhash,
            latency_s=latency,
            attempts=attempts,
        )

    @property
    def model_name(self) -> str:  # type: ignore[override]
        """The served model name sent with every request."""
        return self.model

    @property
    def png_payloads(self) -> ImagePayloadCache | None:
        """The payload cache this client's PNG image parts come from; ``None`` for JPEGs.

        A caller that encodes a frame as PNG anyway, at the cache's level, can hand the bytes
        over (``ImagePayloadCache.prime_png``) so the frame is not encoded again.
        """
        return default_image_cache() if self.image_format == "png" else None

    def prepare_images(self, messages: Sequence[ChatMessage], *, digests: bool = True) -> None:
        """Encode the messages' images ahead of ``generate`` (``PreparesImages``).

        Blocking CPU work, safe from any thread: a caller that prepares its next requests in
        worker threads while earlier ones wait on the network keeps that work out of the request
        slot, and ``generate`` then only splices the cached parts into the body.

        Args:
            messages: The chat; image parts hold PIL images.
            digests: Also compute the pixel digests ``request_hash`` needs; a caller that will
                pass its own ``request_hash`` to ``generate`` skips them (≈ 3 ms per 1 MP frame).

        Raises:
            TypeError: A part is neither text nor a PIL image.
        """
        cache = default_image_cache()
        for image in _images_of(messages):
            cache.image_part(image, self.image_format, self.jpeg_quality)
            if digests:
                cache.digest(image)

    async def generate_many(
        self,
        requests: Sequence[tuple[list[ChatMessage], Sampling]],
        *,
        return_exceptions: bool = False,
    ) -> list[Generation | BackendError]:
        """Run many requests with at most ``concurrency`` in progress.

        Args:
            requests: ``(messages, sampling)`` pairs.
            return_exceptions: Return each ``BackendError`` in its slot instead of raising.

        Returns:
            One result per request, in order.
        """
        return await generate_many(self, requests, return_exceptions=return_exceptions)

    async def aclose(self) -> None:
        """Close the connection pool (the client may be used again afterwards)."""
        # Pools of a finished loop cannot be closed from this one; their sockets went with it.
        if self._pools is not None and self._loop is asyncio.get_running_loop():
            await self._pools.aclose()
        self._pools = None
        self._loop = None

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ----------------------------------------------------------------------------------------
    # Internals

    def _bind(self) -> _PoolSet:
        loop = asyncio.get_running_loop()
        if self._pools is not None and self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                raise RuntimeError(
                    "OpenAIClient is in use on another event loop; create one client per loop"
                )
            # The old loop is gone and its sockets with it; start a fresh pool.
            self._pools = None
        if self._pools is None:
            self._pools = _PoolSet(self.concurrency)
            self._loop = loop
        return self._pools

    async def _post_with_retries(
        self, http: httpx.AsyncHTTPTransport, body: bytes, limit: int
    ) -> tuple[Any, int]:
        attempt = 1
        while True:
            self.stats.attempts += 1
            try:
                return await self._attempt(http, body, attempt, limit), attempt
            except BackendError as e:
                if not _retryable(e):
                    raise
                if attempt > self.max_retries:
                    if self.max_retries == 0:
                        raise
                    # The text, not the error: a handler that keeps its records (a test's log
                    # capture) would otherwise keep every failed request's body and frames.
                    logger.warning("giving up on a request: %s", str(e))
                    raise RetriesExhausted(e, attempts=attempt) from e
                delay = self._retry_delay(attempt, e)
                logger.debug("attempt %d failed (%s); retrying in %.3f s", attempt, e, delay)
            self.stats.retries += 1
            await asyncio.sleep(delay)
            attempt += 1

    async def _attempt(
        self, http: httpx.AsyncHTTPTransport, body: bytes, attempt: int, limit: int
    ) -> Any:
        request = httpx.Request(
            "POST", self._url, headers=self._headers, content=body, extensions=self._extensions
        )
        try:
            # httpx timeouts bound each phase; wait_for bounds the attempt as a whole.
            resp = await asyncio.wait_for(_send(http, request, limit), self.timeout_s)
        except (asyncio.TimeoutError, httpx.TimeoutException) as e:
            raise BackendTimeout(
                f"no answer within {self.timeout_s:g} s from {self._url}", attempts=attempt
            ) from e
        except httpx.TransportError as e:
            raise BackendTransportError(
                f"{type(e).__name__} talking to {self._url}: {e}", attempts=attempt
            ) from e
        if not 200 <= resp.status_code < 300:
            raise BackendHTTPError(
                f"HTTP {resp.status_code} from {self._url}: {resp.text[:300]!r}",
                attempts=attempt,
                status=resp.status_code,
                retry_after_s=parse_retry_after(resp.headers.get("retry-after")),
            )
        if resp.over_limit:
            # Not retried: the same request would be answered as long again.
            raise BackendBadResponse(
                f"answer from {self._url} is over {limit} bytes", attempts=attempt, status=200
            )
        try:
            # The stdlib parser, as httpx's ``Response.json``: a number past 64 bits in a field
            # the client ignores must not cost the answer (``_count`` vets the ones it reads).
            data = json.loads(resp.content)
        except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or nested past reason
            raise BackendBadResponse(
                f"body is not JSON: {resp.content[:200]!r}",
                attempts=attempt,
                status=resp.status_code,
            ) from e
        if isinstance(data, dict) and "error" in data and "choices" not in data:
            # Raised here, inside the retry loop, so it is retried like the 5xx it stands for.
            raise BackendErrorBody(
                f"server reported an error: {data['error']!r}", attempts=attempt, status=200
            )
        return data

    def _retry_delay(self, attempt: int, error: BackendError) -> float:
        retry_after = getattr(error, "retry_after_s", None)
        if retry_after is not None:
            return min(retry_after, self.max_retry_after_s)
        cap = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return self._rng.uniform(0.0, cap)


# httpcore's pool scans every connection and every queued request on each request event, and
# checks each idle connection's socket with syscalls, so its cost per request grows with the
# pool size. Measured on loopback at concurrency 32 (client + server CPU per request): one pool
# of 32 about 4 ms, pools of 8 about 2 ms, pools of 2 about 1.3 ms. Small pools behind one slot
# queue keep the cost flat at any concurrency.
_CONNECTIONS_PER_POOL = 2


@functools.lru_cache(maxsize=1)
def _default_tls() -> ssl.SSLContext:
    # Shared by every pool in the process: loading the CA bundle costs tens of ms of CPU, which
    # httpx would otherwise pay once per client even for plain-HTTP endpoints.
    return httpx.create_ssl_context()


RESPONSE_BYTES_BASE = 4 * 1024 * 1024
"""Answer bytes allowed besides the tokens (``response_limit``): the envelope, logprobs."""
RESPONSE_BYTES_PER_TOKEN = 256
"""Answer bytes allowed per token of the cap: a token is a few characters, at most a few dozen
once JSON-escaped, and reasoning and content share the cap."""


def response_limit(max_tokens: int) -> int:
    """The default largest answer body for a request of ``max_tokens`` new tokens.

    4.2 MB at 768 tokens: far above any real answer, far below what would hurt the caller.
    """
    return RESPONSE_BYTES_BASE + RESPONSE_BYTES_PER_TOKEN * max(0, max_tokens)


@dataclass
class _Answer:
    """The parts of an HTTP answer the client reads, its body bounded."""

    status_code: int
    headers: httpx.Headers
    content: bytes
    over_limit: bool
    """The body went past the limit; ``content`` holds its first bytes only."""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


async def _send(transport: httpx.AsyncHTTPTransport, request: httpx.Request, limit: int) -> _Answer:
    # The transport directly, not an ``httpx.AsyncClient``: the client's per-request layers
    # (header and URL merging, cookie extraction, auth and redirect flows, event hooks) do nothing
    # for a JSON POST to a fixed endpoint, yet cost about a third of the client's CPU per request
    # (loopback, 8 in flight: 1.0 ms through the client, 0.7 ms through the transport).
    resp = await transport.handle_async_request(request)
    resp.request = request
    chunks: list[bytes] = []
    size, over = 0, False
    try:
        # Streamed and counted after decompression: a server (or a gzip bomb) cannot make the
        # client hold more than ``limit`` bytes of one answer; a longer one is cut off here.
        async for chunk in resp.aiter_bytes():
            size += len(chunk)
            if size > limit:
                over = True
                break
            chunks.append(chunk)
    finally:
        await resp.aclose()
    return _Answer(resp.status_code, resp.headers, b"".join(chunks), over)


class _PoolSet:
    """``concurrency`` request slots spread evenly over small httpx connection pools."""

    def __init__(self, concurrency: int) -> None:
        n_pools = math.ceil(concurrency / _CONNECTIONS_PER_POOL)
        per_pool = math.ceil(concurrency / n_pools)
        limits = httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool)
        tls = _default_tls()
        self.clients = [httpx.AsyncHTTPTransport(limits=limits, verify=tls) for _ in range(n_pools)]
        # Slot j belongs to pool j % n_pools, so no pool ever has more requests than connections.
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        for j in range(concurrency):
            self._slots.put_nowait(j % n_pools)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[httpx.AsyncHTTPTransport]:
        index = await self._slots.get()
        try:
            yield self.clients[index]
        finally:
            self._slots.put_nowait(index)

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


# --------------------------------------------------------------------------------------------
# Request encoding


def _check_args(
    base_url: str,
    model: str,
    concurrency: int,
    timeout_s: float,
    max_retries: int,
    backoff_s: float,
) -> None:
    if not base_url:
        raise ValueError("OpenAIClient needs a base_url such as http://host:8000/v1")
    if not model:
        raise ValueError("OpenAIClient needs the served model name")
    if concurrency <= 0:
        raise ValueError(f"concurrency must be positive, got {concurrency}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if backoff_s < 0:
        raise ValueError(f"backoff_s must be >= 0, got {backoff_s}")


def _json(value: Any) -> bytes:
    return jsonio.dumps(value)


def _message_json(
    message: ChatMessage,
    images: ImagePayloadCache,
    image_format: ImageFormat = "png",
    jpeg_quality: int = 95,
) -> bytes:
    if all(isinstance(p, TextPart) for p in message.content):
        return _json({"role": message.role, "content": message.text()})
    parts: list[bytes] = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append(_json({"type": "text", "text": part.text}))
        elif isinstance(part, ImagePart):
            parts.append(images.image_part(part.image, image_format, jpeg_quality))
        else:
            raise TypeError(f"unknown message part {type(part)!r}")
    return b'{"role":' + _json(message.role) + b',"content":[' + b",".join(parts) + b"]}"


def chat_request_body(
    model: str,
    messages: Sequence[ChatMessage],
    sampling: Sampling,
    images: ImagePayloadCache | None = None,
    image_format: ImageFormat = "png",
    jpeg_quality: int = 95,
) -> bytes:
    """The JSON body of a chat completion request, encoded once and resent on retries.

    The body is spliced from bytes: each image part comes ready-made from the payload cache, so
    the large base64 strings are neither re-serialised nor scanned for escapes per request.

    Args:
        model: Served model name.
        messages: The chat; image parts hold PIL images.
        sampling: Sampling parameters (``extra`` fields are merged in at the top level).
        images: Payload cache of the images (the process-wide one by default).
        image_format: Transport format of the images (``png`` or ``jpeg``).
        jpeg_quality: JPEG quality (1-100) for ``jpeg``.

    Raises:
        TypeError: A message holds something other than text and PIL images.
        ValueError: Unknown image format or JPEG quality out of range.
    """
    # Not ``or``: an empty cache has length 0 and is falsy.
    cache = images if images is not None else default_image_cache()
    head: dict[str, Any] = {
        **dict(sampling.extra),
        "model": model,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
    }
    if sampling.seed is not None:
        head["seed"] = sampling.seed
    if sampling.stop:
        head["stop"] = list(sampling.stop)
    # ``messages`` goes first and the other fields follow: ``head`` always holds ``model``, so
    # its serialisation minus the opening brace is a non-empty tail of the object.
    return b"".join(
        [
            b'{"messages":[',
            b",".join(_message_json(m, cache, image_format, jpeg_quality) for m in messages),
            b"],",
            _json(head)[1:],
        ]
    )


def _images_of(messages: Sequence[ChatMessage]) -> list[Any]:
    return [p.image for m in messages for p in m.content if isinstance(p, ImagePart)]


async def encode_request(
    model: str,
    messages: Sequence[ChatMessage],
    sampling: Sampling,
    image_format: ImageFormat = "png",
    jpeg_quality: int = 95,
    known_hash: str | None = None,
) -> tuple[bytes, str]:
    """The request body and its cache key, as ``OpenAIBackend`` sends them.

    Images are encoded through the process-wide payload cache, on a worker thread when any of
    them is not encoded yet.

    Args:
        model: Served model name.
        messages: The chat; image parts hold PIL images.
        sampling: Sampling parameters.
        image_format: Transport format of the images (``png`` or ``jpeg``).
        jpeg_quality: JPEG quality (1-100) for ``jpeg``.
        known_hash: The caller's content address of the request (hashed here otherwise).

    Returns:
        ``(body, request_hash)``: the JSON bytes to POST and the request's cache key.

    Raises:
        TypeError: A message holds something other than text and PIL images.
        ValueError: Unknown image format or JPEG quality out of range.
    """

    def encode() -> tuple[bytes, str]:
        body = chat_request_body(model, messages, sampling, None, image_format, jpeg_quality)
        # Over pixels, not transport bytes: the format never changes a cache key. A caller's
        # own content address saves hashing every frame's pixels (~3 ms per 1 MP frame).
        return body, known_hash or request_hash(model, messages, sampling)

    cache = default_image_cache()
    cold = not all(
        cache.has_part(i, image_format, jpeg_quality) and (known_hash or cache.has_digest(i))
        for i in _images_of(messages)
    )
    # PNG encoding takes tens of ms per frame; Pillow releases the GIL while compressing, so a
    # worker thread keeps the event loop serving other requests meanwhile. Once every image is
    # cached, splicing the body costs well under a millisecond: a thread hop would cost more.
    return await asyncio.to_thread(encode) if cold else encode()


# --------------------------------------------------------------------------------------------
# Response parsing


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header value (delta seconds or an HTTP date).

    Returns:
        Non-negative seconds, or ``None`` when the header is absent or unreadable.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def _content_text(content: Any, attempts: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content
    ):
        return "".join(p.get("text", "") for p in content)
    raise BackendBadResponse(
        f"message content has type {type(content).__name__}", attempts=attempts
    )


MAX_REPORTED_TOKENS = 10**9
"""Largest token count believed from a server's ``usage``: no context comes near it, and every
count must stay a 64-bit integer for the JSON and metrics it reaches."""


def _count(usage: Any, key: str) -> int:
    """A ``usage`` token count, 0 when absent.

    A value that is not a count (a float, a string, a bool, negative, or past
    ``MAX_REPORTED_TOKENS``) is treated as absent, with a warning.
    """
    value = usage.get(key) if isinstance(usage, dict) else None
    if value is None:
        return 0
    if type(value) is int and 0 <= value <= MAX_REPORTED_TOKENS:
        return value
    shown = repr(value)
    logger.warning(
        "backend reported usage.%s = %s, not a token count; treated as absent",
        key,
        shown if len(shown) <= 40 else shown[:40] + "...",
    )
    return 0


def parse_chat_completion(
    data: Any, attempts: int = 1
) -> tuple[str, str | None, str, Usage, str | None]:
    """Read a chat completion body.

    Args:
        data: The decoded JSON body.
        attempts: Attempts made so far (recorded on a raised error).

    Returns:
        ``(text, reasoning, finish_reason, usage, model)``; ``model`` is ``None`` when absent.

    Raises:
        BackendBadResponse: The body is not a chat completion.
    """
    if not isinstance(data, dict):
        raise BackendBadResponse(
            f"body is a {type(data).__name__}, not an object", attempts=attempts
        )
    if "error" in data and "choices" not in data:
        raise BackendErrorBody(f"server reported an error: {data['error']!r}", attempts=attempts)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BackendBadResponse("body has no choices", attempts=attempts)
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise BackendBadResponse("first choice has no message", attempts=attempts)
    text = _content_text(message.get("content"), attempts)
    # vLLM renamed reasoning_content to reasoning; accept either, then inline <think>.
    field_value = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(field_value, str) and field_value:
        reasoning: str | None = field_value
    else:
        reasoning, text = split_reasoning(text)
    finish = choices[0].get("finish_reason")
    usage = data.get("usage")
    model = data.get("model")
    return (
        text,
        reasoning,
        finish if isinstance(finish, str) else "unknown",
        Usage(_count(usage, "prompt_tokens"), _count(usage, "completion_tokens")),
        model if isinstance(model, str) else None,
    )


def _retryable(error: BackendError) -> bool:
    if isinstance(error, (BackendTimeout, BackendTransportError, BackendErrorBody)):
        return True
    if isinstance(error, BackendHTTPError):
        return error.status == 429 or (error.status or 0) >= 500
    return False
