"""Fail-open HTTP client for the critic gateway (API v1), sync and async.

``CriticClient.start(...)`` opens a gateway session; ``Session.observe`` sends each new screen
and the action that led to it, ``Session.critique`` judges a proposed action. Nothing here raises
into the agent loop: a timeout, an HTTP error, a garbled reply or an open circuit breaker gives an
explicit result, ``Verdict(verdict="abstain", reason=...)`` or ``Observation(status="stale",
reason=...)`` with the last history kept, and the agent proceeds with its own action.

The request logic is written once, as generators that yield ``_Call`` objects and receive
``_Reply`` objects; so is each call's transport (``_call_flow``: the breaker, the attempts, the
pauses between them and the deadline), which yields ``_Attempt`` and ``_Pause`` steps.
``CriticClient`` and ``AsyncCriticClient`` only drive both over ``httpx.Client`` and
``httpx.AsyncClient``, sleeping with ``time.sleep`` or ``asyncio.sleep``. That is how one
sequence (observe, the session lost, re-created from its echo, observe again) behaves the same
in both.

Transport rules: connect timeout 2 s; a deadline per call that covers its retries; one retry
with jitter on transport errors, 429 (within the deadline, honouring ``Retry-After``), 502, 503
and 504; a circuit breaker opens after 5 consecutive failures for 60 s, then lets one probe
through.

Deadlines. The gateway answers an observe or a critique within its own deadline
(``critic.*_deadline_s``), degraded if the model is late. The client waits that deadline plus
``deadline_grace_s`` (2 s of network and request handling), so the gateway's degraded answer
arrives before the client gives up. The gateway's deadlines are read from ``GET /v1/info`` when
the first session is created (8 s, the gateway's default, until then); an explicit
``observe_deadline_s`` / ``critique_deadline_s`` replaces them, and the grace is still added.

The breaker is for a gateway that is down or unreachable: connect errors, 5xx, garbled replies,
and calls that got no answer although the client waited the gateway's deadline out. A timeout
the client struck before the gateway's deadline (its own deadline set shorter) says nothing about
the gateway: it neither counts nor resets the run of failures.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import numbers
import random
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import httpx

from serve.ranking import rank

log = logging.getLogger(__name__)

ImageInput = bytes | str
"""PNG/JPEG bytes, a base64 string (``data:`` URL prefix allowed) or an ``image_ref``."""

ActionInput = dict[str, Any] | str
"""An API action object, or the policy's raw action text."""

ReseedStatus = Literal["rebuilt", "untouched", "lost"]
"""Outcome of ``Session.reseed_status``."""

_RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Failures that say the gateway is unwell (they count towards the breaker); request-specific
# errors (400, 404, 409, 413, 422) prove it is alive and answering.
_BREAKER_CODES = frozenset({"timeout", "transport", "bad_response"})
_REASON_BY_CODE = {
    "backend_unavailable": "backend",
    "overloaded": "overloaded",
    "unauthorized": "unauthorized",
    "bad_image": "bad_image",
    "image_too_large": "image_too_large",
    "bad_request": "bad_request",
    "bad_action": "bad_action",
    "step_conflict": "step_conflict",
    "unknown_session": "unknown_session",
    "unknown_image_ref": "unknown_image_ref",
}
# 413: the next resend shrinks the image by this factor per side.
_SHRINK = 0.5


@dataclass(frozen=True)
class ClientConfig:
    """Client limits and switches (all YAML-able).

    Attributes:
        base_url: Gateway root, e.g. ``http://127.0.0.1:8080``.
        token: Bearer token, when the gateway has auth on.
        connect_timeout_s: TCP connect timeout of each attempt.
        observe_deadline_s: How long the gateway may take over one observe, in seconds;
            ``None`` (default): the gateway's own ``critic.observe_deadline_s``, read from
            ``/v1/info``. The client waits this plus ``deadline_grace_s``, retries included.
        critique_deadline_s: The same for one critique (``critic.critique_deadline_s``).
        deadline_grace_s: Seconds the client waits beyond the gateway's deadline (network,
            image decoding, queueing), so the gateway's degraded answer is not thrown away.
        session_deadline_s: Total time for session create/close and job calls.
        retries: Extra attempts after a retryable failure (transport, 429, 502-504).
        retry_jitter_s: Upper end of the random pause before a retry.
        breaker_failures: Consecutive failures that open the circuit breaker.
        breaker_open_s: How long the breaker stays open before one probe is let through.
        resend_smaller: On 413, shrink the screenshot once and resend it.
    """

    base_url: str = "http://127.0.0.1:8080"
    token: str | None = None
    connect_timeout_s: float = 2.0
    observe_deadline_s: float | None = None
    critique_deadline_s: float | None = None
    deadline_grace_s: float = 2.0
    session_deadline_s: float = 8.0
    retries: int = 1
    retry_jitter_s: float = 0.25
    breaker_failures: int = 5
    breaker_open_s: float = 60.0
    resend_smaller: bool = True

    def __post_init__(self) -> None:
        limits = [
            self.connect_timeout_s,
            self.observe_deadline_s,
            self.critique_deadline_s,
            self.session_deadline_s,
        ]
        if min(v for v in limits if v is not None) <= 0 or self.deadline_grace_s < 0:
            raise ValueError("client: timeouts and deadlines > 0, deadline_grace_s >= 0")
        if self.retries < 0 or self.retry_jitter_s < 0:
            raise ValueError("client: retries and jitter >= 0")
        if self.breaker_failures < 1 or self.breaker_open_s < 0:
            raise ValueError("client: breaker_failures >= 1, breaker_open_s >= 0")


# ---------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class History:
    """The gateway's macro history of the episode (what the policy is shown)."""

    progress_summary: str = ""
    last_action_result: str = ""
    version: int = 0
    stale: bool = False

    def text(self) -> str:
        """The history as one block of prompt text (empty before the first update)."""
        parts = []
        if self.progress_summary:
            parts.append(f"Progress so far: {self.progress_summary}")
        if self.last_action_result:
            parts.append(f"Result of the last action: {self.last_action_result}")
        return "\n".join(parts)


@dataclass(frozen=True)
class Recovery:
    """A ReTrace recovery target the gateway proposes (return to an earlier intact screen)."""

    target_step: int
    target_image_ref: str
    reason: str = ""
    brief: str = ""


@dataclass(frozen=True)
class Observation:
    """The reply to ``Session.observe``; ``ok`` is False when the client failed open.

    Attributes:
        step_idx: The step observed.
        status: ``ok`` / ``degraded`` (gateway) or ``stale`` (the client failed open).
        reason: Why it is degraded or stale (``timeout``, ``circuit_open``, ``backend``, ...).
        history: The updated history; on failure the last known one, flagged ``stale``.
        image_ref: The stored screen's reference (``None`` on failure).
        change: The change detector's output (``no_effect``, ``identical``, ...), ``None`` at k=0.
        recurrence: The recurrence detector's output (``r3_trigger``, ``screen_key``, ...).
        recovery: A recovery target, when the gateway proposes one.
        body: The full reply, for logs.
    """

    step_idx: int
    status: str
    reason: str | None
    history: History
    image_ref: str | None = None
    change: dict[str, Any] | None = None
    recurrence: dict[str, Any] = field(default_factory=dict)
    recovery: Recovery | None = None
    body: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        """Whether the gateway answered (``ok`` or ``degraded``)."""
        return self.status != "stale"

    @property
    def r3_trigger(self) -> bool:
        """Whether the recurrence detector asks for R3."""
        return bool(self.recurrence.get("r3_trigger"))

    @property
    def no_effect(self) -> bool | None:
        """Whether the last action changed nothing (``None`` when unknown)."""
        if not self.change or "no_effect" not in self.change:
            return None
        return bool(self.change["no_effect"])

    @property
    def screen_key(self) -> str | None:
        """The screen's fingerprint key (recurrence), else its image_ref."""
        return self.recurrence.get("screen_key") or self.image_ref


@dataclass(frozen=True)
class Verdict:
    """The critic's judgement of one proposed action.

    ``verdict`` is ``good``, ``bad`` or ``abstain``; an abstention always carries ``reason``.
    ``source`` is ``model``/``rule``/``fallback`` from the gateway, ``client`` when the client
    failed open.
    """

    verdict: str
    status: str = "ok"
    source: str = "model"
    reason: str | None = None
    error_dimension: str | None = None
    explanation: str = ""
    thinking: str | None = None
    confidence: float | None = None
    marker: dict[str, Any] | None = None
    parse_status: str = "ok"
    truncated: bool = False
    history_version: int | None = None
    annotated_image: str | None = field(default=None, repr=False)
    body: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_bad(self) -> bool:
        """True only for a definite ``bad`` (abstentions never block)."""
        return self.verdict == "bad"

    @property
    def is_good(self) -> bool:
        """True for ``good``."""
        return self.verdict == "good"

    @property
    def abstained(self) -> bool:
        """True when the critic gave no judgement."""
        return self.verdict == "abstain"


@dataclass(frozen=True)
class Ranking:
    """The reply to a critique with ``candidates``: one verdict per candidate and their order."""

    results: tuple[Verdict, ...]
    ranking: tuple[int, ...]
    status: str = "ok"
    reason: str | None = None

    @property
    def best(self) -> int | None:
        """Index of the first-ranked candidate (``None`` without candidates)."""
        return self.ranking[0] if self.ranking else None


@dataclass(frozen=True)
class Job:
    """A diagnosis job; ``status`` is ``pending``, ``done`` or ``failed``."""

    job_id: str | None
    status: str
    result: dict[str, Any] | None = None
    reason: str | None = None


def abstain(reason: str, explanation: str = "") -> Verdict:
    """The explicit fail-open verdict."""
    return Verdict(
        verdict="abstain",
        status="degraded",
        source="client",
        reason=reason,
        explanation=explanation,
        parse_status="failed",
    )


# ---------------------------------------------------------------------------------------------
# Parsing replies (garbage -> None)


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _history(obj: Any, fallback: History) -> History:
    obj = _as_dict(obj)
    if not obj:
        return fallback
    version = obj.get("version")
    return History(
        progress_summary=str(obj.get("progress_summary") or ""),
        last_action_result=str(obj.get("last_action_result") or ""),
        version=version if isinstance(version, int) else fallback.version,
        stale=bool(obj.get("stale", False)),
    )


def _recovery(obj: Any) -> Recovery | None:
    obj = _as_dict(obj)
    step, ref = obj.get("target_step"), obj.get("target_image_ref")
    if not isinstance(step, int) or not isinstance(ref, str):
        return None
    return Recovery(step, ref, str(obj.get("reason") or ""), str(obj.get("brief") or ""))


def parse_observation(body: Any, step_idx: int, last: History) -> Observation | None:
    """An ``Observation`` from a reply body, or ``None`` when the body is not one."""
    if not isinstance(body, dict) or not isinstance(body.get("history"), dict):
        return None
    status = body.get("status", "ok")
    if status not in ("ok", "degraded"):
        return None
    change = body.get("change")
    step = body.get("step_idx")
    return Observation(
        step_idx=step if isinstance(step, int) else step_idx,
        status=status,
        reason=_str(body, "reason"),
        history=_history(body["history"], last),
        image_ref=_str(body, "image_ref"),
        change=change if isinstance(change, dict) else None,
        recurrence=_as_dict(body.get("recurrence")),
        recovery=_recovery(body.get("recovery")),
        body=body,
    )


def parse_verdict(body: Any) -> Verdict | None:
    """A ``Verdict`` from a reply body, or ``None`` when the body is not one."""
    if not isinstance(body, dict) or body.get("verdict") not in ("good", "bad", "abstain"):
        return None
    version = body.get("history_version")
    reason = _str(body, "reason")
    if body["verdict"] == "abstain" and reason is None:
        reason = "unspecified"  # abstentions are always explicit about why
    return Verdict(
        verdict=body["verdict"],
        status=str(body.get("status", "ok")),
        source=str(body.get("source", "model")),
        reason=reason,
        error_dimension=_str(body, "error_dimension"),
        explanation=str(body.get("explanation") or ""),
        thinking=_str(body, "thinking"),
        confidence=_number(body.get("confidence")),
        marker=body.get("marker") if isinstance(body.get("marker"), dict) else None,
        parse_status=str(body.get("parse_status", "ok")),
        truncated=bool(body.get("truncated", False)),
        history_version=version if isinstance(version, int) else None,
        annotated_image=_str(body, "annotated_image"),
        body=body,
    )


def parse_ranking(body: Any, n: int) -> Ranking | None:
    """A ``Ranking`` of ``n`` candidates from a reply body, or ``None``."""
    if not isinstance(body, dict) or not isinstance(body.get("results"), list):
        return None
    results = [parse_verdict(r) for r in body["results"]]
    if len(results) != n or any(r is None for r in results):
        return None
    ranking = body.get("ranking")
    # A ranking of anything but the n indices (mixed types, bools, repeats) is discarded on
    # its own; the verdicts are still good and are ranked here instead.
    valid = (
        isinstance(ranking, list)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in ranking)
        and sorted(ranking) == list(range(n))
    )
    order = tuple(ranking) if valid else tuple(rank_verdicts(results))  # type: ignore[arg-type]
    return Ranking(tuple(results), order, status=str(body.get("status", "ok")))  # type: ignore[arg-type]


def rank_verdicts(verdicts: list[Verdict] | tuple[Verdict, ...]) -> list[int]:
    """Candidate indices best first, by the gateway's own ranking (``serve.ranking.rank``)."""
    return rank([(v.verdict, v.confidence) for v in verdicts])


# ---------------------------------------------------------------------------------------------
# Transport: calls, replies, breaker


@dataclass(frozen=True)
class _Call:
    """One request: ``deadline_s`` bounds it with its retries; ``gateway_deadline_s`` is the
    time within which the gateway answers it, degraded if need be (0: the route sets none);
    ``counted``: whether its outcome counts for the breaker (not for ``/v1/info``, which only
    informs the client)."""

    method: str
    path: str
    body: dict[str, Any] | None
    deadline_s: float
    gateway_deadline_s: float = 0.0
    counted: bool = True


@dataclass(frozen=True)
class _Reply:
    """One call's outcome: an HTTP reply (``status`` > 0) or a client-side failure code."""

    status: int
    body: Any = None
    code: str | None = None
    message: str = ""
    retry_after: float | None = None
    cut_short: bool = False
    """A client-side timeout struck before the gateway's own deadline for the call was out."""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and isinstance(self.body, dict)

    @property
    def reason(self) -> str:
        """The fail-open reason this reply stands for."""
        if self.code in _REASON_BY_CODE:
            return _REASON_BY_CODE[self.code]
        if self.code == "timeout" or self.status == 504:
            return "timeout"
        if self.status >= 500:
            return "backend"
        return self.code or f"http_{self.status}"


def _reply_of(resp: httpx.Response) -> _Reply:
    try:
        body = resp.json()
    except ValueError:
        body = None
    retry_after = None
    header = resp.headers.get("retry-after")
    if header is not None:
        try:
            retry_after = max(float(header), 0.0)
        except ValueError:
            retry_after = None
    if 200 <= resp.status_code < 300:
        if not isinstance(body, dict):
            return _Reply(resp.status_code, None, "bad_response", "reply is not a JSON object")
        return _Reply(resp.status_code, body)
    error = _as_dict(_as_dict(body).get("error"))
    code = error.get("code") if isinstance(error.get("code"), str) else None
    return _Reply(resp.status_code, body, code, str(error.get("message") or ""), retry_after)


class CircuitBreaker:
    """Opens after ``failures`` consecutive failures for ``open_s`` seconds, then half-opens:
    one probe call goes through, its outcome closes or re-opens the breaker. A probe not
    recorded within ``probe_timeout_s`` expires and the next call probes instead.

    Thread-safe; ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        failures: int = 5,
        open_s: float = 60.0,
        clock: Any = time.monotonic,
        probe_timeout_s: float = 10.0,
    ):
        self.failures = failures
        self.open_s = open_s
        self.probe_timeout_s = probe_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._count = 0
        self._open_until: float | None = None
        self._probing = False
        self._probe_since = 0.0

    @property
    def state(self) -> Literal["closed", "open", "half_open"]:
        """``closed``, ``open`` or ``half_open``."""
        with self._lock:
            if self._open_until is None:
                return "closed"
            return "open" if self._clock() < self._open_until else "half_open"

    def allow(self) -> bool:
        """Whether a call may go out now (a half-open breaker lets exactly one through)."""
        with self._lock:
            if self._open_until is None:
                return True
            now = self._clock()
            if now < self._open_until:
                return False
            # A probe whose outcome never came back (its caller was cancelled or crashed
            # between allow() and record()) expires after the deadline, so the breaker
            # cannot stay half-open with nothing let through.
            if self._probing and now - self._probe_since < self.probe_timeout_s:
                return False
            self._probing, self._probe_since = True, now
            return True

    def record(self, failed: bool | None) -> None:
        """Count one call's outcome: ``True`` a failure, ``False`` a success, ``None`` no
        evidence either way (the run of failures is kept; a probe is given back, so the next
        call probes)."""
        with self._lock:
            self._probing = False
            if failed is None:
                return
            if not failed:
                self._count, self._open_until = 0, None
                return
            self._count += 1
            if self._open_until is not None or self._count >= self.failures:
                if self._open_until is None:
                    log.warning("critic circuit breaker open for %.0f s", self.open_s)
                self._open_until = self._clock() + self.open_s


def _failed(reply: _Reply) -> bool | None:
    """What ``reply`` says about the gateway, for the breaker (see ``CircuitBreaker.record``).

    A timeout the client struck before the gateway's deadline is ``None``: the gateway would
    have answered (degraded at worst), so it proves nothing, and counting it would open the
    breaker on a live gateway whenever its backend stalls.
    """
    if reply.cut_short:
        return None
    return reply.code in _BREAKER_CODES or reply.status >= 500 or reply.status in (401, 429)


def _retry_pause(reply: _Reply, attempt: int, remaining: float, cfg: ClientConfig) -> float | None:
    """Seconds to wait before retrying ``reply``, or ``None`` for no retry."""
    if attempt >= cfg.retries:
        return None
    if reply.code not in ("timeout", "transport") and reply.status not in _RETRY_STATUSES:
        return None
    pause = random.uniform(0.0, cfg.retry_jitter_s)
    if reply.status == 429 and reply.retry_after is not None:
        pause = max(pause, reply.retry_after)
    # Retry only when the pause leaves time for a connect at least.
    return pause if pause + min(cfg.connect_timeout_s, 0.05) < remaining else None


@dataclass(frozen=True)
class _Attempt:
    """Send ``call`` once; ``timeout_s`` is what is left of its deadline (bounds this try)."""

    call: _Call
    timeout_s: float


@dataclass(frozen=True)
class _Pause:
    """Sleep ``seconds`` before the next attempt (jitter, or the 429's ``Retry-After``)."""

    seconds: float


# The async driver bounds each attempt with ``asyncio.wait_for``, whose expiry is a timeout too.
_ASYNC_TIMEOUTS = (httpx.TimeoutException, asyncio.TimeoutError)

CallFlow = Generator[_Attempt | _Pause, Any, _Reply]
"""One call's transport: yields steps, is sent each attempt's ``httpx.Response`` (``None``
after a pause) or has the step's exception thrown in, and returns the call's ``_Reply``."""


def _call_flow(
    call: _Call,
    cfg: ClientConfig,
    breaker: CircuitBreaker,
    timeouts: tuple[type[BaseException], ...] = (httpx.TimeoutException,),
    clock: Any = time.monotonic,
) -> CallFlow:
    """Breaker, retries and deadline of one call, with no I/O (the client drivers do it).

    ``timeouts`` are the exceptions that mean "this attempt timed out" (the async driver adds
    the one its own ``wait_for`` raises). The breaker counts the call once, after its retries,
    by what its last attempt proved (``_failed``); anything else that interrupts it (a cancelled
    task, a body that cannot be encoded) counts as a failure and propagates, so a half-open probe
    never stays in flight. A call that is not ``counted`` only gives a probe back.
    """
    if not breaker.allow():
        return _Reply(0, None, "circuit_open", "circuit breaker open")
    try:
        reply = yield from _attempts_flow(call, cfg, timeouts, clock)
    except BaseException:
        breaker.record(True if call.counted else None)
        raise
    breaker.record(_failed(reply) if call.counted else None)
    return reply


def _attempts_flow(
    call: _Call, cfg: ClientConfig, timeouts: tuple[type[BaseException], ...], clock: Any
) -> CallFlow:
    """Attempts of ``call`` until one needs no retry, the retries run out or the deadline does."""
    end = clock() + call.deadline_s
    attempt = 0
    reply: _Reply | None = None
    while True:
        remaining = end - clock()
        if remaining <= 0:
            # Out of time after a pause: the last attempt is the call's evidence.
            cut = reply is not None and reply.cut_short
            return _Reply(0, None, "timeout", "deadline exceeded", cut_short=cut)
        try:
            reply = _reply_of((yield _Attempt(call, remaining)))
        except timeouts as exc:
            # A connect timeout means unreachable; a read timeout before the gateway's own
            # deadline only means the client stopped waiting first.
            cut = not isinstance(exc, httpx.ConnectTimeout) and remaining < call.gateway_deadline_s
            reply = _Reply(0, None, "timeout", str(exc), cut_short=cut)
        except httpx.HTTPError as exc:
            reply = _Reply(0, None, "transport", str(exc))
        pause = _retry_pause(reply, attempt, end - clock(), cfg)
        if pause is None:
            return reply
        attempt += 1
        yield _Pause(pause)


def _timeout(cfg: ClientConfig, remaining: float) -> httpx.Timeout:
    return httpx.Timeout(remaining, connect=min(cfg.connect_timeout_s, remaining))


def _headers(cfg: ClientConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {}


def _breaker(cfg: ClientConfig) -> CircuitBreaker:
    """The client's breaker; an unrecorded probe expires after the longest call deadline."""
    deadline = max(_Deadlines(cfg).longest_s(), cfg.session_deadline_s)
    return CircuitBreaker(cfg.breaker_failures, cfg.breaker_open_s, probe_timeout_s=deadline)


_GATEWAY_DEADLINE_S = 8.0
"""The gateway's default ``critic.*_deadline_s``: assumed until ``/v1/info`` says otherwise."""

_MODEL_CALLS = ("observe", "critique")


class _Deadlines:
    """The deadlines of a client's model calls: the gateway's own (learned from ``/v1/info``)
    and what the client waits. One per client; its sessions share it."""

    def __init__(self, cfg: ClientConfig) -> None:
        self.cfg = cfg
        self.gateway: dict[str, float] = {}
        """The gateway's deadlines by call, once ``/v1/info`` gave them."""
        self.asked = False
        """Whether the gateway answered ``/v1/info`` (an old one without it: keep the defaults)."""

    def learn(self, reply: _Reply) -> None:
        """Take the gateway's ``deadlines_s`` from a ``/v1/info`` reply."""
        if reply.status not in (200, 404, 405):
            return  # no answer, or a passing refusal (429, 5xx): ask again next time
        self.asked = True
        table = _as_dict(_as_dict(reply.body).get("deadlines_s")) if reply.ok else {}
        for kind in _MODEL_CALLS:
            value = _number(table.get(kind))
            if value is not None and value > 0:
                self.gateway[kind] = value

    def gateway_s(self, kind: str) -> float:
        """The gateway's deadline for ``kind`` as this client knows it."""
        own = getattr(self.cfg, f"{kind}_deadline_s")
        return self.gateway.get(kind, own if own is not None else _GATEWAY_DEADLINE_S)

    def wait_s(self, kind: str) -> float:
        """What the client waits for a ``kind`` call, retries included."""
        own = getattr(self.cfg, f"{kind}_deadline_s")
        budget = own if own is not None else self.gateway.get(kind, _GATEWAY_DEADLINE_S)
        return budget + self.cfg.deadline_grace_s

    def longest_s(self) -> float:
        return max(self.wait_s(kind) for kind in _MODEL_CALLS)

    def call(self, kind: str, method: str, path: str, body: dict[str, Any] | None) -> _Call:
        """A ``kind`` call (``observe`` or ``critique``) with both deadlines."""
        return _Call(method, path, body, self.wait_s(kind), self.gateway_s(kind))


# ---------------------------------------------------------------------------------------------
# Payload helpers


def image_field(image: ImageInput) -> dict[str, str]:
    """The API image field for bytes, a base64 string or an ``image_ref``."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return {"screenshot": base64.b64encode(bytes(image)).decode("ascii")}
    if isinstance(image, str) and image.startswith("sha256:"):
        return {"image_ref": image}
    return {"screenshot": str(image)}


def _shrunk(image: ImageInput) -> bytes | None:
    """The screenshot at half size as PNG, for one resend after 413; ``None`` if impossible."""
    if not isinstance(image, (bytes, bytearray, memoryview)):
        return None
    try:
        # Deferred: the image stack is only needed on this rare path.
        from hivig.vision import encode_png, load_image

        img = load_image(bytes(image))
        w, h = max(1, int(img.width * _SHRINK)), max(1, int(img.height * _SHRINK))
        return encode_png(img.resize((w, h)))
    except Exception as exc:  # noqa: BLE001 - any failure means "cannot shrink", fail open
        log.warning("cannot shrink the screenshot for resend: %s", exc)
        return None


def action_field(action: ActionInput, action_format: str = "auto") -> dict[str, Any]:
    """An API action object: dicts pass through, text becomes ``{"raw", "format"}``."""
    if isinstance(action, dict):
        return action
    return {"raw": str(action), "format": action_format}


# ---------------------------------------------------------------------------------------------
# Session state and the request flows (shared by the sync and async sessions)

Flow = Generator[_Call, _Reply, Any]


class _SessionState:
    """What a session remembers to survive a gateway loss: its create body, the last echo, the
    last history, the last observe request (its screenshot inline) and the latest step."""

    def __init__(
        self, cfg: ClientConfig, create_body: dict[str, Any], deadlines: _Deadlines
    ) -> None:
        self.cfg = cfg
        self.create_body = create_body
        self.deadlines = deadlines
        self.session_id: str | None = None
        self.echo: dict[str, Any] | None = None
        self.history = History()
        self.last_observe: dict[str, Any] | None = None
        self.latest_step: int | None = None
        self.closed = False
        self.lost = False
        """The gateway's session is known to be gone (a reseed closed it): re-create first."""
        self.recreated = 0
        self.failures: dict[str, int] = {}

    # -- bookkeeping --------------------------------------------------------------------

    def _note(self, body: dict[str, Any]) -> None:
        echo = body.get("echo")
        if isinstance(echo, dict):
            self.echo = echo

    def _count(self, reason: str) -> None:
        self.failures[reason] = self.failures.get(reason, 0) + 1
        log.info("critic failed open (%s)", reason)

    def stale(self, step_idx: int, reason: str) -> Observation:
        """The fail-open observation: the last history, flagged stale."""
        self._count(reason)
        return Observation(step_idx, "stale", reason, replace(self.history, stale=True))

    def abstain(self, reason: str, message: str = "") -> Verdict:
        self._count(reason)
        return abstain(reason, message)

    def abstain_all(self, n: int, reason: str) -> Ranking:
        self._count(reason)
        results = tuple(abstain(reason) for _ in range(n))
        return Ranking(results, tuple(range(n)), status="degraded", reason=reason)

    # -- flows --------------------------------------------------------------------------

    def create_flow(self, count: bool = True) -> Flow:
        """Create (or re-create, with the known id and echo) the gateway session."""
        body = dict(self.create_body)
        if self.session_id is not None:
            body["session_id"] = self.session_id
        if self.echo is not None:
            body["echo"] = self.echo
        reply = yield _Call("POST", "/v1/sessions", body, self.cfg.session_deadline_s)
        sid = _as_dict(reply.body).get("session_id") if reply.ok else None
        if not isinstance(sid, str) or not sid:
            return reply if not reply.ok else _Reply(reply.status, None, "bad_response")
        if self.session_id is not None and count:
            self.recreated += 1
            log.info("critic session %s re-created from its echo", sid)
        self.session_id = sid
        self.lost = False
        self._note(reply.body)
        if not self.deadlines.asked:
            # Once per client, and only after the gateway answered: a gateway that is down
            # is not waited for twice per session.
            info = yield _Call("GET", "/v1/info", None, self.cfg.session_deadline_s, counted=False)
            self.deadlines.learn(info)
        return None

    def _observe_body(self, step_idx: int, image: ImageInput, prev: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"step_idx": step_idx, **image_field(image)}
        if prev is not None:
            body["prev_action"] = action_field(prev, self.create_body.get("action_format", "auto"))
        return body

    def _send_observe(self, body: dict[str, Any]) -> Flow:
        """POST an observe body, handling a lost session, a step conflict and a 413 once each."""
        path = f"/v1/sessions/{self.session_id}/observe"
        reply = yield self.deadlines.call("observe", "POST", path, body)
        handled: set[str] = set()
        while not reply.ok and reply.code not in handled:
            code = reply.code or ""
            handled.add(code)
            if code == "unknown_session":
                failed = yield from self.create_flow()
                if failed is not None:
                    return failed
                path = f"/v1/sessions/{self.session_id}/observe"
            elif code == "step_conflict":
                body = {**body, "force": True}
            elif code == "image_too_large" and self.cfg.resend_smaller:
                smaller = _shrunk(body.pop("_image", None) or b"")
                if smaller is None:
                    break
                body = {**body, **image_field(smaller)}
            else:
                break
            reply = yield self.deadlines.call("observe", "POST", path, body)
        return reply

    def observe_flow(self, step_idx: int, image: ImageInput, prev: Any) -> Flow:
        if self.closed:
            return self.stale(step_idx, "closed")
        if image is None or (isinstance(image, (bytes, str)) and not image):
            return self.stale(step_idx, "no_image")  # nothing to judge; the agent goes on
        body = self._observe_body(step_idx, image, prev)
        self.last_observe = body  # kept even if this call fails: a later critique replays it
        if self.session_id is None or self.lost:
            failed = yield from self.create_flow()
            if failed is not None:
                return self.stale(step_idx, failed.reason)
        reply = yield from self._send_observe({**body, "_image": image})
        if not reply.ok:
            return self.stale(step_idx, reply.reason)
        obs = parse_observation(reply.body, step_idx, self.history)
        if obs is None:
            return self.stale(step_idx, "bad_response")
        self._note(reply.body)
        self.history = obs.history
        self.latest_step = step_idx
        return obs

    def _replayable(self, step_idx: int) -> bool:
        """Whether the last observe sent is the one of ``step_idx`` (so it can be replayed)."""
        return bool(self.last_observe) and self.last_observe.get("step_idx") == step_idx

    def _inline(self) -> dict[str, Any]:
        """The last observed screen as an inline image field (empty if it was a reference)."""
        shot = (self.last_observe or {}).get("screenshot")
        return {"screenshot": shot} if isinstance(shot, str) and shot else {}

    def _critique_path(self) -> str:
        return f"/v1/sessions/{self.session_id}/critique"

    def critique_flow(
        self,
        step_idx: int,
        action: ActionInput | None,
        candidates: list[ActionInput] | None,
        image: ImageInput | None,
        extra: dict[str, Any],
    ) -> Flow:
        n = len(candidates) if candidates else 0

        def fail(reason: str, message: str = "") -> Verdict | Ranking:
            return self.abstain_all(n, reason) if candidates else self.abstain(reason, message)

        if self.closed:
            return fail("closed")
        if action is None and not candidates:
            return fail("bad_action", "no action to critique")
        fmt = self.create_body.get("action_format", "auto")
        body: dict[str, Any] = {"step_idx": step_idx, **extra}
        if candidates:
            body["candidates"] = [action_field(c, fmt) for c in candidates]
        else:
            body["action"] = action_field(action, fmt)  # type: ignore[arg-type]
        if image is not None:
            body.update(image_field(image))
        if self.session_id is None or self.lost:
            failed = yield from self.create_flow()
            if failed is not None:
                return fail(failed.reason)
        reply = yield self.deadlines.call("critique", "POST", self._critique_path(), body)
        handled: set[str] = set()
        while not reply.ok and reply.code not in handled:
            code = reply.code or ""
            handled.add(code)
            if code == "unknown_session":
                # Re-created from the echo, which covers the latest observed step.
                failed = yield from self.create_flow()
                if failed is not None:
                    return fail(failed.reason)
            elif code == "unknown_image_ref" and "image_ref" in body and self._inline():
                body = {k: v for k, v in body.items() if k != "image_ref"} | self._inline()
            elif code in ("step_conflict", "unknown_image_ref") and self._replayable(step_idx):
                # The gateway lacks the screen being judged: replay its observe.
                replay = yield from self._send_observe({**self.last_observe, "force": True})
                if not replay.ok:
                    return fail(replay.reason)
            else:
                break
            reply = yield self.deadlines.call("critique", "POST", self._critique_path(), body)
        if not reply.ok:
            return fail(reply.reason, reply.message)
        self._note(reply.body)
        parsed = parse_ranking(reply.body, n) if candidates else parse_verdict(reply.body)
        return parsed if parsed is not None else fail("bad_response")

    def reseed_flow(self, echo: dict[str, Any]) -> Flow:
        """Replace the gateway's history of this session with an earlier ``echo``.

        The gateway keeps an open session as it is when asked to create it again, so the
        session is closed first and then re-created under the same id, seeded with ``echo``
        (the create is tried twice). Returns ``rebuilt``; ``untouched`` when the close failed
        (the gateway's session is as it was); ``lost`` when the session was closed but could
        not be re-created: the client then keeps its current echo, so the next call re-creates
        the session as it was before the reseed (never from ``echo`` with a step gap).
        """
        if self.closed or self.session_id is None or not isinstance(echo, dict):
            return "untouched"
        reply = yield _Call(
            "DELETE", f"/v1/sessions/{self.session_id}", None, self.cfg.session_deadline_s
        )
        if not reply.ok and reply.code != "unknown_session":
            return "untouched"
        previous, self.echo = self.echo, echo
        done = False
        try:
            failed = yield from self.create_flow(count=False)
            if failed is not None:
                failed = yield from self.create_flow(count=False)
            done = failed is None
        finally:
            # Also when the flow is abandoned mid-way (an error, a cancelled task).
            if not done:
                self.echo = previous
                self.lost = True  # re-created from ``previous`` before the next call
        if failed is not None:
            log.warning("critic session closed for a reseed but not re-created (%s)", failed.reason)
            return "lost"
        step = echo.get("step_idx")
        self.latest_step = step if isinstance(step, int) else None
        self.last_observe = None  # the replayable screen is the next observe's
        if isinstance(_as_dict(echo.get("summary")).get("progress_summary"), str):
            self.history = _history(echo["summary"], self.history)
        return "rebuilt"

    def close_flow(self, outcome: str | None = None) -> Flow:
        if self.closed or self.session_id is None:
            self.closed = True
            return False
        query = f"?outcome={outcome}" if outcome else ""
        reply = yield _Call(
            "DELETE", f"/v1/sessions/{self.session_id}{query}", None, self.cfg.session_deadline_s
        )
        # Closed once the gateway has it (or no longer knows the session); after a failed
        # close the caller may close again, so an outcome is not lost to one bad moment.
        self.closed = reply.ok or reply.status == 404
        return reply.ok


def _check_outcome(outcome: str | None) -> None:
    if outcome not in (None, "success", "failure"):
        raise ValueError(f"outcome must be success, failure or None, got {outcome!r}")


def _reseed_fallback(state: _SessionState) -> ReseedStatus:
    """An unexpected error mid-reseed: re-create the session before the next call (from the
    echo the client holds), which is right whether or not the close went through."""
    state.lost = state.session_id is not None and not state.closed
    return "lost" if state.lost else "untouched"


def _ready_flow(cfg: ClientConfig) -> Flow:
    reply = yield _Call("GET", "/readyz", None, cfg.session_deadline_s)
    return reply.ok


def _diagnose_flow(cfg: ClientConfig, path: str) -> Flow:
    reply = yield _Call("POST", "/v1/diagnose", {"path": str(path)}, cfg.session_deadline_s)
    job_id = _as_dict(reply.body).get("job_id") if reply.ok else None
    if not isinstance(job_id, str):
        return Job(None, "failed", reason=reply.reason if not reply.ok else "bad_response")
    return Job(job_id, "pending")


def _job_flow(cfg: ClientConfig, job_id: str) -> Flow:
    reply = yield _Call("GET", f"/v1/jobs/{job_id}", None, cfg.session_deadline_s)
    status = _as_dict(reply.body).get("status") if reply.ok else None
    if status not in ("pending", "done", "failed"):
        return Job(job_id, "failed", reason=reply.reason if not reply.ok else "bad_response")
    result = reply.body.get("result")
    return Job(job_id, status, result if isinstance(result, dict) else None)


def _session_body(
    task: str,
    platform: str,
    screen: tuple[int, int] | dict[str, int],
    coord_space: str,
    frame: tuple[int, int] | dict[str, int] | None,
    action_format: str,
    policy_id: str | None,
    volatile_regions: list[list[int]] | None,
) -> dict[str, Any]:
    def size(value: Any) -> dict[str, int]:
        if isinstance(value, dict):
            return {"w": int(value["w"]), "h": int(value["h"])}
        return {"w": int(value[0]), "h": int(value[1])}

    body: dict[str, Any] = {
        "task": task,
        "platform": platform,
        "screen": size(screen),
        "coord_space": coord_space,
        "action_format": action_format,
    }
    if frame is not None:
        body["frame"] = size(frame)
    if policy_id is not None:
        body["policy_id"] = policy_id
    if volatile_regions:
        body["volatile_regions"] = [list(r) for r in volatile_regions]
    return body


# ---------------------------------------------------------------------------------------------
# Sync client


class CriticClient:
    """Synchronous gateway client over one persistent ``httpx.Client``.

    Args:
        base_url: Gateway root; overrides ``config.base_url`` when given.
        config: Limits and switches.
        token: Bearer token; overrides ``config.token`` when given.
        transport: An ``httpx`` transport (tests pass ``httpx.MockTransport``).
        breaker: A shared ``CircuitBreaker`` (one per client by default).
    """

    def __init__(
        self,
        base_url: str | None = None,
        config: ClientConfig | None = None,
        *,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        cfg = config or ClientConfig()
        if base_url is not None:
            cfg = replace(cfg, base_url=base_url)
        if token is not None:
            cfg = replace(cfg, token=token)
        self.config = cfg
        self.breaker = breaker or _breaker(cfg)
        self._deadlines = _Deadlines(cfg)
        self._http = httpx.Client(
            base_url=cfg.base_url,
            headers=_headers(cfg),
            timeout=_timeout(cfg, self._deadlines.longest_s()),
            transport=transport,
        )

    # -- transport ----------------------------------------------------------------------

    def _send(self, call: _Call) -> _Reply:
        """Drive ``_call_flow`` over ``httpx.Client``: the flow decides, this only does I/O."""
        flow = _call_flow(call, self.config, self.breaker)
        try:
            step = next(flow)
            while True:
                try:
                    outcome = self._perform(step)
                except BaseException as exc:  # noqa: BLE001 - the flow records it, re-raises
                    step = flow.throw(exc)
                else:
                    step = flow.send(outcome)
        except StopIteration as stop:
            return stop.value

    def _perform(self, step: _Attempt | _Pause) -> httpx.Response | None:
        if isinstance(step, _Pause):
            time.sleep(step.seconds)
            return None
        call = step.call
        timeout = _timeout(self.config, step.timeout_s)
        return self._http.request(call.method, call.path, json=call.body, timeout=timeout)

    def _drive(self, flow: Flow, fallback: Any) -> Any:
        """Run a flow to its result; any unexpected error gives ``fallback()`` (fail open)."""
        try:
            call = next(flow)
            while True:
                call = flow.send(self._send(_strip(call)))
        except StopIteration as stop:
            return stop.value
        except Exception:  # noqa: BLE001 - the agent loop must never see a client error
            log.exception("critic client error; failing open")
            return fallback()

    # -- API ----------------------------------------------------------------------------

    def start(
        self,
        task: str,
        platform: str,
        screen: tuple[int, int] | dict[str, int],
        coord_space: str = "screen_px",
        *,
        frame: tuple[int, int] | dict[str, int] | None = None,
        action_format: str = "auto",
        policy_id: str | None = None,
        volatile_regions: list[list[int]] | None = None,
    ) -> Session:
        """Open a session. Never raises: when the gateway is down, the session is created
        lazily at the next call (and that call fails open until it is)."""
        body = _session_body(
            task, platform, screen, coord_space, frame, action_format, policy_id, volatile_regions
        )
        session = Session(self, _SessionState(self.config, body, self._deadlines))
        self._drive(session._state.create_flow(), lambda: None)
        return session

    def ready(self) -> bool:
        """Whether the gateway reports ready (``GET /readyz``); False on any failure."""
        return bool(self._drive(_ready_flow(self.config), lambda: False))

    def diagnose(self, path: str) -> Job:
        """Start a diagnosis of a trace / OSWorld result folder / trajectories file."""
        return self._drive(
            _diagnose_flow(self.config, path), lambda: Job(None, "failed", None, "client_error")
        )

    def job(self, job_id: str) -> Job:
        """Poll a diagnosis job."""
        return self._drive(
            _job_flow(self.config, job_id), lambda: Job(job_id, "failed", None, "client_error")
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> CriticClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _strip(call: _Call) -> _Call:
    """Drop private keys (``_image``: the caller's original screenshot) and make the body
    JSON-safe (numpy scalars from an adapter's action become Python numbers) before sending."""
    if not call.body:
        return call
    body = {k: v for k, v in call.body.items() if not k.startswith("_")}
    return replace(call, body=json_safe(body))


def json_safe(value: Any) -> Any:
    """``value`` with numpy-style scalars and arrays turned into Python numbers and lists.

    Anything else is left alone (the HTTP layer reports what still cannot be encoded).
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    tolist = getattr(value, "tolist", None)  # numpy bool_, arrays and other scalars
    if callable(tolist):
        try:
            return json_safe(tolist())
        except Exception:  # noqa: BLE001 - not numpy after all: leave it to the encoder
            return value
    return value


class Session:
    """One episode's gateway session (sync). Every method fails open."""

    def __init__(self, client: CriticClient, state: _SessionState) -> None:
        self._client = client
        self._state = state

    @property
    def session_id(self) -> str | None:
        """The gateway's id (``None`` while the gateway could not be reached)."""
        return self._state.session_id

    @property
    def history(self) -> History:
        """The last history received."""
        return self._state.history

    @property
    def echo(self) -> dict[str, Any] | None:
        """The last echo received (what a lost session is re-created from)."""
        return self._state.echo

    @property
    def failures(self) -> dict[str, int]:
        """Fail-open counts by reason."""
        return dict(self._state.failures)

    @property
    def recreated(self) -> int:
        """How many times the session was re-created after a gateway loss."""
        return self._state.recreated

    def observe(
        self, step_idx: int, png: ImageInput, prev_action: ActionInput | None = None
    ) -> Observation:
        """Send screen ``step_idx`` and the action executed at ``step_idx - 1``."""
        st = self._state
        return self._client._drive(
            st.observe_flow(step_idx, png, prev_action), lambda: st.stale(step_idx, "client_error")
        )

    def critique(
        self,
        step_idx: int,
        action: ActionInput | None = None,
        candidates: list[ActionInput] | None = None,
        *,
        png: ImageInput | None = None,
        return_image: bool = False,
        return_thinking: bool = False,
    ) -> Verdict | Ranking:
        """Judge ``action`` (a ``Verdict``) or all ``candidates`` (a ``Ranking``) at the latest
        observed step."""
        st = self._state
        extra = {"return_image": return_image, "return_thinking": return_thinking}
        n = len(candidates) if candidates else 0

        def fallback() -> Verdict | Ranking:
            return st.abstain_all(n, "client_error") if n else st.abstain("client_error")

        return self._client._drive(
            st.critique_flow(step_idx, action, candidates, png, extra), fallback
        )

    def reseed(self, echo: dict[str, Any]) -> bool:
        """Replace the gateway's history with an earlier ``echo`` (R3 Restore); True on
        success. The next observe continues from ``echo["step_idx"] + 1``."""
        return self.reseed_status(echo) == "rebuilt"

    def reseed_status(self, echo: dict[str, Any]) -> ReseedStatus:
        """``reseed`` with its three outcomes: ``rebuilt`` (continue from the echo's step),
        ``untouched`` (the gateway's history is as it was) or ``lost`` (the session is
        re-created as it was before the reseed at the next call; numbering unchanged)."""
        st = self._state
        return self._client._drive(st.reseed_flow(echo), lambda: _reseed_fallback(st))

    def close(self, outcome: str | None = None) -> bool:
        """Close the gateway session; True when the gateway confirmed.

        Args:
            outcome: ``success`` or ``failure``: the task's evaluated outcome, recorded in the
                session's trace for ``data_gen ingest-runs`` (leave it out when unknown).
        """
        _check_outcome(outcome)
        return bool(self._client._drive(self._state.close_flow(outcome), lambda: False))


# ---------------------------------------------------------------------------------------------
# Async client


class AsyncCriticClient:
    """Asynchronous gateway client over one persistent ``httpx.AsyncClient`` (same arguments
    and behaviour as ``CriticClient``)."""

    def __init__(
        self,
        base_url: str | None = None,
        config: ClientConfig | None = None,
        *,
        token: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        cfg = config or ClientConfig()
        if base_url is not None:
            cfg = replace(cfg, base_url=base_url)
        if token is not None:
            cfg = replace(cfg, token=token)
        self.config = cfg
        self.breaker = breaker or _breaker(cfg)
        self._deadlines = _Deadlines(cfg)
        self._http = httpx.AsyncClient(
            base_url=cfg.base_url,
            headers=_headers(cfg),
            timeout=_timeout(cfg, self._deadlines.longest_s()),
            transport=transport,
        )

    async def _send(self, call: _Call) -> _Reply:
        """Drive ``_call_flow`` over ``httpx.AsyncClient`` (the same loop as the sync one)."""
        flow = _call_flow(call, self.config, self.breaker, _ASYNC_TIMEOUTS)
        try:
            step = next(flow)
            while True:
                try:
                    outcome = await self._perform(step)
                except BaseException as exc:  # noqa: BLE001 - the flow records it, re-raises
                    step = flow.throw(exc)
                else:
                    step = flow.send(outcome)
        except StopIteration as stop:
            return stop.value

    async def _perform(self, step: _Attempt | _Pause) -> httpx.Response | None:
        if isinstance(step, _Pause):
            await asyncio.sleep(step.seconds)
            return None
        call = step.call
        timeout = _timeout(self.config, step.timeout_s)
        request = self._http.request(call.method, call.path, json=call.body, timeout=timeout)
        # wait_for bounds the whole attempt, including a transport that ignores timeouts.
        return await asyncio.wait_for(request, step.timeout_s)

    async def _drive(self, flow: Flow, fallback: Any) -> Any:
        try:
            call = next(flow)
            while True:
                call = flow.send(await self._send(_strip(call)))
        except StopIteration as stop:
            return stop.value
        except Exception:  # noqa: BLE001 - the agent loop must never see a client error
            log.exception("critic client error; failing open")
            return fallback()

    async def start(
        self,
        task: str,
        platform: str,
        screen: tuple[int, int] | dict[str, int],
        coord_space: str = "screen_px",
        *,
        frame: tuple[int, int] | dict[str, int] | None = None,
        action_format: str = "auto",
        policy_id: str | None = None,
        volatile_regions: list[list[int]] | None = None,
    ) -> AsyncSession:
        """Open a session (see ``CriticClient.start``)."""
        body = _session_body(
            task, platform, screen, coord_space, frame, action_format, policy_id, volatile_regions
        )
        session = AsyncSession(self, _SessionState(self.config, body, self._deadlines))
        await self._drive(session._state.create_flow(), lambda: None)
        return session

    async def ready(self) -> bool:
        """Whether the gateway reports ready; False on any failure."""
        return bool(await self._drive(_ready_flow(self.config), lambda: False))

    async def diagnose(self, path: str) -> Job:
        """Start a diagnosis job."""
        return await self._drive(
            _diagnose_flow(self.config, path), lambda: Job(None, "failed", None, "client_error")
        )

    async def job(self, job_id: str) -> Job:
        """Poll a diagnosis job."""
        return await self._drive(
            _job_flow(self.config, job_id), lambda: Job(job_id, "failed", None, "client_error")
        )

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCriticClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncSession:
    """One episode's gateway session (async); same methods as ``Session``, awaitable."""

    def __init__(self, client: AsyncCriticClient, state: _SessionState) -> None:
        self._client = client
        self._state = state

    @property
    def session_id(self) -> str | None:
        """The gateway's id."""
        return self._state.session_id

    @property
    def history(self) -> History:
        """The last history received."""
        return self._state.history

    @property
    def echo(self) -> dict[str, Any] | None:
        """The last echo received."""
        return self._state.echo

    @property
    def failures(self) -> dict[str, int]:
        """Fail-open counts by reason."""
        return dict(self._state.failures)

    @property
    def recreated(self) -> int:
        """How many times the session was re-created."""
        return self._state.recreated

    async def observe(
        self, step_idx: int, png: ImageInput, prev_action: ActionInput | None = None
    ) -> Observation:
        """See ``Session.observe``."""
        st = self._state
        return await self._client._drive(
            st.observe_flow(step_idx, png, prev_action), lambda: st.stale(step_idx, "client_error")
        )

    async def critique(
        self,
        step_idx: int,
        action: ActionInput | None = None,
        candidates: list[ActionInput] | None = None,
        *,
        png: ImageInput | None = None,
        return_image: bool = False,
        return_thinking: bool = False,
    ) -> Verdict | Ranking:
        """See ``Session.critique``."""
        st = self._state
        extra = {"return_image": return_image, "return_thinking": return_thinking}
        n = len(candidates) if candidates else 0

        def fallback() -> Verdict | Ranking:
            return st.abstain_all(n, "client_error") if n else st.abstain("client_error")

        return await self._client._drive(
            st.critique_flow(step_idx, action, candidates, png, extra), fallback
        )

    async def reseed(self, echo: dict[str, Any]) -> bool:
        """See ``Session.reseed``."""
        return await self.reseed_status(echo) == "rebuilt"

    async def reseed_status(self, echo: dict[str, Any]) -> ReseedStatus:
        """See ``Session.reseed_status``."""
        st = self._state
        return await self._client._drive(st.reseed_flow(echo), lambda: _reseed_fallback(st))

    async def close(self, outcome: str | None = None) -> bool:
        """See ``Session.close``."""
        _check_outcome(outcome)
        return bool(await self._client._drive(self._state.close_flow(outcome), lambda: False))
