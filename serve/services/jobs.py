"""Diagnosis jobs: started by ``POST /v1/diagnose``, run in the background, kept on disk.

A job's state is ``diagnoses/<job_id>/job.json`` under the state folder as well as in memory,
so any worker process sharing the folder answers ``GET /v1/jobs/{id}``. The sweep forgets
finished jobs from memory after ``sessions.ttl_s`` and removes their folders after
``retention.jobs_keep_s``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hivig.backends import InferenceBackend
from hivig.files import write_atomic
from serve.config import ServeConfig
from serve.errors import ApiError
from serve.protocol import DiagnoseRequest, JobAnswer
from serve.services.answers import Versions
from serve.services.sessions import SweepSteps
from serve.traces import TraceWriter, valid_session_id

logger = logging.getLogger(__name__)

JOB_ID = re.compile(r"[0-9a-f]{32}")


@dataclass
class JobRecord:
    """One diagnosis job as ``job.json`` holds it (fields left ``None`` are not written).

    Attributes:
        job_id: 32 hex digits.
        status: ``pending`` until the job is ``done`` or ``failed``.
        running: Whether it left the queue of jobs waiting for a slot.
        input: The trace file or folder diagnosed.
        out: Its output folder.
        error: Why it failed.
        result: The diagnosis (``DiagnosisResult.to_json``).
        html: The report page.
        finished: When it ended (epoch seconds).
    """

    job_id: str
    status: str
    running: bool
    input: str
    out: str
    error: str | None = None
    result: dict[str, Any] | None = None
    html: str | None = None
    finished: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``job.json`` and of the job's answer."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


class JobService:
    """``POST /v1/diagnose`` and ``GET /v1/jobs/{id}``: background diagnosis jobs."""

    def __init__(
        self,
        cfg: ServeConfig,
        backend: InferenceBackend,
        traces: TraceWriter,
        versions: Versions,
    ) -> None:
        """Jobs under ``state_dir/diagnoses``, at most ``diagnose.max_jobs`` running at once."""
        self.cfg = cfg
        self.backend = backend
        self.traces = traces
        self.versions = versions
        self.root = Path(cfg.sessions.state_dir) / "diagnoses"
        self.jobs: dict[str, JobRecord] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(cfg.diagnose.max_jobs)

    def start(self, req: DiagnoseRequest) -> JobAnswer:
        """``POST /v1/diagnose``: start a job on a session's trace or an allowed path."""
        target = self._target(req)
        job_id = uuid.uuid4().hex
        out = self.root / job_id
        self.jobs[job_id] = JobRecord(job_id, "pending", False, str(target), str(out))
        self._save(job_id)
        task = asyncio.create_task(self._run(job_id, target, out))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return JobAnswer.model_construct(job_id=job_id, status="pending", **self.versions())

    def _target(self, req: DiagnoseRequest) -> Path:
        sid, path = req.session_id, req.path
        if sid is not None:
            if valid_session_id(sid):
                self.traces.flush(sid)  # events still waiting belong in the trace read
            if not valid_session_id(sid) or not self.traces.path(sid).is_file():
                raise ApiError(404, "unknown_session", f"no trace for session {sid!r}")
            return self.traces.path(sid)
        if path is not None:
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
            return target
        raise ApiError(422, "bad_request", "diagnose needs `session_id` or `path`")

    async def _run(self, job_id: str, target: Path, out: Path) -> None:
        from serve.diagnose import DiagnoseInputError, diagnose_async

        job = self.jobs[job_id]
        async with self._slots:
            job.running = True  # status stays "pending" until the job is done or failed
            try:
                result = await diagnose_async(
                    target,
                    backend=self.backend,
                    top_k=self.cfg.diagnose.top_k,
                    out_dir=out,
                    frame=self.cfg.frame,
                )
            except DiagnoseInputError as e:
                job.status, job.error, job.finished = "failed", str(e), time.time()
                return
            except Exception as e:  # a failed job reports why; the gateway keeps serving
                logger.exception("diagnosis job %s failed", job_id)
                job.status, job.error = "failed", f"{type(e).__name__}: {e}"
                job.finished = time.time()
                return
            finally:
                self._save(job_id)
            job.status, job.result = "done", result.to_json()
            job.html, job.finished = str(out / "diagnosis.html"), time.time()
            self._save(job_id)

    def _file(self, job_id: str) -> Path:
        return self.root / job_id / "job.json"

    def _save(self, job_id: str) -> None:
        """The job's state on disk too: another worker process may be asked for it."""
        try:
            text = json.dumps(self.jobs[job_id].to_json(), default=str)
            write_atomic(self._file(job_id), text, durable=False)
        except OSError as e:  # the job still answers from this process
            logger.warning("diagnosis job %s: state not written (%s)", job_id, e.strerror or e)

    def _load(self, job_id: str) -> dict[str, Any] | None:
        if not JOB_ID.fullmatch(job_id):
            return None
        try:
            return json.loads(self._file(job_id).read_bytes())
        except (OSError, ValueError):
            return None

    def get(self, job_id: str) -> JobAnswer:
        """``GET /v1/jobs/{id}``."""
        known = self.jobs.get(job_id)
        job = known.to_json() if known is not None else self._load(job_id)
        if job is None:
            raise ApiError(404, "unknown_job", f"no job {job_id!r}")
        # Server paths are shown relative to the folder they live in, never absolute.
        roots = [Path(self.cfg.sessions.state_dir), *map(Path, self.cfg.diagnose.allowed_roots)]
        # Both spellings of each root: the job's paths may go through a symlink or "..".
        spellings = {str(r).rstrip("/") for r in roots} | {str(r.resolve()) for r in roots}
        ordered = sorted(spellings, key=len, reverse=True)  # the most specific root first
        return JobAnswer.model_construct(**_relative_paths(job, ordered), **self.versions())

    # -- the sweep -----------------------------------------------------------------------------

    def sweep_steps(self) -> SweepSteps:
        """The jobs' part of the sweep: finished jobs leave memory after ``sessions.ttl_s``
        (still on disk, ``_load``) and their folders go after ``retention.jobs_keep_s``."""
        horizon = time.time() - self.cfg.sessions.ttl_s
        for job_id, job in list(self.jobs.items()):
            if job.status != "pending" and (job.finished or 0) < horizon:
                del self.jobs[job_id]
        running = frozenset(j for j, job in self.jobs.items() if job.status == "pending")
        return (yield functools.partial(self._sweep_folders, running))

    def _sweep_folders(self, running: frozenset[str]) -> int:
        """Remove job folders finished more than ``retention.jobs_keep_s`` ago (or, never
        finished, last written that long ago: their process died); how many."""
        horizon = time.time() - self.cfg.retention.jobs_keep_s
        removed = 0
        try:
            folders = [e for e in os.scandir(self.root) if JOB_ID.fullmatch(e.name)]
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
