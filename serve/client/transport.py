"""One call to the gateway: its request and reply, the circuit breaker, retries and deadlines.

``call_flow`` is a call's transport as a generator with no I/O: it yields ``Attempt`` and
``Pause`` steps, is sent each attempt's ``httpx.Response`` (or has its exception thrown in) and
returns the call's ``Reply``. The sync and async clients drive it over their own ``httpx``
client, so both retry, pause and count failures alike.

Transport rules: connect timeout 2 s; a deadline per call that covers its retries; one retry
with jitter on transport errors, 429 (within the deadline, honouring ``Retry-After``), 502, 503
and 504; a circuit breaker opens after 5 consecutive failures for 60 s, then lets one probe
through.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from serve.client.config import ClientConfig
from serve.client.results import as_dict, as_number

# One logger for the whole client package: runners set its level under one name.
log = logging.getLogger("serve.client")

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


@dataclass(frozen=True)
class Call:
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
class Reply:
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


def reply_of(resp: httpx.Response) -> Reply:
    """The ``Reply`` of an HTTP response: a JSON object, or the error shape's code and message."""
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
            return Reply(resp.status_code, None, "bad_response", "reply is not a JSON object")
        return Reply(resp.status_code, body)
    error = as_dict(as_dict(body).get("error"))
    code = error.get("code") if isinstance(error.get("code"), str) else None
    return Reply(resp.status_code, body, code, str(error.get("message") or ""), retry_after)


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


def _failed(reply: Reply) -> bool | None:
    """What ``reply`` says about the gateway, for the breaker (see ``CircuitBreaker.record``).

    A timeout the client struck before the gateway's deadline is ``None``: the gateway would
    have answered (degraded at worst), so it proves nothing, and counting it would open the
    breaker on a live gateway whenever its backend stalls.
    """
    if reply.cut_short:
        return None
    return reply.code in _BREAKER_CODES or reply.status >= 500 or reply.status in (401, 429)


def _retry_pause(reply: Reply, attempt: int, remaining: float, cfg: ClientConfig) -> float | None:
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
class Attempt:
    """Send ``call`` once; ``timeout_s`` is what is left of its deadline (bounds this try)."""

    call: Call
    timeout_s: float


@dataclass(frozen=True)
class Pause:
    """Sleep ``seconds`` before the next attempt (jitter, or the 429's ``Retry-After``)."""

    seconds: float


ASYNC_TIMEOUTS = (httpx.TimeoutException, asyncio.TimeoutError)
"""What times an async attempt out: ``httpx``'s timeouts and the expiry of the
``asyncio.wait_for`` the async driver bounds each attempt with."""

CallFlow = Generator[Attempt | Pause, Any, Reply]
"""One call's transport: yields steps, is sent each attempt's ``httpx.Response`` (``None``
after a pause) or has the step's exception thrown in, and returns the call's ``Reply``."""


def call_flow(
    call: Call,
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
        return Reply(0, None, "circuit_open", "circuit breaker open")
    try:
        reply = yield from _attempts_flow(call, cfg, timeouts, clock)
    except BaseException:
        breaker.record(True if call.counted else None)
        raise
    breaker.record(_failed(reply) if call.counted else None)
    return reply


def _attempts_flow(
    call: Call, cfg: ClientConfig, timeouts: tuple[type[BaseException], ...], clock: Any
) -> CallFlow:
    """Attempts of ``call`` until one needs no retry, the retries run out or the deadline does."""
    end = clock() + call.deadline_s
    attempt = 0
    reply: Reply | None = None
    while True:
        remaining = end - clock()
        if remaining <= 0:
            # Out of time after a pause: the last attempt is the call's evidence.
            cut = reply is not None and reply.cut_short
            return Reply(0, None, "timeout", "deadline exceeded", cut_short=cut)
        try:
            reply = reply_of((yield Attempt(call, remaining)))
        except timeouts as exc:
            # A connect timeout means unreachable; a read timeout before the gateway's own
            # deadline only means the client stopped waiting first.
            cut = not isinstance(exc, httpx.ConnectTimeout) and remaining < call.gateway_deadline_s
            reply = Reply(0, None, "timeout", str(exc), cut_short=cut)
        except httpx.HTTPError as exc:
            reply = Reply(0, None, "transport", str(exc))
        pause = _retry_pause(reply, attempt, end - clock(), cfg)
        if pause is None:
            return reply
        attempt += 1
        yield Pause(pause)


def http_timeout(cfg: ClientConfig, remaining: float) -> httpx.Timeout:
    """The ``httpx`` timeout of an attempt with ``remaining`` seconds of its call's deadline."""
    return httpx.Timeout(remaining, connect=min(cfg.connect_timeout_s, remaining))


# ---------------------------------------------------------------------------------------------
# Deadlines

GATEWAY_DEADLINE_S = 8.0
"""The gateway's default ``critic.*_deadline_s``: assumed until ``/v1/info`` says otherwise."""

_MODEL_CALLS = ("observe", "critique")


class Deadlines:
    """The deadlines of a client's model calls: the gateway's own (learned from ``/v1/info``)
    and what the client waits. One per client; its sessions share it."""

    def __init__(self, cfg: ClientConfig) -> None:
        self.cfg = cfg
        self.gateway: dict[str, float] = {}
        """The gateway's deadlines by call, once ``/v1/info`` gave them."""
        self.asked = False
        """Whether the gateway answered ``/v1/info`` (an old one without it: keep the defaults)."""

    def learn(self, reply: Reply) -> None:
        """Take the gateway's ``deadlines_s`` from a ``/v1/info`` reply."""
        if reply.status not in (200, 404, 405):
            return  # no answer, or a passing refusal (429, 5xx): ask again next time
        self.asked = True
        table = as_dict(as_dict(reply.body).get("deadlines_s")) if reply.ok else {}
        for kind in _MODEL_CALLS:
            value = as_number(table.get(kind))
            if value is not None and value > 0:
                self.gateway[kind] = value

    def gateway_s(self, kind: str) -> float:
        """The gateway's deadline for ``kind`` as this client knows it."""
        own = getattr(self.cfg, f"{kind}_deadline_s")
        return self.gateway.get(kind, own if own is not None else GATEWAY_DEADLINE_S)

    def wait_s(self, kind: str) -> float:
        """What the client waits for a ``kind`` call, retries included."""
        own = getattr(self.cfg, f"{kind}_deadline_s")
        budget = own if own is not None else self.gateway.get(kind, GATEWAY_DEADLINE_S)
        return budget + self.cfg.deadline_grace_s

    def longest_s(self) -> float:
        """The longest a model call is waited for."""
        return max(self.wait_s(kind) for kind in _MODEL_CALLS)

    def call(self, kind: str, method: str, path: str, body: dict[str, Any] | None) -> Call:
        """A ``kind`` call (``observe`` or ``critique``) with both deadlines."""
        return Call(method, path, body, self.wait_s(kind), self.gateway_s(kind))


# ---------------------------------------------------------------------------------------------
# What both clients hold


class Transport:
    """A client's transport state: its config, breaker, deadlines and ``httpx`` options.

    Both clients hold one and drive ``call_flow`` with it; the ``httpx`` client itself (sync or
    async) is theirs.
    """

    def __init__(self, cfg: ClientConfig, breaker: CircuitBreaker | None) -> None:
        self.config = cfg
        self.deadlines = Deadlines(cfg)
        # An unrecorded probe expires after the longest call deadline.
        probe_s = max(self.deadlines.longest_s(), cfg.session_deadline_s)
        self.breaker = breaker or CircuitBreaker(
            cfg.breaker_failures, cfg.breaker_open_s, probe_timeout_s=probe_s
        )

    def http_options(self) -> dict[str, Any]:
        """Keyword arguments of the persistent ``httpx.Client`` / ``httpx.AsyncClient``."""
        cfg = self.config
        return {
            "base_url": cfg.base_url,
            "headers": {"Authorization": f"Bearer {cfg.token}"} if cfg.token else {},
            "timeout": http_timeout(cfg, self.deadlines.longest_s()),
        }

    def flow(
        self, call: Call, timeouts: tuple[type[BaseException], ...] = (httpx.TimeoutException,)
    ) -> CallFlow:
        """``call_flow`` of ``call`` under this client's config and breaker."""
        return call_flow(call, self.config, self.breaker, timeouts)

    def request_args(self, attempt: Attempt) -> tuple[tuple[str, str], dict[str, Any]]:
        """Positional and keyword arguments of ``httpx``'s ``request`` for one attempt."""
        call = attempt.call
        timeout = http_timeout(self.config, attempt.timeout_s)
        return (call.method, call.path), {"json": call.body, "timeout": timeout}
