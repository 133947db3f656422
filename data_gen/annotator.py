"""The annotator: an OpenAI-compatible endpoint or the deterministic offline annotator.

Stages call ``Annotator.annotate(request, validate)``. The annotator

- looks the request up in a content-addressed on-disk cache (a rerun or a crashed job never pays
  for a request twice; retries after an invalid answer are separate cache entries, so a rerun
  replays the whole validation history without a single new request);
- validates every answer against the stage's contract and retries a bounded number of times;
- returns the value with its attempts, request hashes and raw answers, or a typed failure whose
  reason becomes a drop counter in the calling stage.

The offline annotator (``backend.kind=offline``) needs no model: each request carries an
``oracle`` (the ground truth the stage knows: transition facts, intents, the injected dimension)
and the offline writer renders a contract-valid answer from it. Its model name is
``OFFLINE_MODEL``, which every record it produces carries as its annotator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import heapq
import itertools
import json
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from PIL import Image

from data_gen.perturb.elements import role_words
from hivig.backends import (
    BackendError,
    BackendErrorBody,
    InferenceBackend,
    PreparesImages,
    RetriesExhausted,
    Sampling,
    content_hash,
    messages_skeleton,
)
from hivig.config import BackendConfig, FrameConfig
from hivig.contracts import render_critique_target, render_history_target
from hivig.files import write_atomic
from hivig.logging import get_logger
from hivig.messages import ChatMessage, ImagePart, ImageRef, TextPart, mark_to_json
from hivig.vision import FrameCache, ImageError, canonical_frame, draw_marks

log = get_logger(__name__)

R = TypeVar("R")

OFFLINE_MODEL = "hivig-offline-annotator"
"""Annotator name recorded on every sample the offline annotator wrote (never a real model)."""

FRAME_CACHE_BYTES = 4 << 30
"""Default memory for prepared frames (4 GiB: ~1,000 frames of 1 MP, 4 MB each in Pillow's RGB
layout). A shard whose screenshots fit is decoded exactly once; beyond it the least recently
used frames are dropped and prepared again when needed (counted as ``frames_evicted``)."""

PREFETCH = 16
"""Default number of requests prepared ahead of a free request slot. A slot frees every
latency/concurrency seconds (6 ms at 32 in flight and 0.2 s); preparing a ~1 MP frame takes
about 10 ms of CPU, longer when the cores are shared, so a few ready requests keep every slot
busy and 16 leaves room for bursts of new screenshots."""

OUTAGE_WAIT_S = 300.0
"""Default longest wait through an endpoint outage (timeouts, refused connections, 429, 5xx,
error bodies) before a request is given up as a transient failure: an annotator restarting or a
rate limit lifting then costs a pause, not a rerun."""

OUTAGE_BACKOFF_S = (1.0, 30.0)
"""First and longest pause between tries during an outage (doubling in between)."""

FOLLOWING_REQUESTS = {"transitions": 3, "perturb": 2, "judge": 1}
"""Requests that at most follow one of a stage on its step's path (transition, perturbation,
judge, rationale); a history request says its own (``AnnotatorRequest.following``)."""


def priority(request: AnnotatorRequest) -> int:
    """Which waiting request takes a free slot first: the one with the longest path of requests
    still to follow it (lowest value first, then arrival order). Its item is then the furthest
    from done, so serving it first keeps the end of a run from waiting on one long path: a
    history chain (each summary is the next pair's input) or a step's transition, judge and
    rationale."""
    following = request.following
    if following is None:
        following = FOLLOWING_REQUESTS.get(request.stage, 0)
    return -following


class PriorityGate:
    """An asyncio semaphore whose waiters are let in by priority, then in arrival order."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @asynccontextmanager
    async def slot(self, priority: int) -> AsyncIterator[None]:
        """Hold one slot for the ``async with`` block."""
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: int) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._arrivals), waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # the slot was handed over just before the cancellation
            raise

    def _release(self) -> None:
        while self._waiters:
            _, _, waiter = heapq.heappop(self._waiters)
            if not waiter.done():  # a cancelled waiter is skipped
                waiter.set_result(None)
                return
        self._free += 1


# Bump when the cache key recipe changes so stale entries miss instead of answering a
# differently shaped request.
CACHE_KEY_VERSION = 1


class OfflineAnswerError(ValueError):
    """The offline writer cannot render a contract-valid answer from this oracle."""


class Rejected(NamedTuple):
    """A validator's verdict on an answer that does not meet the stage contract."""

    reason: str
    message: str


class _Answer(NamedTuple):
    """One answer as the stages see it, from the endpoint, the cache or the offline writer."""

    text: str
    reasoning: str | None
    request_hash: str
    truncated: bool
    """The server stopped at ``max_tokens`` (``finish_reason == "length"``): a cut answer may
    still parse, and must not become a target."""
    prompt_tokens: int = 0
    """The server's usage for this answer (kept in the cache entry; 0 when not reported)."""
    completion_tokens: int = 0


@dataclass(frozen=True)
class AnnotatorRequest:
    """One annotator call.

    Attributes:
        stage: Stage name (part of the cache key and the offline writer's dispatch).
        messages: Chat messages whose image parts are ``ImageRef`` (materialised only when sent).
        oracle: Ground truth for the offline annotator; never sent to a model.
    """

    stage: str
    messages: list[ChatMessage]
    oracle: dict[str, Any] = field(default_factory=dict)
    following: int | None = None
    """Requests that must follow this one on its item's path (a history chain's later pairs);
    ``None`` takes the stage's (``FOLLOWING_REQUESTS``). Orders the queue, never the answer."""


@dataclass
class Annotation(Generic[R]):
    """The outcome of ``Annotator.annotate``.

    Attributes:
        value: The validated value, or ``None`` on failure.
        text: The last answer's visible text.
        reasoning: The last answer's reasoning, when the model produced one.
        attempts: Answers obtained (validation retries + 1).
        request_hashes: Content address of every request made for this call.
        raw: Every raw answer, in order (goes to the exclusion file on failure).
        reason: Drop reason on failure (``contract_<code>`` or ``annotator_<code>``).
        message: Human-readable detail of the failure.
        prompt_tokens: The server's prompt tokens over every answer (cached ones included:
            what the answers cost when they were paid for).
        completion_tokens: The same for the completions.
    """

    value: R | None
    text: str = ""
    reasoning: str | None = None
    attempts: int = 0
    request_hashes: list[str] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    reason: str = ""
    message: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def ok(self) -> bool:
        """Whether a valid value came back."""
        return self.value is not None

    @property
    def retries(self) -> int:
        """Validation retries spent (``llm_retries`` counter)."""
        return max(0, self.attempts - 1)


class OfflineWriter(Protocol):
    """Renders a contract-valid answer for a stage from the request's oracle."""

    def __call__(self, stage: str, oracle: dict[str, Any], attempt: int) -> tuple[str, str | None]:
        """Return ``(answer text, reasoning)``; reasoning comes separately, as from vLLM's
        ``reasoning_content``, or ``None`` when the text carries it inline."""
        ...


# --------------------------------------------------------------------------------------------
# Cache


class RequestCache:
    """Content-addressed store of annotator answers: ``<dir>/<key[:2]>/<key>.json``.

    Entries are written atomically, so a crash leaves either the whole entry or none.
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(directory)

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored answer for ``key``, or ``None``; an unreadable entry counts as a miss."""
        path = self._path(key)
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as e:
            log.warning("ignoring unreadable cache entry %s: %s", path, e)
            return None

    def put(self, key: str, entry: dict[str, Any]) -> None:
        """Store an answer."""
        write_atomic(self._path(key), json.dumps(entry, sort_keys=True, ensure_ascii=False))


class ImageDigests:
    """SHA-256 of screenshot files by path, computed once per process.

    An unreadable file gets ``missing:<path>`` (a stable key; sending it fails later with a
    reason); ``readable`` tells the two apart.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._memo: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        if path not in self._memo:
            full = Path(path) if Path(path).is_absolute() else self.root / path
            try:
                self._memo[path] = hashlib.sha256(full.read_bytes()).hexdigest()
            except OSError:
                # A missing file still needs a stable key; sending it fails later, with a reason.
                self._memo[path] = f"missing:{path}"
        return self._memo[path]

    def readable(self, path: str) -> bool:
        """Whether the file could be read."""
        return not self(path).startswith("missing:")

    def known(self, path: str) -> bool:
        """Whether the digest of ``path`` is already computed (asking costs no I/O)."""
        return path in self._memo


def _usage(entry: dict[str, Any]) -> tuple[int, int]:
    """``(prompt, completion)`` tokens of a cache entry; ``(0, 0)`` for entries written before
    usage was kept, or a malformed one."""
    used = entry.get("usage")
    if isinstance(used, list) and len(used) == 2 and all(isinstance(n, int) for n in used):
        return used[0], used[1]
    return 0, 0


def cache_key(
    model: str,
    sampling: dict[str, Any],
    frame: FrameConfig,
    request: AnnotatorRequest,
    attempt: int,
    digest: Callable[[str], str],
) -> str:
    """Content address of one attempt: model, sampling, frame, stage, messages and attempt.

    Images enter by file content, marks and size class (not by path alone), so a changed
    screenshot misses and a renamed identical one hits.
    """

    def image(part: ImagePart) -> dict[str, Any]:
        ref = part.image
        if not isinstance(ref, ImageRef):
            raise TypeError(f"unsupported message part {type(part)!r}")
        marks = [mark_to_json(m) for m in ref.marks]
        return {"image": digest(ref.path), "marks": marks, "size_class": ref.size_class}

    doc = {
        "v": CACHE_KEY_VERSION,
        "model": model,
        "sampling": sampling,
        "frame": [frame.min_pixels, frame.max_pixels, frame.factor],
        "stage": request.stage,
        "attempt": attempt,
        "messages": messages_skeleton(request.messages, image),
    }
    return content_hash(doc)


def _image_paths(request: AnnotatorRequest) -> list[str]:
    return [
        part.image.path
        for message in request.messages
        for part in message.content
        if isinstance(part, ImagePart) and isinstance(part.image, ImageRef)
    ]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which SLURM and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks on this platform (macOS)
        return os.cpu_count() or 1


def raw_answer(text: str, reasoning: str | None) -> str:
    """An answer as the exclusion file records it; separate reasoning stays visibly separate
    (wrapping it in think tags would misreport what the model returned)."""
    if reasoning is None:
        return text
    return json.dumps({"reasoning": reasoning, "text": text}, ensure_ascii=False)


# --------------------------------------------------------------------------------------------
# Annotator


TRANSIENT_REASONS = frozenset(
    {
        "annotator_timeout",
        "annotator_transport",
        "annotator_http_unavailable",
        "annotator_error_body",
    }
)
"""Drop reasons of endpoint failures that may pass (timeouts, dropped connections, 429, 5xx, a
200 carrying an error object).

A stage with any of these is not committed, so a rerun retries its items; answers already
received are in the request cache, so the rerun only pays for the failed requests.
"""


def backend_error_reason(e: BackendError) -> str:
    """Drop reason of an endpoint failure: ``annotator_<root reason>``.

    HTTP 429 and 5xx (after the client's own retries) become ``annotator_http_unavailable``,
    a temporary condition; other statuses stay ``annotator_http_status``, a permanent refusal.
    A 200 whose body is an error object is ``annotator_error_body``, temporary like a 5xx.
    """
    last = e.last if isinstance(e, RetriesExhausted) else e
    if isinstance(last, BackendErrorBody):
        return "annotator_error_body"
    root = e.root_reason
    status = e.status or 0
    if root == "http_status" and (status == 429 or status >= 500):
        return "annotator_http_unavailable"
    return f"annotator_{root}"


class Annotator:
    """Cached, validated, bounded-retry annotator over a backend or the offline writer.

    Args:
        backend_cfg: Endpoint, model, concurrency and sampling (``kind=offline`` for no model).
        frame: Canonical frame the screenshots are sent at.
        corpus_root: Root that relative screenshot paths resolve against.
        cache_dir: Request cache directory, or ``None`` for no cache.
        max_attempts: Answers per request before giving up on the contract.
        backend: The HTTP backend (``None`` for the offline annotator).
        offline: The offline writer (required when ``backend`` is ``None``).
        frame_cache_bytes: Memory for prepared frames (``hivig.vision.FrameCache``).
        prefetch: Requests prepared (frames decoded, payloads encoded) ahead of a free request
            slot; see ``jobs_in_flight``.
        prepare_threads: Threads that prepare requests; 0 means one per CPU this process may
            use.
        outage_wait_s: Longest wait through transient endpoint failures before a request is
            given up (``TRANSIENT_REASONS``); 0 gives up at the client's own last retry.
        outage_backoff_s: First and longest pause between tries during an outage.
    """

    def __init__(
        self,
        backend_cfg: BackendConfig,
        frame: FrameConfig,
        corpus_root: Path,
        cache_dir: Path | None,
        max_attempts: int,
        backend: InferenceBackend | None = None,
        offline: OfflineWriter | None = None,
        frame_cache_bytes: int = FRAME_CACHE_BYTES,
        prefetch: int = PREFETCH,
        prepare_threads: int = 0,
        outage_wait_s: float = OUTAGE_WAIT_S,
        outage_backoff_s: tuple[float, float] = OUTAGE_BACKOFF_S,
    ) -> None:
        if prefetch < 0:
            raise ValueError(f"prefetch must be >= 0, got {prefetch}")
        if prepare_threads < 0:
            raise ValueError(f"prepare_threads must be >= 0, got {prepare_threads}")
        if backend is None and offline is None:
            raise ValueError("an annotator needs a backend or an offline writer")
        self.backend = backend
        self.offline_writer = offline
        self.frame = frame
        self.root = corpus_root
        self.cache = RequestCache(cache_dir) if cache_dir is not None else None
        self.max_attempts = max_attempts
        self.model = OFFLINE_MODEL if backend is None else backend_cfg.model
        s = backend_cfg.sampling
        self.sampling = Sampling(
            temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=s.seed
        )
        self.concurrency = backend_cfg.concurrency
        self.outage_wait_s = outage_wait_s
        self.outage_backoff_s = outage_backoff_s
        self._outage_logged_at = -float("inf")
        self.prefetch = prefetch
        self.prepare_threads = prepare_threads or usable_cpus()
        self._preparer: ThreadPoolExecutor | None = None
        # Checked once: a runtime protocol check walks the class on every call.
        self._encodes_ahead = isinstance(backend, PreparesImages)
        self.digest = ImageDigests(corpus_root)
        """File digests by screenshot path (shared with the stages' no-change checks)."""
        self._slots: PriorityGate | None = None
        self._jobs: PriorityGate | None = None
        self.frames = FrameCache(max_bytes=frame_cache_bytes)
        """Prepared frames (canonical, and with marks) shared by every request of the shard."""
        self.counts: Counter[str] = Counter()
        """Run-wide counters: ``requests`` (new, paid), ``cache_hits``, ``backend_errors``,
        ``outage_waits`` (pauses through transient failures), ``truncated`` (answers cut at
        ``max_tokens``), and the server's ``prompt_tokens`` / ``completion_tokens`` summed over
        the paid requests."""

    @property
    def is_offline(self) -> bool:
        """Whether answers come from the offline writer (labelled in every record)."""
        return self.backend is None

    def describe(self) -> dict[str, Any]:
        """What produced the answers, recorded in the run output."""
        return {
            "model": self.model,
            "offline": self.is_offline,
            "sampling": self.sampling.to_json(),
            "max_attempts": self.max_attempts,
            "concurrency": self.concurrency,
        }

    async def annotate(
        self,
        request: AnnotatorRequest,
        validate: Callable[[str, str | None], R | Rejected],
    ) -> Annotation[R]:
        """Get a contract-valid answer, retrying invalid ones up to ``max_attempts`` times.

        Args:
            request: The messages and oracle.
            validate: ``(text, reasoning) -> value | Rejected``; must be pure.

        Returns:
            An ``Annotation``; on failure ``value`` is ``None`` and ``reason`` is set.
        """
        result: Annotation[R] = Annotation(value=None)
        for attempt in range(self.max_attempts):
            try:
                answer = await self._answer_through_outages(request, attempt)
            except BackendError as e:
                self.counts["backend_errors"] += 1
                result.reason = backend_error_reason(e)
                result.message = str(e)
                return result
            except ImageError as e:
                result.reason, result.message = "image_error", str(e)
                return result
            except OfflineAnswerError as e:
                result.reason, result.message = "offline_unrenderable", str(e)
                return result
            text, reasoning, rhash, truncated = answer[:4]
            result.attempts += 1
            result.prompt_tokens += answer.prompt_tokens
            result.completion_tokens += answer.completion_tokens
            result.request_hashes.append(rhash)
            result.raw.append(raw_answer(text, reasoning))
            result.text, result.reasoning = text, reasoning
            if truncated:
                self.counts["truncated"] += 1
                result.reason = "contract_truncated"
                result.message = "the answer stopped at max_tokens (finish_reason=length)"
                continue
            verdict = validate(text, reasoning)
            if isinstance(verdict, Rejected):
                result.reason, result.message = f"contract_{verdict.reason}", verdict.message
                continue
            result.value, result.reason, result.message = verdict, "", ""
            return result
        return result

    async def _answer_through_outages(self, request: AnnotatorRequest, attempt: int) -> _Answer:
        """``_answer``, pausing through transient endpoint failures up to ``outage_wait_s``.

        The client's own retries cover a blip of a few seconds; an annotator restarting, a rate
        limit or an error body repeated for a minute would otherwise end the run (a transient
        drop leaves the stage uncommitted, so the user reruns). Pauses double from the first to
        the longest of ``outage_backoff_s`` and stop at the wait limit.
        """
        started = time.monotonic()
        pause, longest = self.outage_backoff_s
        while True:
            try:
                return await self._answer(request, attempt)
            except BackendError as e:
                left = self.outage_wait_s - (time.monotonic() - started)
                if backend_error_reason(e) not in TRANSIENT_REASONS or left <= 0:
                    raise
                self.counts["outage_waits"] += 1
                self._log_outage(e, left)
            # Outside the handler: the error (and its traceback, with the failed attempt's
            # frames and request body) is released before the wait, not after it.
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, longest)

    def _log_outage(self, error: BackendError, left: float) -> None:
        # Every request in flight meets the same outage: one line per 10 s, not one per request.
        now = time.monotonic()
        if now - self._outage_logged_at >= 10.0:
            self._outage_logged_at = now
            # The text, not the error: a handler that keeps records would keep its traceback.
            log.warning("annotator unavailable, waiting up to %.0f s more: %s", left, str(error))

    async def _answer(self, request: AnnotatorRequest, attempt: int) -> _Answer:
        # The cache key is also the request hash every record carries, for endpoint and offline
        # answers alike: it names the cache entry, and screenshots enter it by file digest, so
        # no frame's pixels are hashed.
        await self.file_digests(*_image_paths(request))
        key = cache_key(
            self.model, self.sampling.to_json(), self.frame, request, attempt, self.digest
        )
        use_cache = self.cache is not None
        if use_cache:
            hit = self.cache.get(key)  # type: ignore[union-attr]
            if hit is not None:
                self.counts["cache_hits"] += 1
                # The key, not the entry's stored hash: entries written by older versions hold
                # the client's pixel hash, and records must name requests one way only.
                truncated = hit.get("finish_reason") == "length"
                return _Answer(hit["text"], hit.get("reasoning"), key, truncated, *_usage(hit))
        if self.backend is None:
            assert self.offline_writer is not None
            try:
                text, reasoning = self.offline_writer(request.stage, request.oracle, attempt)
            except ValueError as e:
                # The ground truth itself cannot be rendered as a target (think tags in a
                # corpus intent, say): a data problem, dropped with its reason.
                raise OfflineAnswerError(str(e)) from e
            answer, finish = _Answer(text, reasoning, key, False), "stop"
        else:
            answer, finish = await self._send(request, key, attempt)
        self.counts["requests"] += 1
        if use_cache:
            entry = {
                "text": answer.text,
                "reasoning": answer.reasoning,
                "request_hash": answer.request_hash,
                "model": self.model,
                "finish_reason": finish,
                "usage": [answer.prompt_tokens, answer.completion_tokens],
            }
            self.cache.put(key, entry)  # type: ignore[union-attr]
        return answer

    async def file_digests(self, *paths: str) -> list[str]:
        """``digest`` of each screenshot, reading new files in a preparation thread.

        Hashing a full-size screenshot takes about a millisecond; on the event loop that would
        hold back every request in flight, so only digests already known are answered inline.
        """
        if not all(self.digest.known(p) for p in paths):
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._preparation_pool(), self._digest_all, paths)
        return [self.digest(p) for p in paths]

    def _digest_all(self, paths: tuple[str, ...]) -> None:
        for path in paths:
            self.digest(path)

    def _preparation_pool(self) -> ThreadPoolExecutor:
        if self._preparer is None:
            self._preparer = ThreadPoolExecutor(self.prepare_threads, "hivig-prepare")
        return self._preparer

    @property
    def jobs_in_flight(self) -> int:
        """How many stage coroutines should run at once: every request slot busy, plus
        ``prefetch`` requests whose frames are prepared while the slots wait on the network."""
        return self.concurrency + self.prefetch

    def _sampling_for(self, attempt: int) -> Sampling:
        """The sampling of one attempt: a retry after an invalid answer moves a set seed on.

        A server that honours ``seed`` answers the same request with the same seed the same
        way, so retrying with it would pay again for the answer just refused.
        """
        if attempt == 0 or self.sampling.seed is None:
            return self.sampling
        return dataclasses.replace(self.sampling, seed=self.sampling.seed + attempt)

    async def _send(self, request: AnnotatorRequest, key: str, attempt: int) -> tuple[_Answer, str]:
        assert self.backend is not None
        if self._slots is None or self._jobs is None:
            self._slots = PriorityGate(self.concurrency)
            self._jobs = PriorityGate(self.jobs_in_flight)
        rank = priority(request)
        # Decoding, resizing and encoding are CPU work done before taking a request slot, in a
        # worker thread: a slot then spends its time on the network only, and the event loop
        # stays free to overlap the other requests' waits. One thread per core: more only
        # fight over the cores (on 2 cores, 6 threads gave 0.87 of the ideal rate, 2 gave 0.90).
        # At most ``jobs_in_flight`` requests are prepared or in flight at once, so the
        # prepared frames of a whole shard never wait in memory together.
        loop = asyncio.get_running_loop()
        async with self._jobs.slot(rank):
            pool = self._preparation_pool()
            messages = await loop.run_in_executor(pool, self._prepare, request.messages)
            async with self._slots.slot(rank):
                gen = await self.backend.generate(
                    messages, self._sampling_for(attempt), request_hash=key
                )
        self.counts["prompt_tokens"] += gen.usage.prompt_tokens
        self.counts["completion_tokens"] += gen.usage.completion_tokens
        answer = _Answer(
            gen.text,
            gen.reasoning,
            gen.request_hash,
            gen.finish_reason == "length",
            gen.usage.prompt_tokens,
            gen.usage.completion_tokens,
        )
        return answer, gen.finish_reason

    def _prepare(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        ready = self._materialise(messages)
        if self._encodes_ahead:
            # The request goes out with the cache key as its name: no pixel digests needed.
            self.backend.prepare_images(ready, digests=False)  # type: ignore[union-attr]
        return ready

    def close(self) -> None:
        """Stop the preparation threads (the annotator may be used again afterwards)."""
        if self._preparer is not None:
            # Preparations still queued (a stage that failed) would only be thrown away.
            self._preparer.shutdown(wait=True, cancel_futures=True)
            self._preparer = None

    def warm(self, paths: list[str]) -> None:
        """Decode and resize screenshots into the frame store ahead of their requests."""
        for path in paths:
            self.prepared_frame(ImageRef(path))

    def _materialise(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        out = []
        for m in messages:
            parts: list[TextPart | ImagePart] = [
                ImagePart(self.prepared_frame(p.image))
                if isinstance(p, ImagePart) and isinstance(p.image, ImageRef)
                else p
                for p in m.content
            ]
            out.append(ChatMessage(m.role, parts))
        return out

    def prepared_frame(self, ref: ImageRef) -> Image.Image:
        """The canonical frame of a screenshot with its marks (same pixels as ``materialise``).

        The unmarked frame is prepared once per screenshot (it is the after-image of one step,
        the before-image of the next, and reappears in every later stage); a marked frame is
        drawn once per (screenshot, marks, size class) on it. Both come from the frame store,
        so repeated uses hand the client the same object.
        """
        base = self.frames.get(ref.path, lambda: self._canonical(ref.path))
        if not ref.marks:
            return base
        # Marks are frozen dataclasses: hashable as they are, no per-request serialisation.
        key = (ref.path, tuple(ref.marks), ref.size_class)
        return self.frames.get(key, lambda: draw_marks(base, ref.marks, ref.size_class).image)

    def _canonical(self, path_text: str) -> Image.Image:
        path = Path(path_text)
        return canonical_frame(
            path if path.is_absolute() else self.root / path,
            min_pixels=self.frame.min_pixels,
            max_pixels=self.frame.max_pixels,
            factor=self.frame.factor,
        )


# --------------------------------------------------------------------------------------------
# Offline writer: contract-valid answers from the ground truth (no model)


def offline_answer(stage: str, oracle: dict[str, Any], attempt: int) -> tuple[str, str | None]:
    """Render the offline annotator's answer for ``stage`` from its oracle.

    Deterministic: the same oracle always gives the same answer. Answers that become training
    targets (history, rationales) are rendered by ``hivig.contracts``; the others come as answer
    text plus separate reasoning, the way a reasoning model behind vLLM returns them. Raises
    ``KeyError`` for an unknown stage (a programming error, not a data problem).
    """
    return _OFFLINE[stage](oracle)


def _offline_grounding(o: dict[str, Any]) -> tuple[str, str | None]:
    # The sidecar's element at the click is the ground truth; without one there is nothing
    # honest to answer.
    if o.get("element") is None:
        raise OfflineAnswerError("no sidecar element at the click to ground it")
    return json.dumps(o["element"]), "The click lands on this element."


def _describe_target(o: dict[str, Any]) -> str:
    """What the step acts on, as the critic's screenshot shows it (``target_oracle``)."""
    if o.get("target"):
        return o["target"]
    if not o.get("has_point"):
        return "the screen as a whole"
    return "empty space under the marker" if o.get("marked") else "empty space at the call's point"


def _choose(o: dict[str, Any], salt: str, options: tuple[str, ...]) -> str:
    """One of ``options``, picked by a hash of the oracle (deterministic, varied per sample)."""
    blob = json.dumps(o, sort_keys=True, ensure_ascii=False, default=str) + salt
    return options[int(hashlib.sha256(blob.encode()).hexdigest(), 16) % len(options)]


def _names(pairs: list[list[str]]) -> str:
    # Content comes by kind ("further file entries"), controls by their visible label.
    labels = [
        f"'{label}'" if label else f"further {role_words(role)} entries" for label, role in pairs
    ]
    if not labels:
        return ""
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


def _next_state(o: dict[str, Any]) -> str:
    """The next state in the future tense, from what really appears and disappears."""
    appeared, vanished = o.get("appeared") or [], o.get("vanished") or []
    dialogs = [p for p in appeared if p[1] == "dialog"]
    busy = [p for p in vanished if p[1] == "progress"]
    calls = set(o.get("calls") or ())
    parts = []
    if dialogs:
        parts.append(
            _choose(o, "dialog", ("A {d} dialog will open.", "The {d} dialog will come up."))
        )
    elif appeared:
        parts.append(
            _choose(
                o,
                "appear",
                (
                    "{a} will appear on the screen.",
                    "The screen will newly show {a}.",
                    "{a} will come into view.",
                ),
            )
        )
    if busy:
        parts.append("The loading indicator will be gone.")
    elif vanished:
        parts.append(
            _choose(
                o,
                "vanish",
                ("{v} will no longer be shown.", "{v} will disappear.", "{v} will close."),
            )
        )
    if not parts and "type" in calls:
        parts.append("The typed text will fill the focused field.")
    if not parts and calls & {"scroll", "swipe", "hscroll"}:
        parts.append("The list will move and bring further entries into view.")
    if not parts:
        parts.append("The selection on the screen will change while the layout stays.")
    names = {"d": _names(dialogs), "a": _names(appeared), "v": _names(vanished)}
    sentences = [part.format(**names) for part in parts]
    return " ".join(t[0].upper() + t[1:] for t in sentences)


def _offline_transition(o: dict[str, Any]) -> tuple[str, str | None]:
    target = _describe_target(o)
    if o.get("terminal"):
        effect = "No structural change will follow; the episode ends on the current layout."
        state = "The task will end here and the screen will keep its current layout."
    elif o.get("no_change"):
        effect = "Nothing on the screen changed: no container, dialog or list moved."
        state = _choose(
            o,
            "same",
            (
                "The screen will remain visually unchanged after this step.",
                "No visible change will follow; the layout will stay as it is.",
                "The interface will look exactly the same afterwards.",
            ),
        )
    else:
        state = _next_state(o)
        effect = state.replace(" will ", " ")
    think = f"[Action Mechanism] The step acts on {target}.\n[Structural Effect] {effect}"
    return f"<next_state>\n{state}\n</next_state>", think


def _offline_history(o: dict[str, Any]) -> tuple[str, str | None]:
    # A masked step comes without its intent: the writer names it by its calls, never by
    # words the sample's input does not show.
    intent = f"'{o['intent']}'" if o.get("intent") else "the last step"
    done = list(o.get("done", []))
    progress = "; ".join(done[-6:]) if done else "No visible progress has been made yet."
    subject = intent[0].upper() + intent[1:]
    if o.get("no_change"):
        result = f"{subject} produced no visible change on the screen."
        verdict = "The screen did not change, so the step had no visible effect."
    else:
        result = (
            f"{intent[0].upper()}{intent[1:]} was carried out and the screen changed accordingly."
        )
        verdict = "The screen changed after the step, so the interface responded."
    think = (
        f"Comparing the two screenshots after {intent}. {verdict} "
        f"Progress towards the goal '{o.get('task', '')}' is summarised below."
    )
    return render_history_target(think, progress, result), None


def _offline_perturbation(o: dict[str, Any]) -> tuple[str, str | None]:
    obj = {
        "dimension_violated": o["dimension"],
        "rejected_thought": o["thought"],
        "rejected_proposed_step": o["bad_step_text"],
    }
    think = f"Chosen dimension: {o['dimension']}. Divergence: {o['note']}."
    return json.dumps(obj, ensure_ascii=False), think


def _offline_judge(o: dict[str, Any]) -> tuple[str, str | None]:
    obj = {
        "better_candidate": o["expert_slot"],
        "predicted_error_dimension": o["dimension"],
        "reasoning_summary": f"The other candidate shows {o['dimension']}: {o['note']}.",
    }
    think = f"Candidate {o['expert_slot']} matches the screen and the goal; the other does not."
    return json.dumps(obj, ensure_ascii=False), think


def _syntax_line(o: dict[str, Any]) -> str:
    validity = "Valid" if o.get("syntax_valid", True) else "Invalid"
    return f"Action String Check: {o['calls_text']} - Syntax is {validity}."


_GOOD_RULES = (
    "Acting on the element the step names is how this interface moves forward.",
    "The point sits on the element the step is about, so the interface responds as meant.",
    "The step works because the interface is ready and the call is well formed.",
    "This is the direct way this screen offers for the next part of the goal.",
)

_GOOD_RULES_NO_POINT = tuple(r for r in _GOOD_RULES if "point" not in r and "element" not in r)
"""For a step with no point (wait, type, key, terminate) nothing sits on an element."""

_LOOK = (
    "The step acts on {t}.",
    "Under the marker lies {t}.",
    "The call is aimed at {t}.",
)
_LOOK_UNMARKED = tuple(t for t in _LOOK if "marker" not in t)
"""Where no marker is drawn (a call with no point, or one the renderer cannot mark), a text
must not speak of one."""


def _look(o: dict[str, Any]) -> str:
    options = _LOOK if o.get("marked") else _LOOK_UNMARKED
    template = _choose(o, "look", options)
    target = _describe_target(o)
    if "marker" in template:  # "Under the marker lies empty space", not "... under the marker"
        target = target.removesuffix(" under the marker")
    return template.format(t=target)


def _offline_rationale_good(o: dict[str, Any]) -> tuple[str, str | None]:
    intent = o.get("intent")
    p1 = f"{_syntax_line(o)} " + _look(o)
    if intent:
        p1 += f" This agrees with the stated intent: {intent}"
    p2 = o.get("next_state") or "The interface will respond to the step."
    p3 = _choose(
        o,
        "good",
        (
            "That is what the task '{task}' needs at this point. Overall Grading: Good.",
            "This brings the task '{task}' a step closer to completion. Overall Grading: Good.",
            "The goal '{task}' moves forward with it. Overall Grading: Good.",
        ),
    ).format(task=o.get("task", ""))
    think = f"{p1}\n\n{p2}\n\n{p3}"
    rules = _GOOD_RULES if o.get("has_point") else _GOOD_RULES_NO_POINT
    explanation = f"{p2} {_choose(o, 'rule', rules)}"
    return render_critique_target(think, "Good", None, explanation), None


def _offline_rationale_bad(o: dict[str, Any]) -> tuple[str, str | None]:
    p1 = f"{_syntax_line(o)} " + _look(o)
    if o.get("intent"):
        p1 += f" The stated intent is: {o['intent']}"
    p2 = o["consequence"]
    p3 = _choose(
        o,
        "bad",
        (
            "Here {note}, which does not serve the task '{task}'.",
            "In this step {note}; the task '{task}' gains nothing from it.",
            "The problem is that {note}, so '{task}' does not move forward.",
        ),
    ).format(note=o["note"], task=o.get("task", ""))
    p3 += f" Overall Grading: Bad, Error Dimension: {o['dimension']}."
    think = f"{p1}\n\n{p2}\n\n{p3}"
    lead = _choose(
        o,
        "lead",
        (
            "The interface only responds as intended when {rule}.",
            "This kind of interaction works only when {rule}.",
            "Progress on this screen depends on this: {rule}.",
        ),
    ).format(rule=o["rule"])
    explanation = f"{p2} {lead}"
    return render_critique_target(think, "Bad", o["dimension"], explanation), None


_OFFLINE: dict[str, Callable[[dict[str, Any]], tuple[str, str | None]]] = {
    "transitions": _offline_transition,
    "history": _offline_history,
    "perturb": _offline_perturbation,
    "judge": _offline_judge,
    "rationale_good": _offline_rationale_good,
    "rationale_bad": _offline_rationale_bad,
    "grounding": _offline_grounding,
}
