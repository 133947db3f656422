"""The client's per-call transport flow (``call_flow``) driven with no I/O at all.

Each test feeds the flow fake answers (``httpx.Response`` objects built in memory) or throws
fake transport errors into it, on a fake clock shared with the breaker, and checks the steps it
yields (attempts and their timeouts, pauses), when it gives up and what the breaker counted.
The last test checks that the sync and async clients drive this same flow.

``CALL`` states no gateway deadline, so every timeout on it counts towards the breaker; the
calls of a client's sessions carry the gateway's deadline, and a timeout struck before it is no
evidence either way (the breaker tests near the end).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from serve.client import AsyncCriticClient, CircuitBreaker, ClientConfig, CriticClient
from serve.client.transport import ASYNC_TIMEOUTS, Attempt, Call, Pause, Reply, call_flow

CALL = Call("POST", "/v1/sessions/s1/critique", {"step_idx": 0}, 8.0)


class Clock:
    """A monotonic clock the tests move by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def answer(status: int, code: str | None = None, **headers: str) -> httpx.Response:
    """A gateway answer: ``{"ok": true}`` on 2xx, else the API error body with ``code``."""
    body = {"ok": True} if code is None else {"error": {"code": code, "message": code}}
    return httpx.Response(status, json=body, headers=headers)


def took(seconds: float, outcome: Any) -> tuple[float, Any]:
    """An attempt outcome that arrives ``seconds`` after the attempt was sent."""
    return (seconds, outcome)


def run(
    flow: Any, outcomes: list[Any], clock: Clock, oversleep: float = 0.0
) -> tuple[list[Any], Reply]:
    """Drive ``flow`` like a client would, without I/O: every ``Attempt`` consumes the next
    outcome (a response is sent, an exception thrown in; ``took`` advances the clock first),
    every ``Pause`` advances the clock by its seconds plus ``oversleep``. Returns the steps
    yielded and the flow's reply; an exception the flow re-raises propagates."""
    steps: list[Any] = []
    pending = list(outcomes)
    try:
        step = next(flow)
        while True:
            steps.append(step)
            if isinstance(step, Pause):
                clock.now += step.seconds + oversleep
                step = flow.send(None)
                continue
            outcome = pending.pop(0)
            if isinstance(outcome, tuple):
                clock.now += outcome[0]
                outcome = outcome[1]
            thrown = isinstance(outcome, BaseException)
            step = flow.throw(outcome) if thrown else flow.send(outcome)
    except StopIteration as stop:
        assert not pending, "the flow stopped before using every outcome"
        return steps, stop.value


def pieces(**cfg: Any) -> tuple[ClientConfig, CircuitBreaker, Clock]:
    """A config (no jitter unless asked for), its breaker and the fake clock both read."""
    config = ClientConfig(**{"retry_jitter_s": 0.0, **cfg})
    clock = Clock()
    breaker = CircuitBreaker(config.breaker_failures, config.breaker_open_s, clock=clock)
    return config, breaker, clock


def call_once(
    cfg: ClientConfig, breaker: CircuitBreaker, clock: Clock, outcomes: list[Any], **kw: Any
) -> tuple[list[Any], Reply]:
    return run(call_flow(CALL, cfg, breaker, clock=clock, **kw), outcomes, clock)


def timeout() -> httpx.ReadTimeout:
    return httpx.ReadTimeout("client-side read timeout")


# ---------------------------------------------------------------------------------------------
# Attempts, pauses, deadline


def test_a_good_answer_is_one_attempt_with_the_whole_deadline():
    cfg, breaker, clock = pieces()
    steps, reply = call_once(cfg, breaker, clock, [answer(200)])
    assert steps == [Attempt(CALL, 8.0)]
    assert reply.ok and reply.body == {"ok": True}
    assert breaker.state == "closed" and breaker._count == 0


def test_a_transport_error_is_retried_after_a_jittered_pause_within_the_deadline():
    cfg, breaker, clock = pieces(retry_jitter_s=0.25)
    refused = httpx.ConnectError("refused")
    steps, reply = call_once(cfg, breaker, clock, [took(0.5, refused), answer(200)])
    first, pause, second = steps
    assert first == Attempt(CALL, 8.0)
    assert isinstance(pause, Pause) and 0.0 <= pause.seconds <= 0.25
    # The second attempt only gets what is left of the call's deadline.
    assert second.timeout_s == pytest.approx(8.0 - 0.5 - pause.seconds)
    assert reply.ok and breaker._count == 0


def test_429_waits_its_retry_after():
    cfg, breaker, clock = pieces()
    steps, reply = call_once(
        cfg, breaker, clock, [answer(429, "overloaded", **{"Retry-After": "1.5"}), answer(200)]
    )
    assert steps == [Attempt(CALL, 8.0), Pause(1.5), Attempt(CALL, 6.5)]
    assert reply.ok


def test_a_retry_after_beyond_the_deadline_gives_up_at_once():
    cfg, breaker, clock = pieces()
    steps, reply = call_once(
        cfg, breaker, clock, [answer(429, "overloaded", **{"Retry-After": "30"})]
    )
    assert steps == [Attempt(CALL, 8.0)]
    assert reply.status == 429 and reply.reason == "overloaded"
    assert breaker._count == 1


@pytest.mark.parametrize(
    ("status", "code"),
    [(500, "internal"), (401, "unauthorized"), (404, "unknown_session"), (422, "bad_request")],
)
def test_other_answers_are_not_retried(status, code):
    cfg, breaker, clock = pieces()
    steps, reply = call_once(cfg, breaker, clock, [answer(status, code)])
    assert len(steps) == 1 and reply.status == status and reply.code == code


@pytest.mark.parametrize("status", [502, 503, 504])
def test_gateway_errors_are_retried(status):
    cfg, breaker, clock = pieces()
    steps, reply = call_once(cfg, breaker, clock, [answer(status, "x"), answer(200)])
    assert [type(s) for s in steps] == [Attempt, Pause, Attempt] and reply.ok


def test_the_retries_are_bounded_and_the_breaker_counts_the_call_once():
    cfg, breaker, clock = pieces(retries=2)
    steps, reply = call_once(cfg, breaker, clock, [timeout(), timeout(), timeout()])
    assert [type(s) for s in steps] == [Attempt, Pause, Attempt, Pause, Attempt]
    assert reply.code == "timeout" and reply.reason == "timeout"
    assert breaker._count == 1  # one failed call, not three failed attempts


def test_no_retries_means_one_attempt():
    cfg, breaker, clock = pieces(retries=0)
    steps, reply = call_once(cfg, breaker, clock, [httpx.ConnectError("refused")])
    assert len(steps) == 1 and reply.code == "transport"


def test_no_retry_without_time_for_a_connect():
    cfg, breaker, clock = pieces()
    # 0.04 s left: less than the 0.05 s a retry needs at least.
    _, reply = call_once(cfg, breaker, clock, [took(7.96, timeout())])
    assert reply.code == "timeout"
    # 0.1 s left: a retry goes out, bounded by what is left.
    steps, reply = call_once(cfg, breaker, clock, [took(7.9, timeout()), answer(200)])
    assert steps[-1].timeout_s == pytest.approx(0.1) and reply.ok


def test_the_call_gives_up_when_the_pause_overran_the_deadline():
    cfg, breaker, clock = pieces(critique_deadline_s=1.0)
    call = Call("POST", "/v1/sessions/s1/critique", None, cfg.critique_deadline_s)
    flow = call_flow(call, cfg, breaker, clock=clock)
    # The pause asked for 0 s but the driver woke up 0.6 s later: no attempt goes out.
    steps, reply = run(flow, [took(0.5, timeout())], clock, oversleep=0.6)
    assert steps == [Attempt(call, 1.0), Pause(0.0)]
    assert reply.code == "timeout" and reply.message == "deadline exceeded"
    assert breaker._count == 1


def test_an_unreadable_answer_is_a_bad_response_and_not_retried():
    cfg, breaker, clock = pieces()
    html = httpx.Response(200, text="<html>proxy error</html>")
    steps, reply = call_once(cfg, breaker, clock, [html])
    assert len(steps) == 1 and reply.code == "bad_response" and breaker._count == 1


# ---------------------------------------------------------------------------------------------
# Circuit breaker


@pytest.mark.parametrize(
    ("outcome", "counts"),
    [
        (timeout(), True),  # no answer within the gateway's deadline (none here): it is unwell
        (httpx.ConnectError("refused"), True),
        (httpx.Response(200, text="garbage"), True),
        (answer(500, "internal"), True),
        (answer(503, "backend_unavailable"), True),
        (answer(504, "timeout"), True),  # the gateway's own timeout answer too
        (answer(429, "overloaded"), True),
        (answer(401, "unauthorized"), True),
        (answer(200), False),
        (answer(404, "unknown_session"), False),  # request errors prove the gateway answers
        (answer(409, "step_conflict"), False),
        (answer(413, "image_too_large"), False),
        (answer(422, "bad_request"), False),
    ],
)
def test_what_counts_towards_the_breaker(outcome, counts):
    cfg, breaker, clock = pieces(retries=0)
    breaker.record(True)  # one failure already counted
    call_once(cfg, breaker, clock, [outcome])
    assert breaker._count == (2 if counts else 0)  # counted, or the run of failures is reset


def test_the_breaker_opens_after_consecutive_failed_calls_and_nothing_goes_out():
    cfg, breaker, clock = pieces(retries=0, breaker_failures=3, breaker_open_s=60.0)
    for _ in range(2):
        call_once(cfg, breaker, clock, [timeout()])
    call_once(cfg, breaker, clock, [answer(422, "bad_request")])  # an answer resets the run
    for _ in range(3):
        assert breaker.state == "closed"
        call_once(cfg, breaker, clock, [answer(503, "backend_unavailable")])
    assert breaker.state == "open"
    steps, reply = call_once(cfg, breaker, clock, [])
    assert steps == [] and reply.code == "circuit_open" and reply.reason == "circuit_open"
    assert breaker._count == 3  # a refused call is not counted


def test_a_half_open_breaker_lets_one_probe_through():
    cfg, breaker, clock = pieces(retries=0, breaker_failures=1, breaker_open_s=10.0)
    call_once(cfg, breaker, clock, [timeout()])
    clock.now += 11.0
    probe = call_flow(CALL, cfg, breaker, clock=clock)
    assert next(probe) == Attempt(CALL, 8.0)  # in flight
    assert call_once(cfg, breaker, clock, [])[1].code == "circuit_open"  # only one probe
    with pytest.raises(StopIteration) as stop:
        probe.send(answer(200))
    assert stop.value.value.ok and breaker.state == "closed"


def test_a_failed_probe_reopens_the_breaker():
    cfg, breaker, clock = pieces(retries=0, breaker_failures=1, breaker_open_s=10.0)
    call_once(cfg, breaker, clock, [timeout()])
    clock.now += 11.0
    _, reply = call_once(cfg, breaker, clock, [took(1.0, timeout())])
    assert reply.code == "timeout" and breaker.state == "open"
    assert call_once(cfg, breaker, clock, [])[1].code == "circuit_open"


# A critique the client caps at 3 s (+ 2 s grace) on a gateway that answers within its 8 s.
SHORT = Call("POST", "/v1/sessions/s1/critique", {"step_idx": 0}, 5.0, gateway_deadline_s=8.0)


@pytest.mark.parametrize(
    ("outcome", "counts"),
    [
        (timeout(), None),  # the client stopped waiting first: nothing learnt about the gateway
        (httpx.ConnectTimeout("connect"), True),  # unreachable, whatever the deadlines
        (httpx.ConnectError("refused"), True),
        (answer(503, "backend_unavailable"), True),
        (answer(200), False),
    ],
)
def test_a_timeout_before_the_gateways_deadline_is_no_evidence(outcome, counts):
    cfg, breaker, clock = pieces(retries=0)
    breaker.record(True)  # one failure already counted
    run(call_flow(SHORT, cfg, breaker, clock=clock), [outcome], clock)
    assert breaker._count == {True: 2, False: 0, None: 1}[counts]  # counted, reset or kept


def test_a_timeout_after_the_gateways_deadline_counts():
    cfg, breaker, clock = pieces(retries=0)
    waited = Call("POST", "/v1/sessions/s1/critique", None, 10.0, gateway_deadline_s=8.0)
    _, reply = run(call_flow(waited, cfg, breaker, clock=clock), [took(10.0, timeout())], clock)
    assert reply.reason == "timeout" and not reply.cut_short and breaker._count == 1


def test_timeouts_cut_short_never_open_the_breaker():
    cfg, breaker, clock = pieces(retries=1, breaker_failures=2)
    for _ in range(5):
        _, reply = run(call_flow(SHORT, cfg, breaker, clock=clock), [took(5.0, timeout())], clock)
        assert reply.reason == "timeout" and reply.cut_short
    assert breaker.state == "closed" and breaker._count == 0


def test_the_last_attempt_decides_after_a_pause_overran_the_deadline():
    cfg, breaker, clock = pieces(retries=1)
    # A timeout cut short, a pause the driver overslept: "deadline exceeded", still no evidence.
    steps, reply = run(
        call_flow(SHORT, cfg, breaker, clock=clock), [took(4.9, timeout())], clock, oversleep=1.0
    )
    assert [type(s) for s in steps] == [Attempt, Pause]
    assert reply.message == "deadline exceeded" and reply.cut_short and breaker._count == 0


def test_a_probe_cut_short_is_given_back():
    cfg, breaker, clock = pieces(retries=0, breaker_failures=1, breaker_open_s=10.0)
    call_once(cfg, breaker, clock, [httpx.ConnectError("refused")])
    clock.now += 11.0
    run(call_flow(SHORT, cfg, breaker, clock=clock), [timeout()], clock)
    assert breaker.state == "half_open" and not breaker._probing  # the next call probes
    _, reply = call_once(cfg, breaker, clock, [answer(200)])
    assert reply.ok and breaker.state == "closed"


def test_an_uncounted_call_leaves_the_breaker_alone():
    cfg, breaker, clock = pieces(retries=0)
    breaker.record(True)
    info = Call("GET", "/v1/info", None, 8.0, counted=False)
    run(call_flow(info, cfg, breaker, clock=clock), [answer(503, "backend_unavailable")], clock)
    run(call_flow(info, cfg, breaker, clock=clock), [answer(200)], clock)
    assert breaker._count == 1


# ---------------------------------------------------------------------------------------------
# Interruptions


def test_an_unexpected_error_is_counted_not_retried_and_propagates():
    cfg, breaker, clock = pieces(breaker_failures=1, breaker_open_s=10.0)
    breaker.record(True)
    clock.now += 11.0
    flow = call_flow(CALL, cfg, breaker, clock=clock)
    assert isinstance(next(flow), Attempt)  # the probe
    with pytest.raises(TypeError):
        flow.throw(TypeError("Object of type _Opaque is not JSON serializable"))
    assert not breaker._probing and breaker.state == "open"  # recorded as a failed probe


@pytest.mark.parametrize("interruption", [asyncio.CancelledError(), KeyboardInterrupt()])
def test_an_interrupted_pause_is_counted_once_and_propagates(interruption):
    cfg, breaker, clock = pieces()
    flow = call_flow(CALL, cfg, breaker, clock=clock)
    next(flow)
    assert isinstance(flow.send(answer(503, "backend_unavailable")), Pause)
    with pytest.raises(type(interruption)):
        flow.throw(interruption)
    assert breaker._count == 1


def test_only_the_drivers_timeouts_count_as_timeouts():
    cfg, breaker, clock = pieces(retries=0)
    # The async driver's wait_for expiry is a timeout ...
    _, reply = call_once(cfg, breaker, clock, [asyncio.TimeoutError()], timeouts=ASYNC_TIMEOUTS)
    assert reply.code == "timeout"
    # ... the sync driver never raises it, and lets anything unknown propagate.
    with pytest.raises(asyncio.TimeoutError):
        call_once(cfg, breaker, clock, [asyncio.TimeoutError()])
    assert breaker._count == 2


# ---------------------------------------------------------------------------------------------
# Both drivers run this flow and only do its I/O


class _Recorded:
    """Wraps a flow and notes the kind of every step it yields to its driver."""

    def __init__(self, flow: Any, steps: list[str]) -> None:
        self.flow, self.steps = flow, steps

    def _note(self, step: Any) -> Any:
        self.steps.append(type(step).__name__)
        return step

    def __next__(self) -> Any:
        return self._note(next(self.flow))

    def send(self, value: Any) -> Any:
        return self._note(self.flow.send(value))

    def throw(self, exc: BaseException) -> Any:
        return self._note(self.flow.throw(exc))


def test_sync_and_async_clients_drive_the_same_flow(monkeypatch):
    import serve.client.transport

    original = serve.client.transport.call_flow
    steps: list[str] = []
    monkeypatch.setattr(
        serve.client.transport, "call_flow", lambda *a, **kw: _Recorded(original(*a, **kw), steps)
    )

    def transport() -> httpx.MockTransport:
        answers = iter(
            [httpx.ConnectError("refused"), answer(429, "overloaded", **{"Retry-After": "0"})]
        )

        def handle(request: httpx.Request) -> httpx.Response:
            got = next(answers, None)
            if isinstance(got, Exception):
                raise got
            return got or httpx.Response(200, json={"ready": True})

        return httpx.MockTransport(handle)

    cfg = ClientConfig(base_url="http://gw", retries=2, retry_jitter_s=0.0)
    assert CriticClient(config=cfg, transport=transport()).ready()
    sync_steps = list(steps)
    steps.clear()

    async def main() -> bool:
        async with AsyncCriticClient(config=cfg, transport=transport()) as client:
            return await client.ready()

    assert asyncio.run(main())
    assert steps == sync_steps == ["Attempt", "Pause", "Attempt", "Pause", "Attempt"]


def test_a_failed_close_can_be_sent_again_with_its_outcome():
    # A close carries the runner's outcome for the trace: one that failed (503, transport) must
    # not mark the session closed, or the outcome is lost for good.
    from serve.client.flows import SessionState
    from serve.client.transport import Deadlines

    cfg = ClientConfig()
    state = SessionState(cfg, {"task": "t"}, Deadlines(cfg))
    state.session_id = "s1"
    flow = state.close_flow("success")
    call = next(flow)
    assert (call.method, call.path) == ("DELETE", "/v1/sessions/s1?outcome=success")
    with pytest.raises(StopIteration) as done:
        flow.send(Reply(503, {"error": {"code": "storage_unavailable"}}))
    assert done.value.value is False and not state.closed
    flow = state.close_flow("success")
    next(flow)
    with pytest.raises(StopIteration) as done:
        flow.send(Reply(200, {"session_id": "s1", "closed": True}))
    assert done.value.value is True and state.closed
    assert list(state.close_flow("success")) == []  # closed: nothing is sent again
