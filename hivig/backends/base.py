"""The inference backend protocol and the types every backend shares.

A backend turns chat messages (text plus canonical PIL frames) into a ``Generation``: text,
reasoning, token usage and the request's content address. Failures surface as ``BackendError``
with a stable ``reason`` code so callers can count them (data_gen drop reasons) or fail open
(serve abstentions) without parsing messages.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from PIL import Image

from hivig.backends.images import ImagePayloadCache, default_image_cache
from hivig.contracts import UNCLOSED_THINK, ContractError, split_think
from hivig.messages import ChatMessage, ImagePart, TextPart
from hivig.vision import encode_png

T = TypeVar("T")

ErrorReason = Literal[
    "timeout", "http_status", "transport", "bad_response", "retries_exhausted", "bad_request"
]

# Version of the request-hash recipe; bump it when the hashed fields change so old caches miss
# instead of returning answers to a differently shaped request.
REQUEST_HASH_VERSION = 1


# Request body fields owned by typed arguments; ``Sampling.extra`` may not override them.
RESERVED_BODY_FIELDS = frozenset(
    {"model", "messages", "temperature", "top_p", "max_tokens", "seed", "stop", "stream", "n"}
)

# --------------------------------------------------------------------------------------------
# Value types


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters as sent with one request (recorded with every output).

    Attributes:
        temperature: Softmax temperature; 0 means greedy.
        top_p: Nucleus sampling mass in (0, 1].
        max_tokens: Maximum new tokens.
        seed: Sampling seed, when the backend honours one.
        stop: Extra stop strings.
        extra: Additional JSON body fields for OpenAI-compatible servers, for example
            ``{"chat_template_kwargs": {"enable_thinking": False}}``; ignored in-process.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 2048
    seed: int | None = None
    stop: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        clash = RESERVED_BODY_FIELDS & set(self.extra)
        if clash:
            raise ValueError(f"sampling extra may not set {sorted(clash)}; use the typed fields")
        if self.temperature < 0:
            raise ValueError(f"sampling temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens <= 0:
            raise ValueError(f"sampling max_tokens must be positive, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature 0)."""
        return self.temperature == 0

    def to_json(self) -> dict[str, Any]:
        """JSON form, the exact fields hashed and recorded."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "stop": list(self.stop),
            "extra": dict(self.extra),
        }


@dataclass(frozen=True)
class Usage:
    """Token accounting of one generation (0 when the server did not report it)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Generation:
    """One model answer with everything needed to record and reproduce it.

    Attributes:
        text: The answer with any reasoning split off.
        reasoning: The reasoning (``<think>`` content or the server's reasoning field), or
            ``None`` when the model produced none.
        usage: Token counts.
        finish_reason: ``stop``, ``length`` or whatever the server reported.
        model: The model that answered.
        sampling: The sampling parameters as sent.
        request_hash: Content address of the request: ``request_hash(model, messages, sampling)``,
            or the caller's own when it passed one to ``generate``.
        latency_s: Seconds from the first attempt to the answer, retries included.
        attempts: HTTP attempts made (1 without retries; 1 for in-process backends).
    """

    text: str
    reasoning: str | None
    usage: Usage
    finish_reason: str
    model: str
    sampling: Sampling
    request_hash: str
    latency_s: float
    attempts: int = 1

    @property
    def truncated(self) -> bool:
        """Whether generation stopped at the token limit."""
        return self.finish_reason == "length"


# --------------------------------------------------------------------------------------------
# Errors


class BackendError(RuntimeError):
    """A generation failed; ``reason`` is a stable code for counters and fail-open policies.

    Attributes:
        reason: One of ``timeout``, ``http_status``, ``transport``, ``bad_response``,
            ``bad_request``, ``retries_exhausted``.
        attempts: Attempts made before giving up.
        status: HTTP status of the last response, when there was one.
    """

    reason: ErrorReason = "transport"

    def __init__(self, message: str, *, attempts: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.status = status

    @property
    def root_reason(self) -> ErrorReason:
        """The reason of the failure itself (the last attempt's, after exhausted retries)."""
        return self.reason

    def __str__(self) -> str:
        return f"[{self.reason}, attempts={self.attempts}] {super().__str__()}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Subclasses take keyword-only arguments, which default exception pickling cannot pass;
        # errors must survive crossing to worker processes intact.
        return (_restore_error, (type(self), self.args, dict(self.__dict__)))


def _restore_error(cls: type[BackendError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class BackendTimeout(BackendError):
    """The request did not finish within the per-request timeout."""

    reason: ErrorReason = "timeout"


class BackendHTTPError(BackendError):
    """The server answered with an error status (429 and 5xx are retried, other 4xx are not).

    Attributes:
        retry_after_s: The server's ``Retry-After`` in seconds, when it sent one.
    """

    reason: ErrorReason = "http_status"

    def __init__(
        self, message: str, *, attempts: int = 1, status: int, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, attempts=attempts, status=status)
        self.retry_after_s = retry_after_s


class BackendTransportError(BackendError):
    """The connection failed (refused, reset, protocol error)."""

    reason: ErrorReason = "transport"


class BackendBadResponse(BackendError):
    """The server answered 200 with a body that is not a chat completion."""

    reason: ErrorReason = "bad_response"


class BackendErrorBody(BackendBadResponse):
    """The server answered 200 with an error object instead of a completion.

    Servers and proxies do this for overload and upstream failures that other servers report
    as 5xx, so it is retried like one; its ``reason`` stays ``bad_response`` once retries are
    exhausted, so counters keep their codes.
    """


class BackendBadRequest(BackendError):
    """The request itself cannot be served (e.g. messages the model cannot encode); not retried."""

    reason: ErrorReason = "bad_request"


class RetriesExhausted(BackendError):
    """Every allowed attempt failed with a retryable error; ``last`` is the final one."""

    reason: ErrorReason = "retries_exhausted"

    def __init__(self, last: BackendError, *, attempts: int) -> None:
        super().__init__(
            f"gave up after {attempts} attempts; last: {last}",
            attempts=attempts,
            status=last.status,
        )
        self.last = last

    @property
    def root_reason(self) -> ErrorReason:
        """The reason of the last failed attempt (``timeout``, ``http_status``, ...)."""
        return self.last.reason


# --------------------------------------------------------------------------------------------
# Protocol


@runtime_checkable
class InferenceBackend(Protocol):
    """Given chat messages with images, return text, reasoning and usage.

    ``generate`` is all a backend must implement; what it may offer beyond it (its model name,
    whether a call can be cancelled, its PNG payload cache, ``aclose``) is ``Backend``'s, with
    the defaults callers assume for a backend without it.
    """

    async def generate(
        self, messages: list[ChatMessage], sampling: Sampling, *, request_hash: str | None = None
    ) -> Generation:
        """Generate one answer.

        Args:
            messages: Chat turns whose image parts hold canonical PIL images.
            sampling: Sampling parameters, sent as given and recorded in the result.
            request_hash: The request's content address when the caller already has one (it is
                recorded as given, and the backend skips hashing the pixels); ``None`` to let
                the backend compute ``request_hash(model, messages, sampling)``.

        Returns:
            The answer with its reasoning split off.

        Raises:
            BackendError: The backend could not produce an answer.
        """
        ...


class Backend:
    """The members a backend may offer beyond ``generate``, with the defaults callers assume.

    The concrete backends (``OpenAIClient``, ``TransformersBackend``) inherit it and override
    what they have. A backend that only implements ``generate`` (a test fake, a scripted demo)
    need not: callers read these members through ``backend_model_name``, ``backend_cancellable``,
    ``backend_png_payloads`` and ``close_backend``, which give the same defaults for it.
    """

    model_name: str = ""
    """The model that answers, as recorded in results and reports; empty when unknown."""
    cancellable: bool = False
    """Whether cancelling ``generate`` really stops the work (a remote call): callers then
    cancel at their deadline instead of waiting for work that runs on in a thread."""

    @property
    def png_payloads(self) -> ImagePayloadCache | None:
        """The payload cache this backend's PNG image parts come from, when it sends PNGs.

        A caller that encodes a frame as PNG anyway may hand it the bytes (``prime_png``).
        """
        return None

    async def aclose(self) -> None:
        """Release what the backend holds (connections); it may be used again afterwards."""
        return None


_DEFAULTS = Backend()


def _member(backend: object, name: str) -> Any:
    """``backend``'s member ``name``, or ``Backend``'s default for one that lacks it."""
    return getattr(backend, name, getattr(_DEFAULTS, name))


def backend_model_name(backend: object) -> str:
    """The model a backend names (``model_name``, else an OpenAI client's ``model``); ``""``."""
    name = _member(backend, "model_name") or getattr(backend, "model", "")
    return name if isinstance(name, str) else str(name or "")


def backend_cancellable(backend: object) -> bool:
    """Whether cancelling the backend's ``generate`` stops its work (``Backend.cancellable``)."""
    return bool(_member(backend, "cancellable"))


def backend_png_payloads(backend: object) -> ImagePayloadCache | None:
    """The backend's PNG payload cache (``Backend.png_payloads``), or ``None``."""
    return _member(backend, "png_payloads")


async def close_backend(backend: object) -> None:
    """Await the backend's ``aclose`` (``Backend.aclose``; nothing for one without)."""
    aclose = getattr(backend, "aclose", None)
    if aclose is not None:
        await aclose()


@runtime_checkable
class PreparesImages(Protocol):
    """A backend that can do its per-image CPU work ahead of ``generate``, in any thread."""

    def prepare_images(self, messages: Sequence[ChatMessage], *, digests: bool = True) -> None:
        """Encode (and cache) the messages' images so that sending them costs no CPU.

        ``digests=False`` skips the pixel digests, for requests sent with a ``request_hash``.
        """
        ...


# --------------------------------------------------------------------------------------------
# Images and request hashing


def png_bytes(image: Image.Image) -> bytes:
    """Encode a PIL image as PNG bytes that depend only on its pixels (``hivig.vision``).

    Raises:
        TypeError: ``image`` is not a PIL image (an unmaterialised ``ImageRef``, for example).
    """
    if not isinstance(image, Image.Image):
        raise TypeError(
            f"image parts must hold PIL images (materialise ImageRef first), got {type(image)!r}"
        )
    return encode_png(image)


def image_digest(image: Image.Image) -> str:
    """SHA-256 of an image's mode, size and raw pixels (independent of any PNG encoder).

    Computed once per image object (``hivig.backends.images``); treat the image as immutable
    after its first use.

    Raises:
        TypeError: ``image`` is not a PIL image.
    """
    return default_image_cache().digest(image)


def content_hash(doc: Any, *, default: Callable[[Any], Any] | None = None) -> str:
    """Hex SHA-256 of ``doc`` as canonical JSON (sorted keys, compact, UTF-8 kept).

    The one way the project names a request by its content: the backends' ``request_hash``,
    data_gen's annotator cache keys, the gateway's model requests and retry keys.
    """
    blob = json.dumps(
        doc, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=default
    )
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def messages_skeleton(
    messages: Sequence[ChatMessage], image: Callable[[ImagePart], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Messages as hashable JSON: text parts as they are, each image as ``image(part)`` names it.

    Callers name images by what they know of them: pixels, file content, a stored reference.

    Raises:
        TypeError: A message holds something other than text and image parts.
    """
    out = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        for part in message.content:
            if isinstance(part, TextPart):
                parts.append({"text": part.text})
            elif isinstance(part, ImagePart):
                parts.append(image(part))
            else:
                raise TypeError(f"unknown message part {type(part)!r}")
        out.append({"role": message.role, "content": parts})
    return out


def request_hash(model: str, messages: Sequence[ChatMessage], sampling: Sampling) -> str:
    """Content address of a request: model, messages (images by pixel hash) and sampling.

    Equal requests get equal hashes whatever the image transport (the pixels are hashed, not the
    encoded bytes). data_gen's annotator names its requests by its own cache key instead.

    Returns:
        A hex SHA-256.

    Raises:
        TypeError: A message holds something other than text and PIL images.
    """
    doc = {
        "v": REQUEST_HASH_VERSION,
        "model": model,
        "messages": messages_skeleton(messages, _pixel_name),
        "sampling": sampling.to_json(),
    }
    return content_hash(doc)


def _pixel_name(part: ImagePart) -> dict[str, Any]:
    return {"image_sha256": image_digest(part.image)}


# --------------------------------------------------------------------------------------------
# Reasoning


_THINK_OPEN = re.compile(r"\s*<think>", re.IGNORECASE)


def split_reasoning(text: str) -> tuple[str | None, str]:
    """Split inline reasoning off a completion with the canonical splitter, never failing.

    Delegates to ``hivig.contracts.split_think`` without an answer tag, so a backend splits
    exactly as the contracts do: ``<think>…</think>answer`` and a lone ``…</think>answer``
    (templates that pre-fill ``<think>``), the reasoning running to the *last* ``</think>`` so
    reasoning that quotes the tags stays whole. Where ``split_think`` reports an error the backend
    still has to return a ``Generation``:

    * ``<think>…`` cut off before any ``</think>`` (``unclosed_think``, a truncated answer): all
      of it is reasoning and the answer is empty, as before.
    * Malformed structure (a second block, text before ``<think>``, an unclosed block after the
      reasoning): the raw text is the answer and the reasoning ``None``, so the contract parser,
      which scans ``text`` when no separate reasoning is given, reports the precise reason.

    The one remaining difference from a contract parse: a backend cannot know which answer tag
    the caller expects, so a ``</think>`` quoted *inside the answer* is taken as the end of the
    reasoning here, while ``split_think(text, answer_tag=...)`` leaves it to the answer.

    Returns:
        ``(reasoning, answer)``; ``reasoning`` is ``None`` when the text has no think markers.
    """
    split = split_think(text)
    if not isinstance(split, ContractError):
        reasoning, answer = split
        return (None, text) if reasoning is None else (reasoning, answer.lstrip())
    if split.reason == UNCLOSED_THINK:
        opening = _THINK_OPEN.match(text)
        if opening is not None and "</think>" not in text.lower():
            return text[opening.end() :].strip(), ""
    return None, text


# --------------------------------------------------------------------------------------------
# Synchronous use


class SyncBackend:
    """Blocking facade over an async backend, for scripts and notebooks.

    The wrapped backend runs on a private event loop in a daemon thread, so pooled HTTP
    connections stay bound to one loop and callers may block from any thread (even one that
    runs its own loop).

    Example::

        with SyncBackend(OpenAIClient(url, model)) as backend:
            gen = backend.generate(messages, Sampling(max_tokens=256))
    """

    def __init__(self, backend: InferenceBackend) -> None:
        """Start the private loop.

        Args:
            backend: Any ``InferenceBackend``; its ``aclose()`` is awaited on ``close()``.
        """
        self.backend = backend
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="hivig-sync-backend", daemon=True
        )
        self._thread.start()
        self._closed = False

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run a coroutine on the private loop and return its result.

        Raises:
            RuntimeError: The facade is closed.
        """
        if self._closed:
            coro.close()
            raise RuntimeError("SyncBackend is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def generate(self, messages: list[ChatMessage], sampling: Sampling) -> Generation:
        """Blocking ``generate``.

        Raises:
            BackendError: As the wrapped backend raises.
        """
        return self.run(self.backend.generate(messages, sampling))

    def generate_many(
        self,
        requests: Sequence[tuple[list[ChatMessage], Sampling]],
        *,
        return_exceptions: bool = False,
    ) -> list[Generation | BackendError]:
        """Blocking ``generate_many`` (see ``generate_many`` in this module)."""
        return self.run(generate_many(self.backend, requests, return_exceptions=return_exceptions))

    def close(self) -> None:
        """Close the wrapped backend (if it has ``aclose``) and stop the loop."""
        if self._closed:
            return
        self.run(close_backend(self.backend))
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def generate_many(
    backend: InferenceBackend,
    requests: Sequence[tuple[list[ChatMessage], Sampling]],
    *,
    return_exceptions: bool = False,
) -> list[Generation | BackendError]:
    """Run many requests concurrently; the backend's own bound limits what is in flight.

    Args:
        backend: The backend to call.
        requests: ``(messages, sampling)`` pairs.
        return_exceptions: Put each ``BackendError`` in its request's slot instead of raising
            the first one; other exceptions always propagate.

    Returns:
        One result per request, in order.

    Raises:
        BackendError: The first failure, when ``return_exceptions`` is false.
    """

    async def one(messages: list[ChatMessage], sampling: Sampling) -> Generation | BackendError:
        try:
            return await backend.generate(messages, sampling)
        except BackendError as e:
            if return_exceptions:
                return e
            raise

    tasks = [asyncio.ensure_future(one(m, s)) for m, s in requests]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        # Do not leave the other requests running unobserved after the first failure.
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
