"""The two critic calls: prompts from ``hivig``, a deadline, tolerant parsing, fail-open answers.

Prompts come from the builders that wrote the training data (``hivig.prompts``), screenshots
from the same canonical frame and marker code (``hivig.vision``), so the served input of a step
is the trained input token for token. Whatever goes wrong with the model (a timeout, a backend
error, output the parser cannot read) ends in an explicit degraded answer with a reason, never an
exception: a critic must not stall or crash an agent.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from PIL import Image

from hivig.backends import (
    BackendError,
    Generation,
    InferenceBackend,
    Sampling,
    backend_cancellable,
    content_hash,
    image_digest,
    messages_skeleton,
)
from hivig.contracts import (
    INITIAL_HISTORY,
    ContractError,
    CritiqueOutput,
    HistoryOutput,
    parse_critique,
    parse_history,
)
from hivig.messages import ChatMessage, ImagePart, ImageRef, Mark, mark_to_json
from hivig.profiles import GenerationBudget, Profile, default_profile, load_profile
from hivig.prompts import (
    CRITIC_PROMPTS,
    PromptMessages,
    build_critique_messages,
    build_history_messages,
    load_prompt,
    load_prompt_dir,
)
from hivig.vision import size_class_for_platform
from serve.config import ServeConfig
from serve.errors import ApiError
from serve.images import ImageStore
from serve.metrics import Metrics

logger = logging.getLogger(__name__)

_OPEN_CLOSE = {"summary": ("<summary>", "</summary>"), "criticism": ("<criticism>", "</criticism>")}


@dataclass
class ModelResult:
    """One model call and what became of it.

    Attributes:
        status: ``ok`` or ``degraded``.
        reason: Why it is degraded (``timeout``, ``backend``, ``parse``, ``truncated``).
        parsed: The parsed output when there is one (a truncated but complete answer keeps it).
        parse_status: ``ok``, ``repaired`` (a missing closing tag added) or ``failed``.
        raw_output: The model's answer text (reasoning split off), if any.
        reasoning: The reasoning, if any.
        truncated: The answer hit the token cap.
        usage: ``{"prompt", "completion"}`` token counts.
        model_ms: Milliseconds in the backend.
    """

    status: str = "ok"
    reason: str | None = None
    parsed: Any = None
    parse_status: str = "failed"
    raw_output: str | None = None
    reasoning: str | None = None
    truncated: bool = False
    usage: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "completion": 0})
    model_ms: float = 0.0


class QueueGate:
    """Bounds model calls in flight or waiting; past the bound a request is refused with 429.

    Each place is taken with the time by which it is expected back (its call's deadline), so a
    refusal's ``Retry-After`` says when the first place frees instead of a fixed second.
    """

    def __init__(self, limit: int, retry_after_s: int, metrics: Metrics) -> None:
        """At most ``limit`` model calls at once, gateway-wide; ``retry_after_s`` is the least
        ``Retry-After`` ever given."""
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.depth = 0
        self._places: dict[int, tuple[float, float]] = {}
        """Ticket -> (taken, deadline) on the monotonic clock."""
        self._typical_s: float | None = None
        self._tickets = 0
        self._metrics = metrics

    def check(self, n: int = 1) -> None:
        """Raise 429 ``overloaded`` unless ``n`` places are free now."""
        if self.depth + n > self.limit:
            raise ApiError(
                429,
                "overloaded",
                f"{self.depth} model calls queued (limit {self.limit}); retry later",
                {"Retry-After": str(self.retry_after())},
            )

    def retry_after(self) -> int:
        """Whole seconds until the first place is expected back (at least ``retry_after_s``).

        A place is expected back after the calls' recent typical duration, and at the latest at
        its deadline.
        """
        now = time.monotonic()
        typical = self._typical_s
        soonest = (
            min(
                (min(end, start + typical) if typical is not None else end)
                for start, end in self._places.values()
            )
            if self._places
            else now
        )
        return max(self.retry_after_s, math.ceil(soonest - now))

    def stuck(self) -> bool:
        """Whether every place is taken by a call past its deadline (a hung in-process model):
        nothing can be admitted until one really ends."""
        now = time.monotonic()
        full = self.depth >= self.limit
        return full and all(end < now for _, end in self._places.values())

    def enter(self, deadline_s: float) -> int:
        """Take a place expected back within ``deadline_s``, or raise 429; returns its ticket."""
        self.check(1)
        self._tickets += 1
        start = time.monotonic()
        self._places[self._tickets] = (start, start + deadline_s)
        self.depth += 1
        self._metrics.queue_depth.set(self.depth)
        return self._tickets

    def leave(self, ticket: int) -> None:
        """Give a place back (a second release of one ticket does nothing)."""
        place = self._places.pop(ticket, None)
        if place is None:
            return
        took = time.monotonic() - place[0]
        # A moving average of how long places are held: what the next refusal predicts.
        self._typical_s = took if self._typical_s is None else 0.8 * self._typical_s + 0.2 * took
        self.depth -= 1
        self._metrics.queue_depth.set(self.depth)


class BackendHealth:
    """Whether the backend is answering: ``failing`` after ``limit`` failed calls in a row.

    Readiness reads it. It heals by itself ``cooldown_s`` after the last failure, so a balancer
    that stopped routing here sends traffic again and a recovered backend is noticed.
    """

    def __init__(self, limit: int = 3, cooldown_s: float = 30.0) -> None:
        """Failing after ``limit`` consecutive failures, for ``cooldown_s`` after the last."""
        self.limit = limit
        self.cooldown_s = cooldown_s
        self.failures = 0
        self.last_reason = ""
        self._last_failure = 0.0

    def record(self, reason: str | None) -> None:
        """One call's outcome: ``None`` when the backend answered, else why it did not."""
        if reason is None:
            self.failures = 0
            return
        self.failures += 1
        self.last_reason = reason
        self._last_failure = time.monotonic()

    def failing(self) -> bool:
        """Whether the last ``limit`` calls failed, the latest within ``cooldown_s``."""
        recent = time.monotonic() - self._last_failure < self.cooldown_s
        return self.failures >= self.limit and recent


_SUMMARY_BLOCK = re.compile(r"<summary>\s*(.*?)\s*</summary>", re.DOTALL)


def _budget(cfg: ServeConfig) -> GenerationBudget:
    c = cfg.critic
    return GenerationBudget(
        c.history_max_tokens,
        c.critique_max_tokens,
        c.observe_deadline_s,
        c.critique_deadline_s,
        c.recurrence_note,
    )


class Critic:
    """Builds the critic's prompts and runs them on the backend with deadlines."""

    def __init__(
        self,
        backend: InferenceBackend,
        cfg: ServeConfig,
        images: ImageStore,
        metrics: Metrics,
        gate: QueueGate,
        profile: Profile | None = None,
    ) -> None:
        """A critic over ``backend``; its interface is ``profile`` (else ``cfg.critic.profile``),
        or the templates of ``cfg.critic.prompt_dir`` or of the package."""
        self.backend = backend
        self.cfg = cfg
        self.images = images
        self.metrics = metrics
        self.gate = gate
        self.health = BackendHealth()
        if profile is None and cfg.critic.profile:
            profile = load_profile(cfg.critic.profile)
        self.profile = profile
        if self.profile is not None:
            self.templates = dict(self.profile.templates)
        elif cfg.critic.prompt_dir:
            self.templates = load_prompt_dir(cfg.critic.prompt_dir, CRITIC_PROMPTS)
        else:
            self.templates = {name: load_prompt(name) for name in CRITIC_PROMPTS}
        self.budget = self.profile.generation if self.profile is not None else _budget(cfg)

    @property
    def initial_summary(self) -> str:
        """The previous summary of a session's first history update."""
        return self.profile.initial_summary if self.profile else INITIAL_HISTORY.summary

    def summary_to_feed(self, raw_output: str | None) -> str:
        """What the next history update reads of this one's answer, beyond the parsed record:
        the model's text inside ``<summary>`` verbatim under ``summary_feedback: inner``, else
        nothing (the record is re-written from its two fields)."""
        if self.profile is None or self.profile.render.summary_feedback != "inner":
            return ""
        match = _SUMMARY_BLOCK.search(raw_output or "")
        return match.group(1).strip() if match else ""

    def profile_info(self) -> dict[str, str]:
        """The profile served: its name and digest (``hivig-v1`` for the package's own)."""
        profile = self.profile or default_profile()
        return {"name": profile.name, "digest": profile.digest}

    @property
    def recurrence_note(self) -> bool:
        """Whether the recurrence note may be added to the critique's trajectory text."""
        return self.budget.recurrence_note

    @property
    def prompt_version(self) -> str:
        """Ids of the two templates served, e.g. ``critic_history_v1+critic_critique_v1``."""
        return "+".join(self.templates[n].id for n in CRITIC_PROMPTS)

    # -- prompts -------------------------------------------------------------------------------

    def history_messages(
        self, task: str, platform: str, previous: str, before: str, after: str, step: str
    ) -> PromptMessages:
        """The history update's prompt; images as ``ImageRef(image_ref)``."""
        size = size_class_for_platform(platform)
        return build_history_messages(
            task,
            platform,
            previous,
            ImageRef(before, (), size),
            ImageRef(after, (), size),
            step,
            template=self.templates["critic_history"],
            profile=self.profile,
        )

    def critique_messages(
        self, task: str, platform: str, trajectory: str, image: str, marks: list[Mark], step: str
    ) -> PromptMessages:
        """The verdict's prompt; the screenshot carries the proposed step's marks."""
        shot = ImageRef(image, tuple(marks), size_class_for_platform(platform))
        return build_critique_messages(
            task,
            platform,
            trajectory,
            shot,
            step,
            template=self.templates["critic_critique"],
            profile=self.profile,
        )

    def materialise(self, messages: list[ChatMessage]) -> list[ChatMessage]:
        """Image refs -> canonical frames with their marks (cached clean frames, copied)."""
        # ``_frame`` always gives a frame (or raises), so a list comes back.
        return cast(list[ChatMessage], _with_frames(messages, self._frame))

    def _cached_frames(self, messages: PromptMessages) -> list[ChatMessage] | None:
        """``materialise`` where it is only lookups (unmarked frames, all in memory, as in a
        history update), which cost less than the thread hop; ``None`` otherwise."""
        return _with_frames(
            messages, lambda ref: None if ref.marks else self.images.cached_frame(ref.path)
        )

    def _frame(self, ref: ImageRef) -> Image.Image:
        return self.images.marked_frame(ref)

    # -- calls ---------------------------------------------------------------------------------

    async def history(self, messages: PromptMessages) -> ModelResult:
        """Run a history update; ``parsed`` is a ``HistoryOutput`` when it worked."""
        b = self.budget
        return await self._call(
            "observe", messages, b.history_max_tokens, b.observe_deadline_s, "summary"
        )

    async def critique(self, messages: PromptMessages) -> ModelResult:
        """Run a verdict; ``parsed`` is a ``CritiqueOutput`` when it worked."""
        b = self.budget
        return await self._call(
            "critique", messages, b.critique_max_tokens, b.critique_deadline_s, "criticism"
        )

    async def _call(
        self, call: str, messages: PromptMessages, max_tokens: int, deadline: float, tag: str
    ) -> ModelResult:
        s = self.cfg.backend.sampling
        sampling = Sampling(
            temperature=s.temperature, top_p=s.top_p, max_tokens=max_tokens, seed=s.seed
        )
        start = time.perf_counter()
        ticket = self.gate.enter(deadline)
        work = asyncio.ensure_future(self._generate(messages, sampling))
        # The place in the queue is given back when the backend is really done: an in-process
        # model keeps computing after the caller gave up, and a queue that forgot it would admit
        # more work than the model can ever take. A remote call is cancelled at the deadline
        # instead, so a stalled server does not hold every place until its own timeout.
        work.add_done_callback(lambda w: self._release(w, ticket))
        try:
            gen = await asyncio.wait_for(asyncio.shield(work), deadline)
        except (asyncio.TimeoutError, TimeoutError):
            if backend_cancellable(self.backend):
                work.cancel()
            return self._degraded(call, "timeout", start)
        except ApiError as e:  # a screenshot of the prompt is gone (evicted, another gateway)
            logger.warning("%s: %s", call, e.message)
            return self._degraded(call, "missing_image", start)
        except BackendError as e:
            logger.warning("%s: backend error: %s", call, e)
            return self._degraded(call, "backend", start)
        except Exception:  # fail open on anything the backend throws
            logger.exception("%s: unexpected backend failure", call)
            return self._degraded(call, "backend", start)
        return self._parse(call, gen, tag, start)

    async def _generate(self, messages: PromptMessages, sampling: Sampling) -> Generation:
        frames = self._cached_frames(messages)
        if frames is None:  # marks to draw or a frame to read back: on an image thread
            loop = asyncio.get_running_loop()
            frames = await loop.run_in_executor(self.images.pool, self.materialise, list(messages))
        rhash = request_key(self.cfg.backend.model, messages, sampling)
        return await self.backend.generate(frames, sampling, request_hash=rhash)

    def _release(self, work: asyncio.Future[Generation], ticket: int) -> None:
        self.gate.leave(ticket)
        if not work.cancelled():
            work.exception()  # retrieved: an answer that came after the deadline is dropped

    def _degraded(self, call: str, reason: str, start: float) -> ModelResult:
        if reason in ("timeout", "backend"):
            self.health.record(reason)
        self.metrics.degraded.labels(call, reason).inc()
        return ModelResult(status="degraded", reason=reason, model_ms=_ms(start))

    def _parse(self, call: str, gen: Generation, tag: str, start: float) -> ModelResult:
        self.health.record(None)  # the backend answered, whatever the answer says
        parse = parse_history if tag == "summary" else parse_critique
        parsed: HistoryOutput | CritiqueOutput | ContractError = parse(gen.text, gen.reasoning)
        status = "ok"
        if isinstance(parsed, ContractError):
            repaired = _repair(gen.text, tag)
            parsed = parse(repaired, gen.reasoning) if repaired is not None else parsed
            status = "repaired" if not isinstance(parsed, ContractError) else "failed"
        self.metrics.parse.labels(call, status).inc()
        self.metrics.tokens.labels("prompt").inc(gen.usage.prompt_tokens)
        self.metrics.tokens.labels("completion").inc(gen.usage.completion_tokens)
        self.metrics.model_latency.labels(call).observe(gen.latency_s)
        result = ModelResult(
            parse_status=status,
            raw_output=gen.text,
            reasoning=gen.reasoning,
            truncated=gen.truncated,
            usage={"prompt": gen.usage.prompt_tokens, "completion": gen.usage.completion_tokens},
            model_ms=_ms(start),
        )
        if isinstance(parsed, ContractError):
            reason = "truncated" if gen.truncated else "parse"
            self.metrics.degraded.labels(call, reason).inc()
            result.status, result.reason = "degraded", reason
            return result
        result.parsed = parsed
        if gen.truncated:
            # The answer block was complete although the cap was hit: keep it, flag it.
            result.status, result.reason = "degraded", "truncated"
            self.metrics.degraded.labels(call, "truncated").inc()
        return result


def _with_frames(
    messages: Sequence[ChatMessage], frame_of: Callable[[ImageRef], Image.Image | None]
) -> list[ChatMessage] | None:
    """``messages`` with each ``ImageRef`` part replaced by ``frame_of(ref)``; ``None`` as soon
    as that gives ``None``."""
    out = []
    for message in messages:
        content: list[Any] = []
        for part in message.content:
            if isinstance(part, ImagePart) and isinstance(part.image, ImageRef):
                frame = frame_of(part.image)
                if frame is None:
                    return None
                part = ImagePart(frame)
            content.append(part)
        out.append(ChatMessage(role=message.role, content=content))
    return out


def request_key(model: str, messages: PromptMessages, sampling: Sampling) -> str:
    """Content address of a critic request from image references, marks and text.

    Screens are named by their references (``serve.images``), so no frame is hashed again per
    request.
    """
    doc = {
        "model": model,
        "sampling": [sampling.temperature, sampling.top_p, sampling.max_tokens],
        "messages": messages_skeleton(messages, _stored_name),
    }
    return content_hash(doc)


def _stored_name(part: ImagePart) -> dict[str, Any]:
    ref = part.image
    if isinstance(ref, ImageRef):
        marks = [mark_to_json(m) for m in ref.marks]
        return {"image_ref": ref.path, "marks": marks, "size_class": ref.size_class}
    # The gateway names its screens by reference; an image handed over whole is named by its
    # pixels, so the key never fails a request.
    return {"image_sha256": image_digest(ref)}


def _repair(text: str, tag: str) -> str | None:
    """One repair: close an answer block the model opened but did not close."""
    open_tag, close_tag = _OPEN_CLOSE[tag]
    lower = text.lower()
    if open_tag in lower and close_tag not in lower:
        return text.rstrip() + "\n" + close_tag
    head, sep, answer = text.rpartition("</think>")
    if open_tag not in lower and re.search(r"Overall Grading:|Progress Summary:", answer):
        return f"{head}{sep}\n{open_tag}\n{answer.strip()}\n{close_tag}"
    return None


def _ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 2)
