"""What the gateway does per request, independent of HTTP: sessions, steps, verdicts, traces.

``Gateway`` owns the session store, the screenshot store, the critic and the trace writer. The
FastAPI routes (``serve.routes``) validate bodies into ``serve.protocol`` models and call these
methods. Per session, requests
run one at a time (a lock per session), so a runner's retry of a step waits for the first try
and then gets its stored answer instead of applying the step twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hivig.actions import ActionError, action_from_arguments, pointer_after, space_for_platform
from hivig.backends import InferenceBackend
from hivig.contracts import INITIAL_HISTORY, CritiqueOutput, HistoryOutput
from hivig.messages import ArrowMark
from hivig.profiles import load_profile
from hivig.prompts import format_trajectory
from hivig.recovery import StepRecord, choose_recovery
from hivig.vision import CANONICAL
from serve.actions import Frame, ResolvedAction, resolve
from serve.config import ServeConfig
from serve.critic import Critic, ModelResult, QueueGate
from serve.errors import ApiError, StorageError
from serve.images import ImageStore, StoredImage
from serve.metrics import Metrics
from serve.protocol import (
    Critique,
    CritiqueStateless,
    DiagnoseRequest,
    Echo,
    HistoryText,
    ImageObject,
    ImageUpload,
    Observe,
    ObserveStateless,
    SessionCreate,
    SessionFields,
)
from serve.ranking import rank
from serve.recurrence_state import Detector, fired
from serve.sessions import SessionState, SessionStore, StoredResponse, now, open_store
from serve.traces import TraceWriter, messages_json, valid_session_id

logger = logging.getLogger(__name__)

_JOB_ID = re.compile(r"[0-9a-f]{32}")

SWEEP_SLICE = 256
"""Sessions (or lock files) one slice of the sweep handles: one transaction that holds the
store for a few milliseconds, so a request waits at most that long behind the sweep."""

SCHEMA_VERSION = "1"
_RETRYABLE = ("timeout", "backend", "missing_image")
_GROUNDING = "Grounding/Spatial Error"
_OFF_SCREEN = (
    "The proposed target lies outside the visible screen, so the step cannot act on any element "
    "shown; pointer actions must target a point inside the current screenshot."
)


@dataclass
class Timer:
    """Milliseconds of each phase of a request."""

    start: float

    def total(self) -> float:
        """Milliseconds since the request started."""
        return round((time.perf_counter() - self.start) * 1000, 2)


class Gateway:
    """Sessions, screenshots, the critic, traces and metrics of one gateway process."""

    def __init__(self, cfg: ServeConfig, backend: InferenceBackend, model_version: str) -> None:
        """Open the stores under ``cfg.sessions.state_dir`` and wrap ``backend``."""
        state_dir = Path(cfg.sessions.state_dir)
        self.cfg = cfg
        self.model_version = model_version
        self.metrics = Metrics()
        self.store: SessionStore = open_store(cfg.sessions.store, state_dir)
        profile = load_profile(cfg.critic.profile) if cfg.critic.profile else None
        self.images = ImageStore(
            state_dir / "images",
            cfg.frame,
            max_bytes=cfg.limits.max_image_bytes,
            max_pixels=cfg.limits.max_image_pixels,
            large_pixels=cfg.limits.large_image_pixels,
            large_lanes=cfg.limits.large_image_lanes,
            cache_size=cfg.sessions.frame_cache,
            # A backend that sends PNGs (the OpenAI transport) is handed the frames' PNGs
            # made here, in the cache it sends them from.
            payloads=getattr(backend, "png_payloads", None),
            policy=profile.frame if profile is not None else CANONICAL,
        )
        self.traces = TraceWriter(state_dir / "traces", self.metrics)
        self.queue = QueueGate(cfg.limits.max_queue, cfg.limits.retry_after_s, self.metrics)
        self.critic = Critic(backend, cfg, self.images, self.metrics, self.queue, profile)
        # A decoded detector state holds up to about a megabyte (its JSON and thumbnails): keep
        # one for each session whose frames are likely still cached (about two per session).
        self.detector = Detector(cache_size=max(1, cfg.sessions.frame_cache // 4))
        self._locks: dict[str, asyncio.Lock] = {}
        # Processes sharing one SQLite store order a session's requests through a lock file.
        self._lock_dir = state_dir / "locks" if cfg.sessions.store == "sqlite" else None
        if self._lock_dir is not None:
            self._lock_dir.mkdir(parents=True, exist_ok=True)
        self.jobs: dict[str, dict[str, Any]] = {}
        self._job_tasks: set[asyncio.Task[None]] = set()
        self._job_slots = asyncio.Semaphore(cfg.diagnose.max_jobs)
        # One thread for the sweep: its slices never take a place of the default executor,
        # which model calls share, and two sweeps never overlap.
        self._sweeper = ThreadPoolExecutor(1, thread_name_prefix="hivig-sweep")
        self.metrics.sessions_open.set(self.store.count_open())

    def close(self) -> None:
        """Release the stores (trace events still waiting get a last try)."""
        left = self.traces.flush()
        if left:
            logger.error(
                "%d trace events could not be written to %s and are lost", left, self.traces.root
            )
        self.store.close()
        self.images.close()

    # -- common --------------------------------------------------------------------------------

    def versions(self) -> dict[str, str]:
        """The versions every response carries."""
        return {
            "model_version": self.model_version,
            "prompt_version": self.critic.prompt_version,
            "schema_version": SCHEMA_VERSION,
        }

    def _trace(self, answer: dict[str, Any] | None, sid: str, event: str, **fields: Any) -> None:
        """Append a trace event once its step is committed; the answer says if the trace lacks
        events.

        The session state is the truth and is committed first: a trace folder that takes no
        writes never turns a committed step into an error (the event waits and is written
        later, in order).
        """
        self.traces.write(sid, event, **fields)
        self._trace_flag(answer, sid)

    def _trace_flag(self, answer: dict[str, Any] | None, sid: str) -> None:
        status = self.traces.status(sid)
        if status is not None and answer is not None:
            answer["trace"] = status  # "pending" (written later) or "incomplete" (some lost)

    def _count_open(self) -> None:
        """Refresh the open-sessions gauge; a store that cannot answer leaves it as it was (the
        request it follows is committed already, so it must not fail now)."""
        try:
            self.metrics.sessions_open.set(self.store.count_open())
        except StorageError as e:
            logger.warning("open sessions not counted: %s", e)

    def _lock(self, sid: str) -> asyncio.Lock:
        """The session's lock; only for sessions that exist (unknown ids leave nothing behind)."""
        lock = self._locks.get(sid)
        if lock is None:
            self._open_session(sid)
            lock = self._locks.setdefault(sid, asyncio.Lock())
        return lock

    @contextlib.asynccontextmanager
    async def _session(self, sid: str) -> AsyncIterator[None]:
        """Hold the session for one request: its asyncio lock (this process) and, when the store
        is shared by several processes, its lock file (``python -m serve workers=N``)."""
        async with self._lock(sid):
            if self._lock_dir is None:
                yield
                return
            fd = await _lock_file(self._lock_dir / f"{sid}.lock")
            try:
                yield
            finally:
                os.close(fd)  # closing the descriptor releases the lock

    async def _cpu(self, fn: Any, *args: Any) -> Any:
        """Run image work (decode, resize, fingerprints) on the image threads."""
        return await asyncio.get_running_loop().run_in_executor(self.images.pool, fn, *args)

    def _open_session(self, sid: str) -> SessionState:
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

    async def image(
        self, inline: str | ImageObject | None, ref: str | None = None
    ) -> StoredImage | None:
        """The screenshot a body gives inline (base64, or an image object) or by reference."""
        if isinstance(inline, ImageObject):
            inline, ref = inline.screenshot, inline.image_ref or ref
        if inline is not None:
            return await self.images.put_inline(inline, self.critic.budget.observe_deadline_s)
        if ref is not None:
            return await self._cpu(self.images.known, ref)
        return None

    # -- sessions ------------------------------------------------------------------------------

    def create(self, req: SessionCreate) -> dict[str, Any]:
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
            return {"session_id": sid, "created": False, "echo": existing.echo(), **self.versions()}
        if req.echo is not None:
            seed_from_echo(state, req.echo)
        if existing is not None:
            # Re-created under its old id: answers filed for the closed timeline are void.
            self.store.forget(sid)
        self.store.save(state)
        answer = {"session_id": sid, "created": True, "echo": state.echo(), **self.versions()}
        self._trace(
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
        self._count_open()
        return answer

    def get(self, sid: str) -> dict[str, Any]:
        """``GET /v1/sessions/{sid}``."""
        state = self.store.load(sid) if valid_session_id(sid) else None
        if state is None:
            raise ApiError(404, "unknown_session", f"no session {sid!r}")
        # Idle past the TTL is closed whether or not the sweep has run yet.
        expired = state.last_seen < now() - self.cfg.sessions.ttl_s
        return {
            "session_id": sid,
            "step_idx": state.step_idx,
            "closed": state.closed or expired,
            "echo": state.echo(),
            **self.versions(),
        }

    async def close_session(self, sid: str, outcome: str | None = None) -> dict[str, Any]:
        """``DELETE /v1/sessions/{sid}``; ``outcome`` is the runner's evaluated task outcome."""
        async with self._session(sid):
            state = self._open_session(sid)
            state.closed = True
            self.store.save(state)
            self.store.forget(sid)
            answer = {"session_id": sid, "closed": True, **self.versions()}
            reported = {"outcome": outcome, "by": "runner"} if outcome else {}
            self._trace(answer, sid, "close", **reported)
        self._count_open()
        return answer

    # -- the sweep: expiry and retention -------------------------------------------------------

    async def sweep(self) -> list[str]:
        """Close idle sessions and apply ``retention``, off the event loop; the expired ids.

        The store and file work runs on a thread of its own, one bounded slice at a time (one
        transaction of at most ``SWEEP_SLICE`` sessions): a request waits for the store at most
        one slice, and nothing else waits at all.
        """
        loop = asyncio.get_running_loop()
        steps = self._sweep()
        done: Any = None
        while True:
            try:
                work = steps.send(done)
            except StopIteration as stop:
                return stop.value
            done = await loop.run_in_executor(self._sweeper, work)

    def stop_sweeps(self) -> None:
        """Wait for a sweep slice still running, and let the sweep thread go."""
        self._sweeper.shutdown(wait=True)

    def expire(self) -> list[str]:
        """The same sweep, run here and now (tests, tools); the expired ids."""
        steps = self._sweep()
        done: Any = None
        while True:
            try:
                work = steps.send(done)
            except StopIteration as stop:
                return stop.value
            done = work()

    def _sweep(self) -> Generator[Callable[[], Any], Any, list[str]]:
        """The sweep's slices: each yielded callable is blocking work (run by ``sweep`` on the
        sweep thread); what runs between them here is bookkeeping of this process's state."""
        yield self.traces.flush  # events a failing trace folder refused, once it heals
        idle_before = now() - self.cfg.sessions.ttl_s
        gone: list[str] = []
        while True:
            busy = frozenset(sid for sid, lock in self._locks.items() if lock.locked())
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
        asked = list(self._locks)
        still_open = yield functools.partial(self.store.open_among, asked)
        for sid in asked:
            lock = self._locks.get(sid)
            if lock is not None and sid not in still_open and not lock.locked():
                del self._locks[sid]  # a closed or removed session nobody is waiting on
        if self._lock_dir is not None:
            yield self._sweep_lock_files
        horizon = time.time() - self.cfg.sessions.ttl_s
        for job_id, job in list(self.jobs.items()):
            if job["status"] != "pending" and job.get("finished", 0) < horizon:
                del self.jobs[job_id]  # still on disk (``_load_job``) until ``jobs_keep_s``
        running = frozenset(j for j, job in self.jobs.items() if job["status"] == "pending")
        yield functools.partial(self._sweep_jobs, running)
        self.metrics.sessions_open.set((yield self.store.count_open))
        return gone

    def _expire_slice(self, idle_before: float, busy: frozenset[str]) -> list[str]:
        gone = self.store.expire(idle_before, busy, limit=SWEEP_SLICE)
        for sid in gone:
            self._trace(None, sid, "close", reason="ttl")
        return gone

    def _purge_slice(self, before: float, keep: int) -> list[str]:
        removed = self.store.purge_closed(before, keep, SWEEP_SLICE)
        for sid in removed:
            if self._lock_dir is not None:
                _remove_lock_file(self._lock_dir / f"{sid}.lock")
            if self.cfg.retention.remove_traces:
                with contextlib.suppress(OSError):
                    self.traces.path(sid).unlink(missing_ok=True)
        if removed:
            logger.info("retention: removed %d closed sessions", len(removed))
        return removed

    def _sweep_lock_files(self) -> int:
        """Remove the lock files of sessions that are not open (closed, removed, never made),
        a slice at a time; how many were removed."""
        assert self._lock_dir is not None
        try:
            names = [e.name for e in os.scandir(self._lock_dir) if e.name.endswith(".lock")]
        except OSError as e:
            logger.warning("lock files not swept: %s", e.strerror or e)
            return 0
        removed = 0
        for i in range(0, len(names), SWEEP_SLICE):
            chunk = names[i : i + SWEEP_SLICE]
            still_open = self.store.open_among([n.removesuffix(".lock") for n in chunk])
            for name in chunk:
                if name.removesuffix(".lock") not in still_open:
                    removed += _remove_lock_file(self._lock_dir / name)
        return removed

    def _sweep_jobs(self, running: frozenset[str]) -> int:
        """Remove diagnosis job folders finished more than ``retention.jobs_keep_s`` ago (or,
        never finished, last written that long ago: their process died); how many."""
        root = Path(self.cfg.sessions.state_dir) / "diagnoses"
        horizon = time.time() - self.cfg.retention.jobs_keep_s
        removed = 0
        try:
            folders = [e for e in os.scandir(root) if _JOB_ID.fullmatch(e.name)]
        except FileNotFoundError:
            return 0
        except OSError as e:
            logger.warning("diagnosis jobs not swept: %s", e.strerror or e)
            return 0
        for folder in folders:
            if folder.name in running or _job_time(Path(folder.path)) >= horizon:
                continue
            shutil.rmtree(folder.path, ignore_errors=True)
            removed += 1
        if removed:
            logger.info("retention: removed %d diagnosis jobs", removed)
        return removed

    # -- observe -------------------------------------------------------------------------------

    async def observe(self, sid: str, req: Observe) -> dict[str, Any]:
        """``POST /v1/sessions/{sid}/observe``: the history update of the executed step."""
        timer = Timer(time.perf_counter())
        k = req.step_idx
        digest = _observe_key(req)
        async with self._session(sid):
            state = self._open_session(sid)
            if k <= state.step_idx and not req.force:
                stored = self.store.response(sid, "observe", k, "")
                if stored is not None:
                    # A retry gets the stored answer; another screenshot or action for a step
                    # already observed is a conflict, never silently dropped.
                    if not await self._same_observe(req, digest, stored):
                        raise ApiError(
                            409,
                            "step_conflict",
                            f"step_idx {k} was observed with another screenshot or action; "
                            "send `force: true` to replace it",
                        )
                    self._trace_flag(stored, sid)
                    return stored
            expected = state.step_idx + 1
            if k != expected and not req.force:
                raise ApiError(409, "step_conflict", f"expected step_idx {expected}, got {k}")
            shot = await self.image(req.screenshot, req.image_ref)
            if shot is None:
                raise ApiError(422, "bad_request", "observe needs `screenshot` or `image_ref`")
            if k <= state.step_idx:  # forced back to an earlier step: later steps are undone
                rewind(state, k)
            prev_shot = await self.image(req.prev_screenshot, req.prev_image_ref)
            if prev_shot is not None and k > 0:
                state.screens[str(k - 1)] = prev_shot.ref
            response, event = await self._observe(state, k, shot, req.prev_action, timer)
            if k > expected:
                _mark_gap(state, response, event, expected, k)
            # Retries only ever ask for the latest steps again: older answers are dropped.
            stored = StoredResponse("observe", k, "", {**response, "_request": digest})
            self.store.save(state, stored, prune_before=k - 1)
            self._trace(response, sid, "observe", **event)
            return response

    async def _same_observe(self, req: Observe, digest: str, stored: dict[str, Any]) -> bool:
        """Whether ``req`` states what the stored answer of its step answered.

        The screenshot is compared by its reference, known only once decoded: a retry pays for
        that, a first observe does not (its key leaves the screenshot out).
        """
        if stored.pop("_request", digest) != digest:
            return False
        if req.image_ref is not None and req.screenshot is None:
            return req.image_ref == stored.get("image_ref")
        shot = await self.image(req.screenshot, req.image_ref)
        return shot is None or shot.ref == stored.get("image_ref")

    async def _observe(
        self, state: SessionState, k: int, shot: StoredImage, prev: Any, timer: Timer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        before = state.screens.get(str(k - 1)) if k > 0 else None
        executed: ResolvedAction | None = None
        result: ModelResult | None = None
        prompt: list[dict[str, Any]] = []
        if k > 0:
            if prev is None:
                raise ApiError(422, "bad_action", "observe of step_idx > 0 needs `prev_action`")
            executed = resolve(prev, state.platform, session_frame(state), state.action_format)
        # The detector reads the new screen and its own state only, never the history: it
        # runs on an image thread while the history call waits for the model.
        detect = asyncio.create_task(
            self._cpu(self._detect, state, shot.ref, _detector_actions(executed))
        )
        try:
            if executed is not None and before is not None:
                result, prompt = await self._history(state, before, shot.ref, executed)
            if executed is not None:
                self._append_step(state, k - 1, executed, before)
        except BaseException:
            detect.cancel()  # its outcome is not wanted (nor logged as never retrieved)
            raise
        signals = await detect
        for name in fired(signals):
            self.metrics.recurrence.labels(name).inc()
        state.screens[str(k)] = shot.ref
        state.step_idx = k
        state.last_seen = now()
        if executed is not None and signals.change is not None:
            state.steps[-1]["changed"] = not signals.change["no_effect"]
        recovery = choose_recovery(_step_records(state), task=state.task)
        if recovery is not None:
            self.metrics.recurrence.labels("recovery").inc()
        status = "degraded" if result is not None and result.status != "ok" else "ok"
        response = {
            "session_id": state.session_id,
            "step_idx": k,
            "status": status,
            "reason": result.reason if result is not None else None,
            "history": state.history_json(),
            "image_ref": shot.ref,
            "change": signals.change,
            "recurrence": signals.recurrence,
            "recovery": recovery.to_dict() if recovery is not None else None,
            "echo": state.echo(),
            "timing_ms": {
                "model": result.model_ms if result is not None else 0.0,
                "total": timer.total(),
            },
            "usage": result.usage if result is not None else {"prompt": 0, "completion": 0},
            **self.versions(),
        }
        event = {
            "step_idx": k,
            "image_ref": shot.ref,
            "prev_image_ref": before,
            "prev_action": executed.to_trace() if executed is not None else None,
            "prompt": prompt,
            "raw_output": result.raw_output if result is not None else None,
            "reasoning": result.reasoning if result is not None else None,
            "history": state.history_json(),
            "change": signals.change,
            "recurrence": signals.recurrence,
            "status": status,
            "reason": response["reason"],
            "timing_ms": response["timing_ms"],
        }
        return response, event

    async def _history(
        self, state: SessionState, before: str, after: str, executed: ResolvedAction
    ) -> tuple[ModelResult, list[dict[str, Any]]]:
        """The history update of an executed step: the model's result and the prompt sent."""
        if not self.images.has(before):
            # Known by reference only (a session re-created on another gateway): the history
            # update needs both screens, so it is skipped, openly, and the history kept.
            self.metrics.degraded.labels("observe", "missing_before").inc()
            state.stale = True
            return ModelResult(status="degraded", reason="missing_before"), []
        space = space_for_platform(state.platform)
        # The first update reads the profile's own opening summary (hivig's is the state's); a
        # profile may feed the model's own words back instead of the parsed record.
        previous = state.summary_text or state.summary
        if previous == INITIAL_HISTORY.summary:
            previous = self.critic.initial_summary
        messages = self.critic.history_messages(
            state.task, state.platform, previous, before, after, executed.step_text(space)
        )
        result = await self.critic.history(messages)
        self._apply_history(state, result)
        return result, messages_json(list(messages))

    def _detect(self, state: SessionState, ref: str, actions: list[Any] | None) -> Any:
        return self.detector.update(state, self.images.clean_frame(ref), actions)

    def _apply_history(self, state: SessionState, result: ModelResult) -> None:
        if isinstance(result.parsed, HistoryOutput):
            state.progress = result.parsed.progress
            state.last_result = result.parsed.last_result
            state.summary_text = self.critic.summary_to_feed(result.raw_output)
            state.history_version += 1
            state.stale = False
        else:
            # The previous history stays, flagged: the policy still gets a history.
            state.stale = True

    def _append_step(
        self, state: SessionState, index: int, executed: ResolvedAction, image_ref: str | None
    ) -> None:
        space = space_for_platform(state.platform)
        actions = [a.to_arguments() for a in executed.actions] if executed.actions else None
        state.steps.append(
            {
                "step_idx": index,
                "intent": executed.intent,
                "action_text": executed.tool_calls,
                "step_text": executed.step_text(space),
                "image_ref": image_ref,
                "last_action_result": state.last_result if not state.stale else None,
                "progress_summary": state.progress,
                "actions": actions,
            }
        )
        if executed.actions:
            start = tuple(state.pointer) if state.pointer else None
            moved = pointer_after(executed.actions, start)  # type: ignore[arg-type]
            state.pointer = list(moved) if moved is not None else None

    # -- critique ------------------------------------------------------------------------------

    async def critique(self, sid: str, req: Critique) -> dict[str, Any]:
        """``POST /v1/sessions/{sid}/critique``: verdict(s) on the proposed step(s)."""
        timer = Timer(time.perf_counter())
        k = req.step_idx
        async with self._session(sid):
            state = self._open_session(sid)
            # The key names the screen too: a session re-seeded from an earlier echo (an R3
            # Restore) reaches step k again on another screen, and must not get the old answer.
            key = _request_key(req, state.screens.get(str(k)))
            stored = self.store.response(sid, "critique", k, key)
            if stored is not None:
                self._trace_flag(stored, sid)
                return stored
            if k != state.step_idx:
                raise ApiError(
                    409,
                    "step_conflict",
                    f"critique step_idx {k} but the latest observed is {state.step_idx}",
                )
            shot = await self.image(req.screenshot, req.image_ref)
            ref = shot.ref if shot is not None else state.screens.get(str(k))
            if ref is None:
                raise ApiError(422, "bad_request", "no screenshot for this step: observe it first")
            response, event = await self._critique(state, ref, req, timer)
            state.last_seen = now()
            # A verdict lost to a timeout or a backend failure is not filed: a retry may get a
            # real one (a critique changes no session state, so nothing is applied twice).
            keep = not any(
                v.get("reason") in _RETRYABLE for v in response.get("results", [response])
            )
            self.store.save(state, StoredResponse("critique", k, key, response) if keep else None)
            self._trace(response, sid, "critique", step_idx=k, **event)
            return response

    async def _critique(
        self, state: SessionState, ref: str, req: Critique | CritiqueStateless, timer: Timer
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        items = _proposals(req, self.cfg.limits.max_candidates)
        frame = session_frame(state)
        resolved = [resolve(a, state.platform, frame, state.action_format) for a in items]
        trajectory = format_trajectory([s["step_text"] for s in state.steps])
        note = self.detector.note(state) if self.critic.recurrence_note else None
        if note:
            trajectory = f"{trajectory}\n\n{note}" if trajectory else note
        # A profile without drag arrows marks only drags that name both ends.
        drag_arrows = self.images.policy.drag_arrows
        pointer = tuple(state.pointer) if state.pointer and drag_arrows else None
        space = space_for_platform(state.platform)
        jobs = []
        for r in resolved:
            marks = r.marks(pointer)  # type: ignore[arg-type]
            messages = self.critic.critique_messages(
                state.task, state.platform, trajectory, ref, marks, r.step_text(space)
            )
            jobs.append((r, marks, messages))
        model_jobs = [j for j in jobs if not j[0].out_of_frame]
        self.queue.check(len(model_jobs))
        results = await asyncio.gather(*(self.critic.critique(m) for _, _, m in model_jobs))
        it = iter(results)
        verdicts = []
        for r, marks, _ in jobs:
            result = None if r.out_of_frame else next(it)
            verdict = self._verdict(state, r, marks, result, req.return_thinking)
            if req.return_image:
                verdict["annotated_image"] = await self._cpu(
                    self._annotated, ref, marks, state.platform
                )
            verdicts.append(verdict)
        recurrence = self.detector.last_recurrence(state)
        for v in verdicts:
            v["recurrence"] = recurrence
        common = {
            "history_version": state.history_version,
            "echo": state.echo(),
            "timing_ms": {"total": timer.total()},
            **self.versions(),
        }
        event = {
            "image_ref": ref,
            "actions": [r.to_trace() for r, _, _ in jobs],
            "marks": [[_mark_json(m) for m in marks] for _, marks, _ in jobs],
            "prompt": messages_json(list(jobs[0][2])),
            "raw_outputs": [v.pop("_raw") for v in verdicts],
            "verdicts": verdicts,
            "timing_ms": common["timing_ms"],
        }
        if req.candidates is not None:
            return {
                "results": verdicts,
                "ranking": rank([(v["verdict"], v["confidence"]) for v in verdicts]),
                **common,
            }, event
        return {**verdicts[0], **common}, event

    def _verdict(
        self,
        state: SessionState,
        r: ResolvedAction,
        marks: list[Any],
        result: ModelResult | None,
        return_thinking: bool,
    ) -> dict[str, Any]:
        marker = _marker(marks, state)
        base: dict[str, Any] = {
            "marker": marker,
            "action_text": r.tool_calls,
            "parse_error": r.error,
            "thinking": None,
            "confidence": None,
            "annotated_image": None,
            "_raw": None,
        }
        if result is None:  # out of frame: a rule answers, not the model
            self.metrics.rejected_coords.labels(state.coord_space).inc()
            self._count("bad", _GROUNDING, state.platform)
            return {
                **base,
                "status": "ok",
                "verdict": "bad",
                "source": "rule",
                "reason": "out_of_frame",
                "error_dimension": _GROUNDING,
                "explanation": _OFF_SCREEN,
                "parse_status": "ok",
                "truncated": False,
                "usage": {"prompt": 0, "completion": 0},
                "model_ms": 0.0,
            }
        parsed = result.parsed if isinstance(result.parsed, CritiqueOutput) else None
        verdict = parsed.verdict.lower() if parsed is not None else "abstain"
        dimension = parsed.dimension.name if parsed is not None and parsed.dimension else None
        self._count(verdict, dimension, state.platform)
        limit = self.cfg.critic.explanation_max_chars
        out = {
            **base,
            "status": result.status,
            "verdict": verdict,
            "source": "model" if parsed is not None else "fallback",
            "reason": result.reason,
            "error_dimension": dimension,
            "explanation": parsed.explanation[:limit] if parsed is not None else "",
            "parse_status": result.parse_status,
            "truncated": result.truncated,
            "usage": result.usage,
            "model_ms": result.model_ms,
            "_raw": result.raw_output,
        }
        if return_thinking and parsed is not None:
            out["thinking"] = parsed.think
        return out

    def _count(self, verdict: str, dimension: str | None, platform: str) -> None:
        self.metrics.verdicts.labels(verdict, platform).inc()
        if dimension:
            self.metrics.dimensions.labels(dimension, platform).inc()

    def _annotated(self, ref: str, marks: list[Any], platform: str) -> str:
        import base64

        from hivig.vision import FAST_PNG_LEVEL, draw_marks, encode_png, size_class_for_platform

        image = draw_marks(
            self.images.clean_frame(ref), marks, size_class_for_platform(platform)
        ).image
        return (
            "data:image/png;base64," + base64.b64encode(encode_png(image, FAST_PNG_LEVEL)).decode()
        )

    # -- stateless -----------------------------------------------------------------------------

    async def observe_stateless(self, req: ObserveStateless) -> dict[str, Any]:
        """``POST /v1/observe``: a history update with the caller's history and screenshots."""
        timer = Timer(time.perf_counter())
        state = new_state(req, "stateless")
        if req.previous_summary is not None:
            seed_summary(state, req.previous_summary)
        before = await self.image(req.before, req.before_ref)
        after = await self.image(req.after, req.after_ref)
        if after is None:
            raise ApiError(422, "bad_request", "observe needs `after` (or `after_ref`)")
        k = 0
        if before is not None:
            state.screens["0"] = before.ref
            state.step_idx, k = 0, 1
        response, _ = await self._observe(state, k, after, req.prev_action, timer)
        response.pop("session_id", None)
        return response

    async def critique_stateless(self, req: CritiqueStateless) -> dict[str, Any]:
        """``POST /v1/critique``: a verdict with the caller's trajectory and screenshot."""
        timer = Timer(time.perf_counter())
        state = new_state(req, "stateless")
        for i, step in enumerate(req.trajectory):
            executed = resolve(step, state.platform, session_frame(state), state.action_format)
            self._append_step(state, i, executed, None)
        shot = await self.image(req.screenshot, req.image_ref)
        if shot is None:
            raise ApiError(422, "bad_request", "critique needs `screenshot` or `image_ref`")
        self.detector.reset(state)
        response, _ = await self._critique(state, shot.ref, req, timer)
        response.pop("echo", None)
        return response

    # -- diagnosis jobs ------------------------------------------------------------------------

    def start_diagnosis(self, req: DiagnoseRequest) -> dict[str, Any]:
        """``POST /v1/diagnose``: start a job on a session's trace or an allowed path."""
        sid, path = req.session_id, req.path
        if sid is not None:
            if valid_session_id(sid):
                self.traces.flush(sid)  # events still waiting belong in the trace read
            if not valid_session_id(sid) or not self.traces.path(sid).is_file():
                raise ApiError(404, "unknown_session", f"no trace for session {sid!r}")
            target = self.traces.path(sid)
        elif path is not None:
            target = Path(path).resolve()
            roots = [Path(self.cfg.sessions.state_dir), *map(Path, self.cfg.diagnose.allowed_roots)]
            if not any(target.is_relative_to(r.resolve()) for r in roots):
                raise ApiError(
                    403,
                    "forbidden_path",
                    f"{path} is outside sessions.state_dir and diagnose.allowed_roots",
                )
            if not target.exists():
                raise ApiError(404, "unknown_path", f"{path} does not exist")
        else:
            raise ApiError(422, "bad_request", "diagnose needs `session_id` or `path`")
        job_id = uuid.uuid4().hex
        out = Path(self.cfg.sessions.state_dir) / "diagnoses" / job_id
        self.jobs[job_id] = {
            "job_id": job_id,
            "status": "pending",
            "running": False,
            "input": str(target),
            "out": str(out),
        }
        self._save_job(job_id)
        task = asyncio.create_task(self._diagnose(job_id, target, out))
        self._job_tasks.add(task)
        task.add_done_callback(self._job_tasks.discard)
        return {"job_id": job_id, "status": "pending", **self.versions()}

    async def _diagnose(self, job_id: str, target: Path, out: Path) -> None:
        from serve.diagnose import DiagnoseInputError, diagnose_async

        job = self.jobs[job_id]
        async with self._job_slots:
            job["running"] = True  # status stays "pending" until the job is done or failed
            try:
                result = await diagnose_async(
                    target,
                    backend=self.critic.backend,
                    top_k=self.cfg.diagnose.top_k,
                    out_dir=out,
                    frame=self.cfg.frame,
                )
            except DiagnoseInputError as e:
                job.update(status="failed", error=str(e), finished=time.time())
                return
            except Exception as e:  # a failed job reports why; the gateway keeps serving
                logger.exception("diagnosis job %s failed", job_id)
                job.update(status="failed", error=f"{type(e).__name__}: {e}", finished=time.time())
                return
            finally:
                self._save_job(job_id)
            job.update(
                status="done",
                result=result.to_json(),
                html=str(out / "diagnosis.html"),
                finished=time.time(),
            )
            self._save_job(job_id)

    def _job_file(self, job_id: str) -> Path:
        return Path(self.cfg.sessions.state_dir) / "diagnoses" / job_id / "job.json"

    def _save_job(self, job_id: str) -> None:
        """The job's state on disk too: another worker process may be asked for it."""
        path = self._job_file(job_id)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".job.{os.getpid()}.tmp")
            tmp.write_bytes(json.dumps(self.jobs[job_id], default=str).encode())
            os.replace(tmp, path)
        except OSError as e:  # the job still answers from this process
            logger.warning("diagnosis job %s: state not written (%s)", job_id, e.strerror or e)

    def _load_job(self, job_id: str) -> dict[str, Any] | None:
        if not _JOB_ID.fullmatch(job_id):
            return None
        try:
            return json.loads(self._job_file(job_id).read_bytes())
        except (OSError, ValueError):
            return None

    def job(self, job_id: str) -> dict[str, Any]:
        """``GET /v1/jobs/{id}``."""
        job = self.jobs.get(job_id) or self._load_job(job_id)
        if job is None:
            raise ApiError(404, "unknown_job", f"no job {job_id!r}")
        # Server paths are shown relative to the folder they live in, never absolute.
        roots = [Path(self.cfg.sessions.state_dir), *map(Path, self.cfg.diagnose.allowed_roots)]
        # Both spellings of each root: the job's paths may go through a symlink or "..".
        spellings = {str(r).rstrip("/") for r in roots} | {str(r.resolve()) for r in roots}
        ordered = sorted(spellings, key=len, reverse=True)  # the most specific root first
        return {**_relative_paths(job, ordered), **self.versions()}

    # -- warm-up -------------------------------------------------------------------------------

    async def warm_up(self) -> str:
        """Run one history update and one verdict on a blank screen; a readiness detail.

        The backend must answer both; whether the answers parse is reported, not required (a
        tiny random model never writes the contract, a trained one does).
        """
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (640, 400), (236, 236, 236)).save(buf, format="PNG")
        ref = (await self._cpu(self.images.put_bytes, buf.getvalue())).ref
        platform, task = "ubuntu", "Warm-up: check that the critic answers."
        history = self.critic.history_messages(
            task, platform, self.critic.initial_summary, ref, ref, "<tool_call>\n{}\n</tool_call>"
        )
        critique = self.critic.critique_messages(
            task, platform, "", ref, [], "<tool_call>\n{}\n</tool_call>"
        )
        h = await self.critic.history(history)
        c = await self.critic.critique(critique)
        failed = [r.reason for r in (h, c) if r.reason in ("timeout", "backend")]
        if failed:
            raise RuntimeError(f"backend did not answer the warm-up ({', '.join(failed)})")
        return f"ready (warm-up parse: history {h.parse_status}, critique {c.parse_status})"

    # -- images --------------------------------------------------------------------------------

    async def upload(self, req: ImageUpload) -> dict[str, Any]:
        """``POST /v1/images``."""
        start = time.perf_counter()
        stored = await self.images.put_inline(req.image, self.critic.budget.observe_deadline_s)
        return {
            "image_ref": stored.ref,
            "w": stored.width,
            "h": stored.height,
            "timing_ms": {"total": round((time.perf_counter() - start) * 1000, 2)},
            **self.versions(),
        }


# ---------------------------------------------------------------------------------------------
# Request helpers


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


def rewind(state: SessionState, k: int) -> None:
    """Undo everything from step ``k - 1`` on, so a forced observe of ``k`` replaces it.

    The history, pointer and screens go back to what they were after step ``k - 2``; the
    recurrence detector starts afresh (its state is not kept per step).
    """
    state.steps = [s for s in state.steps if s["step_idx"] < k - 1]
    state.screens = {j: r for j, r in state.screens.items() if int(j) < k}
    last = state.steps[-1] if state.steps else None
    if last is None or last.get("last_action_result") is None:
        state.progress, state.last_result = INITIAL_HISTORY.progress, INITIAL_HISTORY.last_result
    else:
        state.progress = str(last.get("progress_summary") or state.progress)
        state.last_result = str(last["last_action_result"])
    state.stale = False
    state.summary_text = ""  # the record of step k - 2 is fed back from here
    state.step_idx = k - 1
    actions = [
        a
        for step in state.steps
        for a in (action_from_arguments(x) for x in step.get("actions") or [])
        if not isinstance(a, ActionError)
    ]
    pointer = pointer_after(actions) if actions else None
    state.pointer = list(pointer) if pointer is not None else None
    state.detector, state.signals = None, None


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


def seed_summary(state: SessionState, summary: str | HistoryText) -> None:
    """Stateless observe: the caller's previous history (text or the ``history`` object)."""
    if isinstance(summary, HistoryText):
        state.progress, state.last_result = summary.progress_summary, summary.last_action_result
        return
    from hivig.contracts import parse_history

    parsed = parse_history(f"<think>-</think><summary>{summary}</summary>")
    if isinstance(parsed, HistoryOutput):
        state.progress, state.last_result = parsed.progress, parsed.last_result
    elif summary.strip():
        raise ApiError(
            422,
            "bad_request",
            "`previous_summary` needs 'Progress Summary:' and 'Last Action Result:' lines",
        )


def session_frame(state: SessionState) -> Frame:
    """The session's coordinate frame."""
    return Frame(
        state.coord_space, state.frame_w or state.screen_w, state.frame_h or state.screen_h
    )


def _relative_paths(value: Any, roots: list[str]) -> Any:
    """``value`` with every server path under one of ``roots`` made relative to it, wherever it
    stands in a string (an error message names paths mid-sentence)."""
    if isinstance(value, dict):
        return {k: _relative_paths(v, roots) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative_paths(v, roots) for v in value]
    if isinstance(value, str) and "/" in value:
        for root in roots:
            value = value.replace(f"{root}/", "")
            if value == root:
                value = "."
    return value


async def _lock_file(path: Path) -> int:
    """An open descriptor of ``path`` holding its exclusive ``flock``.

    While another process serves the session, the lock is polled from the event loop: a thread
    blocked in ``flock`` would hold a place of the default executor, which model calls share.
    """
    while True:
        fd = await _lock_open(path)
        # The sweep removes the lock files of closed sessions (holding their lock): one locked
        # after it was removed is no longer the session's, and a new one is made.
        if _same_file(fd, path):
            return fd
        os.close(fd)


async def _lock_open(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:  # the state folder refuses writes: the commit would fail as well
        raise StorageError(f"session lock file unavailable: {e.strerror or e}") from None
    pause = 0.001
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.05)
    except OSError as e:  # no locks on this filesystem (ENOLCK on some network mounts)
        os.close(fd)
        raise StorageError(f"session lock unavailable: {e.strerror or e}") from None
    except BaseException:
        os.close(fd)
        raise


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _remove_lock_file(path: Path) -> int:
    """Remove a session's lock file unless a request holds it (1 when removed).

    The file is removed while its lock is held here, so a process that opened it before and
    waits for it sees, once it has the lock, that the path names another file (``_lock_file``).
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _same_file(fd, path):
            return 0
        path.unlink()
        return 1
    except OSError:  # held by a request (BlockingIOError), or already gone: kept for now
        return 0
    finally:
        os.close(fd)


def _job_time(folder: Path) -> float:
    """When a diagnosis job finished; for one that never did, when its state was last written
    (its folder's, for one with no state)."""
    path = folder / "job.json"
    try:
        job = json.loads(path.read_bytes())
        if job.get("status") != "pending" and job.get("finished"):
            return float(job["finished"])
        return path.stat().st_mtime
    except (OSError, ValueError, TypeError, AttributeError):
        try:
            return folder.stat().st_mtime
        except OSError:
            return time.time()  # gone meanwhile, or unreadable: not removed now


def _observe_key(req: Observe) -> str:
    """What an observe states besides its screenshot (compared by reference on a retry)."""
    text = req.model_dump_json(include={"prev_action", "prev_screenshot", "prev_image_ref"})
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _mark_gap(
    state: SessionState,
    response: dict[str, Any],
    event: dict[str, Any],
    expected: int,
    k: int,
) -> None:
    """A forced observe past missing steps: the history lacks them, so it is flagged stale."""
    state.stale = True
    gap = {"status": "degraded", "reason": "history_gap", "history": state.history_json()}
    response.update(gap, echo=state.echo())
    event.update(gap, missing_steps=[expected, k - 1])


def _proposals(req: Critique | CritiqueStateless, limit: int) -> list[Any]:
    if req.candidates is None:
        return [req.action]
    if len(req.candidates) > limit:
        raise ApiError(422, "bad_action", f"at most {limit} candidates per critique")
    return req.candidates


def _request_key(req: Critique, screen: str | None) -> str:
    """Idempotency key of a critique: what is judged, on which screen."""
    keep: dict[str, Any] = {
        "action": req.action,
        "candidates": req.candidates,
        "image_ref": req.image_ref,
        "return_thinking": req.return_thinking,
        "screen": screen,
    }
    if req.screenshot:
        keep["screenshot"] = hashlib.sha256(str(req.screenshot).encode()).hexdigest()
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _step_records(state: SessionState) -> list[StepRecord]:
    """The executed steps as ReTrace records: the screen each step led to, and how it went."""
    records = [StepRecord(0, state.screens.get("0", ""), progress_summary=None)]
    for step in state.steps:
        k = step["step_idx"] + 1
        ref = state.screens.get(str(k))
        if ref is None:
            continue
        records.append(
            StepRecord(
                k,
                ref,
                step.get("last_action_result"),
                action_text=step.get("action_text"),
                intent=step.get("intent"),
                progress_summary=step.get("progress_summary"),
                changed=step.get("changed"),
            )
        )
    return [r for r in records if r.image_ref]


def _detector_actions(executed: ResolvedAction | None) -> list[Any] | None:
    """What the detector compares: typed actions, or the raw text when the parse failed."""
    if executed is None:
        return None
    return list(executed.actions) if executed.actions else [executed.raw]


def _mark_json(mark: Any) -> dict[str, Any]:
    if isinstance(mark, ArrowMark):
        return {"shape": "arrow", "x": mark.x1, "y": mark.y1, "x2": mark.x2, "y2": mark.y2}
    return {"shape": "x", "x": mark.x, "y": mark.y}


def _marker(marks: list[Any], state: SessionState) -> dict[str, Any] | None:
    """The ``marker`` field: the step's main mark on the grid and in screen pixels."""
    if not marks:
        return None
    # A drag's arrow is the gesture (its move-to-start X is only where it begins).
    arrows = [m for m in marks if isinstance(m, ArrowMark)]
    m = arrows[-1] if arrows else marks[0]
    frame = Frame("screen_px", state.screen_w, state.screen_h)
    if isinstance(m, ArrowMark):
        x_px, y_px = frame.from_grid(m.x1, m.y1)
        x2_px, y2_px = frame.from_grid(m.x2, m.y2)
        return {
            "x_1000": m.x1,
            "y_1000": m.y1,
            "x_px": x_px,
            "y_px": y_px,
            "x2_1000": m.x2,
            "y2_1000": m.y2,
            "x2_px": x2_px,
            "y2_px": y2_px,
            "shape": "arrow",
        }
    x_px, y_px = frame.from_grid(m.x, m.y)
    return {"x_1000": m.x, "y_1000": m.y, "x_px": x_px, "y_px": y_px, "shape": "x"}
