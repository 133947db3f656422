"""Sessions: create, inspect and close them, hold one per request, and sweep the idle ones.

``SessionService`` owns the session store, the per-session locks (an ``asyncio.Lock`` in this
process, and a lock file per session when several processes share one SQLite store) and the
expiry and retention sweep. The step services (``serve.services.steps``) hold a session through
``hold`` and read it through ``open``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import uuid
from collections.abc import AsyncIterator, Callable, Generator
from pathlib import Path
from typing import Any

from hivig.contracts import INITIAL_HISTORY
from hivig.locks import LockUnavailable, hold_flock, remove_unheld
from serve.config import ServeConfig
from serve.errors import ApiError, StorageError
from serve.metrics import Metrics
from serve.protocol import Echo, SessionClosed, SessionCreate, SessionCreated, SessionFields
from serve.protocol import SessionInfo as SessionInfoAnswer
from serve.services.answers import Versions, trace_event
from serve.sessions import SessionState, SessionStore, now
from serve.traces import TraceWriter, valid_session_id

logger = logging.getLogger(__name__)

SWEEP_SLICE = 256
"""Sessions (or lock files) one slice of the sweep handles: one transaction that holds the
store for a few milliseconds, so a request waits at most that long behind the sweep."""

SweepSteps = Generator[Callable[[], Any], Any, Any]
"""A sweep as slices: each yielded callable is blocking work (run on the sweep thread); what
runs between them is bookkeeping of this process's state, on the event loop."""


class SessionService:
    """``/v1/sessions`` create, get and close; the locks; the expiry and retention sweep."""

    def __init__(
        self,
        cfg: ServeConfig,
        store: SessionStore,
        traces: TraceWriter,
        metrics: Metrics,
        versions: Versions,
    ) -> None:
        """Sessions in ``store``; lock files under ``state_dir/locks`` for a shared SQLite."""
        self.cfg = cfg
        self.store = store
        self.traces = traces
        self.metrics = metrics
        self.versions = versions
        self.locks: dict[str, asyncio.Lock] = {}
        # Processes sharing one SQLite store order a session's requests through a lock file.
        state_dir = Path(cfg.sessions.state_dir)
        self.lock_dir = state_dir / "locks" if cfg.sessions.store == "sqlite" else None
        if self.lock_dir is not None:
            self.lock_dir.mkdir(parents=True, exist_ok=True)

    # -- one request's hold on a session -------------------------------------------------------

    @contextlib.asynccontextmanager
    async def hold(self, sid: str) -> AsyncIterator[None]:
        """Hold the session for one request: its asyncio lock (this process) and, when the store
        is shared by several processes, its lock file (``python -m serve workers=N``)."""
        async with self._lock(sid):
            if self.lock_dir is None:
                yield
                return
            try:
                fd = await hold_flock(self.lock_dir / f"{sid}.lock")
            except LockUnavailable as e:  # the commit would fail as well
                raise StorageError(f"session {e}") from None
            try:
                yield
            finally:
                os.close(fd)  # closing the descriptor releases the lock

    def _lock(self, sid: str) -> asyncio.Lock:
        """The session's lock; only for sessions that exist (unknown ids leave nothing behind)."""
        lock = self.locks.get(sid)
        if lock is None:
            self.open(sid)
            lock = self.locks.setdefault(sid, asyncio.Lock())
        return lock

    def open(self, sid: str) -> SessionState:
        """The open session ``sid``; 404 ``unknown_session`` when absent, closed or expired (an
        expired one is closed now)."""
        state = self.store.load(sid) if valid_session_id(sid) else None
        if state is None or state.closed:
            raise ApiError(
                404, "unknown_session", f"no open session {sid!r}; re-create it from the echo"
            )
        if state.last_seen < now() - self.cfg.sessions.ttl_s:
            state.closed = True
            self.store.save(state)
            raise ApiError(
                404, "unknown_session", f"session {sid!r} expired; re-create it from the echo"
            )
        return state

    def count_open(self) -> None:
        """Refresh the open-sessions gauge; a store that cannot answer leaves it as it was (the
        request it follows is committed already, so it must not fail now)."""
        try:
            self.metrics.sessions_open.set(self.store.count_open())
        except StorageError as e:
            logger.warning("open sessions not counted: %s", e)

    # -- the routes ----------------------------------------------------------------------------

    def create(self, req: SessionCreate) -> SessionCreated:
        """``POST /v1/sessions``: a new session, or one re-created from an echo."""
        state = new_state(req, req.session_id or uuid.uuid4().hex)
        sid = state.session_id
        existing = self.store.load(sid)
        if existing is not None and not existing.closed:
            same = (existing.task, existing.platform, existing.screen_w, existing.screen_h) == (
                state.task,
                state.platform,
                state.screen_w,
                state.screen_h,
            )
            if not same:
                raise ApiError(
                    409,
                    "session_conflict",
                    f"session {sid!r} is open for another episode; close it or use another id",
                )
            existing.last_seen = now()
            self.store.save(existing)
            return SessionCreated.model_construct(
                session_id=sid, created=False, echo=existing.echo(), **self.versions()
            )
        if req.echo is not None:
            seed_from_echo(state, req.echo)
        if existing is not None:
            # Re-created under its old id: answers filed for the closed timeline are void.
            self.store.forget(sid)
        self.store.save(state)
        answer = SessionCreated.model_construct(
            session_id=sid, created=True, echo=state.echo(), **self.versions()
        )
        trace_event(
            self.traces,
            answer,
            sid,
            "session",
            task=state.task,
            platform=state.platform,
            screen={"w": state.screen_w, "h": state.screen_h},
            coord_space=state.coord_space,
            volatile_regions=state.volatile_regions,
            reseeded=req.echo is not None,
        )
        self.count_open()
        return answer

    def get(self, sid: str) -> SessionInfoAnswer:
        """``GET /v1/sessions/{sid}``."""
        state = self.store.load(sid) if valid_session_id(sid) else None
        if state is None:
            raise ApiError(404, "unknown_session", f"no session {sid!r}")
        # Idle past the TTL is closed whether or not the sweep has run yet.
        expired = state.last_seen < now() - self.cfg.sessions.ttl_s
        return SessionInfoAnswer.model_construct(
            session_id=sid,
            step_idx=state.step_idx,
            closed=state.closed or expired,
            echo=state.echo(),
            **self.versions(),
        )

    async def close(self, sid: str, outcome: str | None = None) -> SessionClosed:
        """``DELETE /v1/sessions/{sid}``; ``outcome`` is the runner's evaluated task outcome."""
        async with self.hold(sid):
            state = self.open(sid)
            state.closed = True
            self.store.save(state)
            self.store.forget(sid)
            answer = SessionClosed.model_construct(session_id=sid, closed=True, **self.versions())
            reported = {"outcome": outcome, "by": "runner"} if outcome else {}
            trace_event(self.traces, answer, sid, "close", **reported)
        self.count_open()
        return answer

    # -- the sweep: expiry and retention -------------------------------------------------------

    def sweep_steps(self) -> SweepSteps:
        """The sessions' part of the sweep: trace backlog, expiry, retention, locks; the expired
        ids. Each slice is one transaction of at most ``SWEEP_SLICE`` sessions, so a request
        waits for the store at most one slice."""
        yield self.traces.flush  # events a failing trace folder refused, once it heals
        idle_before = now() - self.cfg.sessions.ttl_s
        gone: list[str] = []
        while True:
            busy = frozenset(sid for sid, lock in self.locks.items() if lock.locked())
            batch = yield functools.partial(self._expire_slice, idle_before, busy)
            gone += batch
            if len(batch) < SWEEP_SLICE:
                break
        keep = self.cfg.retention
        before = now() - keep.closed_keep_s
        while True:
            removed = yield functools.partial(self._purge_slice, before, keep.closed_max)
            if len(removed) < SWEEP_SLICE:
                break
        asked = list(self.locks)
        still_open = yield functools.partial(self.store.open_among, asked)
        for sid in asked:
            lock = self.locks.get(sid)
            if lock is not None and sid not in still_open and not lock.locked():
                del self.locks[sid]  # a closed or removed session nobody is waiting on
        if self.lock_dir is not None:
            yield self._sweep_lock_files
        return gone

    def _expire_slice(self, idle_before: float, busy: frozenset[str]) -> list[str]:
        gone = self.store.expire(idle_before, busy, limit=SWEEP_SLICE)
        for sid in gone:
            self.traces.write(sid, "close", reason="ttl")
        return gone

    def _purge_slice(self, before: float, keep: int) -> list[str]:
        removed = self.store.purge_closed(before, keep, SWEEP_SLICE)
        for sid in removed:
            if self.lock_dir is not None:
                remove_unheld(self.lock_dir / f"{sid}.lock")
            if self.cfg.retention.remove_traces:
                with contextlib.suppress(OSError):
                    self.traces.path(sid).unlink(missing_ok=True)
        if removed:
            logger.info("retention: removed %d closed sessions", len(removed))
        return removed

    def _sweep_lock_files(self) -> int:
        """Remove the lock files of sessions that are not open (closed, removed, never made),
        a slice at a time; how many were removed."""
        assert self.lock_dir is not None
        try:
            names = [e.name for e in os.scandir(self.lock_dir) if e.name.endswith(".lock")]
        except OSError as e:
            logger.warning("lock files not swept: %s", e.strerror or e)
            return 0
        removed = 0
        for i in range(0, len(names), SWEEP_SLICE):
            chunk = names[i : i + SWEEP_SLICE]
            still_open = self.store.open_among([n.removesuffix(".lock") for n in chunk])
            for name in chunk:
                if name.removesuffix(".lock") not in still_open:
                    removed += remove_unheld(self.lock_dir / name)
        return removed


# ---------------------------------------------------------------------------------------------
# Session state from a request


def new_state(req: SessionFields, session_id: str) -> SessionState:
    """A session from its validated fields."""
    frame = req.frame if req.coord_space == "resized_px" and req.frame else req.screen
    t = now()
    return SessionState(
        session_id=session_id,
        task=req.task,
        platform=req.platform,
        screen_w=req.screen.w,
        screen_h=req.screen.h,
        coord_space=req.coord_space,
        frame_w=frame.w,
        frame_h=frame.h,
        action_format=req.action_format,
        policy_id=req.policy_id or "",
        volatile_regions=[[int(v) for v in box] for box in req.volatile_regions],
        created=t,
        last_seen=t,
    )


def seed_from_echo(state: SessionState, echo: Echo) -> None:
    """Restore history, steps and screens from a response's ``echo`` (a lost session)."""
    summary = echo.summary
    progress, last = summary.progress_summary, summary.last_action_result
    state.progress = INITIAL_HISTORY.progress if progress is None else progress
    state.last_result = INITIAL_HISTORY.last_result if last is None else last
    state.history_version = summary.version
    state.stale = summary.stale
    state.step_idx = echo.step_idx
    state.screens = dict(echo.screens)
    state.steps = [step.model_dump(exclude_unset=True) for step in echo.steps]
    state.pointer = list(echo.pointer) if echo.pointer is not None else None


# ---------------------------------------------------------------------------------------------
# Lock files: one session's requests in order across processes
