"""The request flows both clients share, and the session state they keep.

Each request (open a session, observe, critique, reseed, close, readiness, diagnosis jobs) is
written once, as a generator that yields ``Call`` objects and is sent each call's ``Reply``.
A ``Request`` pairs such a flow with its fail-open result. ``CriticClient`` and
``AsyncCriticClient`` only drive requests over their own transport, so one sequence (observe,
the session lost, re-created from its echo, observe again) behaves the same in both.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from dataclasses import dataclass, replace
from typing import Any, Literal

from serve.client.config import ClientConfig
from serve.client.payloads import ActionInput, ImageInput, action_field, image_field, shrunk
from serve.client.results import (
    History,
    Job,
    Observation,
    Ranking,
    Verdict,
    abstain,
    as_dict,
    parse_history,
    parse_job,
    parse_observation,
    parse_ranking,
    parse_verdict,
)
from serve.client.transport import Call, Deadlines, Reply

# One logger for the whole client package: runners set its level under one name.
log = logging.getLogger("serve.client")

ReseedStatus = Literal["rebuilt", "untouched", "lost"]
"""Outcome of ``Session.reseed_status``."""

Flow = Generator[Call, Reply, Any]
"""A request's logic: yields the calls it makes, is sent their replies, returns its result."""


@dataclass(frozen=True)
class Request:
    """A flow to drive and what it gives when anything unexpected interrupts it (fail open)."""

    flow: Flow
    fallback: Callable[[], Any]

    def fail_open(self) -> Any:
        """The fallback result, with the error logged (call it inside the ``except``)."""
        log.exception("critic client error; failing open")
        return self.fallback()


class Run:
    """A generator driven one step at a time: ``step`` is what it yielded last; once ``done``,
    ``value`` is what it returned. The drivers loop ``while not run.done``."""

    def __init__(self, gen: Generator[Any, Any, Any]) -> None:
        self._gen = gen
        self.done = False
        self.value: Any = None
        self.step: Any = None
        self._resume(lambda: next(gen))

    def send(self, value: Any) -> None:
        """Send ``value`` in (the outcome of ``step``) and move to the next step."""
        self._resume(lambda: self._gen.send(value))

    def throw(self, exc: BaseException) -> None:
        """Raise ``exc`` inside the generator at ``step``; what it does not catch propagates."""
        self._resume(lambda: self._gen.throw(exc))

    def _resume(self, resume: Callable[[], Any]) -> None:
        try:
            self.step = resume()
        except StopIteration as stop:
            self.done, self.value, self.step = True, stop.value, None


# ---------------------------------------------------------------------------------------------
# Client-wide requests


def _ready_flow(cfg: ClientConfig) -> Flow:
    reply = yield Call("GET", "/readyz", None, cfg.session_deadline_s)
    return reply.ok


def _diagnose_flow(cfg: ClientConfig, path: str) -> Flow:
    reply = yield Call("POST", "/v1/diagnose", {"path": str(path)}, cfg.session_deadline_s)
    job_id = as_dict(reply.body).get("job_id") if reply.ok else None
    if not isinstance(job_id, str):
        return Job(None, "failed", reason=reply.reason if not reply.ok else "bad_response")
    return Job(job_id, "pending")


def _job_flow(cfg: ClientConfig, job_id: str) -> Flow:
    reply = yield Call("GET", f"/v1/jobs/{job_id}", None, cfg.session_deadline_s)
    job = parse_job(reply.body, job_id) if reply.ok else None
    if job is None:
        return Job(job_id, "failed", reason=reply.reason if not reply.ok else "bad_response")
    return job


def ready_request(cfg: ClientConfig) -> Request:
    """``GET /readyz``: whether the gateway is ready (False on any failure)."""
    return Request(_ready_flow(cfg), lambda: False)


def diagnose_request(cfg: ClientConfig, path: str) -> Request:
    """``POST /v1/diagnose``: a pending ``Job``, or a failed one."""
    return Request(_diagnose_flow(cfg, path), lambda: Job(None, "failed", None, "client_error"))


def job_request(cfg: ClientConfig, job_id: str) -> Request:
    """``GET /v1/jobs/{job_id}``: the job as the gateway has it, or a failed one."""
    return Request(_job_flow(cfg, job_id), lambda: Job(job_id, "failed", None, "client_error"))


# ---------------------------------------------------------------------------------------------
# Session state and its requests


class SessionState:
    """What a session remembers to survive a gateway loss: its create body, the last echo, the
    last history, the last observe request (its screenshot inline) and the latest step."""

    def __init__(
        self, cfg: ClientConfig, create_body: dict[str, Any], deadlines: Deadlines
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

    # -- requests (what the sessions drive) ---------------------------------------------

    def start_request(self) -> Request:
        """Create the gateway session (a failure leaves it to be created at the next call)."""
        return Request(self.create_flow(), lambda: None)

    def observe_request(self, step_idx: int, image: ImageInput, prev: Any) -> Request:
        """Send screen ``step_idx`` and the action executed before it (``Session.observe``)."""
        return Request(
            self.observe_flow(step_idx, image, prev), lambda: self.stale(step_idx, "client_error")
        )

    def critique_request(
        self,
        step_idx: int,
        action: ActionInput | None,
        candidates: list[ActionInput] | None,
        image: ImageInput | None,
        return_image: bool,
        return_thinking: bool,
    ) -> Request:
        """Judge ``action`` or all ``candidates`` (``Session.critique``)."""
        extra = {"return_image": return_image, "return_thinking": return_thinking}
        n = len(candidates) if candidates else 0

        def fallback() -> Verdict | Ranking:
            return self.abstain_all(n, "client_error") if n else self.abstain("client_error")

        return Request(self.critique_flow(step_idx, action, candidates, image, extra), fallback)

    def reseed_request(self, echo: dict[str, Any]) -> Request:
        """Replace the gateway's history with ``echo`` (``Session.reseed_status``)."""
        return Request(self.reseed_flow(echo), self._reseed_fallback)

    def close_request(self, outcome: str | None) -> Request:
        """Close the gateway session (``Session.close``); raises on an unknown ``outcome``."""
        if outcome not in (None, "success", "failure"):
            raise ValueError(f"outcome must be success, failure or None, got {outcome!r}")
        return Request(self.close_flow(outcome), lambda: False)

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
        """The fail-open verdict, counted."""
        self._count(reason)
        return abstain(reason, message)

    def abstain_all(self, n: int, reason: str) -> Ranking:
        """The fail-open ranking of ``n`` candidates (all abstain, in their order), counted."""
        self._count(reason)
        results = tuple(abstain(reason) for _ in range(n))
        return Ranking(results, tuple(range(n)), status="degraded", reason=reason)

    def _reseed_fallback(self) -> ReseedStatus:
        """An unexpected error mid-reseed: re-create the session before the next call (from the
        echo the client holds), which is right whether or not the close went through."""
        self.lost = self.session_id is not None and not self.closed
        return "lost" if self.lost else "untouched"

    # -- flows --------------------------------------------------------------------------

    def create_flow(self, count: bool = True) -> Flow:
        """Create (or re-create, with the known id and echo) the gateway session."""
        body = dict(self.create_body)
        if self.session_id is not None:
            body["session_id"] = self.session_id
        if self.echo is not None:
            body["echo"] = self.echo
        reply = yield Call("POST", "/v1/sessions", body, self.cfg.session_deadline_s)
        sid = as_dict(reply.body).get("session_id") if reply.ok else None
        if not isinstance(sid, str) or not sid:
            return reply if not reply.ok else Reply(reply.status, None, "bad_response")
        if self.session_id is not None and count:
            self.recreated += 1
            log.info("critic session %s re-created from its echo", sid)
        self.session_id = sid
        self.lost = False
        self._note(reply.body)
        if not self.deadlines.asked:
            # Once per client, and only after the gateway answered: a gateway that is down
            # is not waited for twice per session.
            info = yield Call("GET", "/v1/info", None, self.cfg.session_deadline_s, counted=False)
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
                smaller = shrunk(body.pop("_image", None) or b"")
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
        reply = yield Call(
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
        if isinstance(as_dict(echo.get("summary")).get("progress_summary"), str):
            self.history = parse_history(echo["summary"], self.history)
        return "rebuilt"

    def close_flow(self, outcome: str | None = None) -> Flow:
        if self.closed or self.session_id is None:
            self.closed = True
            return False
        query = f"?outcome={outcome}" if outcome else ""
        reply = yield Call(
            "DELETE", f"/v1/sessions/{self.session_id}{query}", None, self.cfg.session_deadline_s
        )
        # Closed once the gateway has it (or no longer knows the session); after a failed
        # close the caller may close again, so an outcome is not lost to one bad moment.
        self.closed = reply.ok or reply.status == 404
        return reply.ok


class SessionView:
    """What a session shows of its state, the same for ``Session`` and ``AsyncSession``."""

    def __init__(self, client: Any, state: SessionState) -> None:
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
