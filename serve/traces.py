"""Per-session JSONL traces: the input of ``diagnose`` and a source of new training data.

One file per session (``traces/<session_id>.jsonl``), one JSON object per event, appended and
flushed before the response is sent, so a trace is complete up to the last answered request.
Images are referenced by ``image_ref`` (stored once under ``images/``), never inlined.

A trace never fails a request: an event the folder does not take (unwritable, full, gone) waits
in memory and is written, in order, before the session's next event or by ``flush`` (the
gateway's minute sweep); the answer says so meanwhile (``TraceWriter.status``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import re
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from hivig import jsonio
from hivig.messages import ChatMessage, ImagePart, ImageRef, TextPart
from serve.metrics import Metrics

logger = logging.getLogger(__name__)

_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def messages_json(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Prompt messages as JSON; images as their reference and marks."""
    out = []
    for message in messages:
        content: list[dict[str, Any]] = []
        for part in message.content:
            if isinstance(part, TextPart):
                content.append({"type": "text", "text": part.text})
            elif isinstance(part, ImagePart) and isinstance(part.image, ImageRef):
                marks = [{"kind": type(m).__name__, **asdict(m)} for m in part.image.marks]
                content.append({"type": "image", "ref": part.image.path, "marks": marks})
            else:
                content.append({"type": "image", "ref": None, "marks": []})
        out.append({"role": message.role, "content": content})
    return out


_BACKLOG_BYTES = 64 * 1024 * 1024
"""Events kept in memory while the folder takes no writes: about 4,500 agent steps (an observe
and a critique with their prompts are about 15 KB), 90 s of a gateway at 50 steps/s. Past it
events are dropped (counted)."""


class TraceWriter:
    """Appends events to ``<root>/<session_id>.jsonl``; what cannot be written yet waits."""

    def __init__(
        self, root: str | Path, metrics: Metrics | None = None, backlog_bytes: int = _BACKLOG_BYTES
    ) -> None:
        """Write under ``root`` (created); count failed writes on ``metrics``."""
        self.root = Path(root)
        self._metrics = metrics
        self._backlog_bytes = backlog_bytes
        self._lock = threading.Lock()
        self._pending: dict[str, list[bytes]] = {}  # per session, oldest first
        self._pending_bytes = 0
        self._lost: dict[str, int] = {}
        self._failing = False
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            # Serving goes on: events wait until the folder can be made (see ``_append``).
            logger.warning("traces folder %s cannot be created (%s)", self.root, e.strerror)

    def path(self, session_id: str) -> Path:
        """The trace file of a session."""
        return self.root / f"{session_id}.jsonl"

    def write(self, session_id: str, event: str, **fields: Any) -> bool:
        """Append one event (``time`` is added); whether the session's trace is complete now."""
        record = {
            "event": event,
            "session_id": session_id,
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
            **fields,
        }
        line = jsonio.dumps(record, default=str) + b"\n"
        with self._lock:
            written = self._flush_session(session_id, line)
            if not written:
                self._count("deferred")
                self._trim()
            self._gauge()
        return written

    def flush(self, session_id: str | None = None) -> int:
        """Write what waits (for one session, or all); the events still waiting."""
        with self._lock:
            for sid in [session_id] if session_id is not None else list(self._pending):
                self._flush_session(sid)
            self._gauge()
            return sum(len(lines) for lines in self._pending.values())

    def status(self, session_id: str) -> str | None:
        """``None`` when the trace holds every event; ``pending`` while some wait to be written,
        ``incomplete`` once some were dropped (the backlog overflowed)."""
        with self._lock:
            if self._lost.get(session_id):
                return "incomplete"
            return "pending" if session_id in self._pending else None

    def _flush_session(self, session_id: str, line: bytes | None = None) -> bool:
        lines = self._pending.pop(session_id, [])
        if line is not None:
            lines.append(line)
            self._pending_bytes += len(line)
        if not lines:
            return True
        try:
            _append(self.path(session_id), b"".join(lines))
        except OSError as e:
            self._pending[session_id] = lines
            if not self._failing:
                logger.warning(
                    "trace write to %s failed (%s): events wait in memory (up to %d MiB) and "
                    "are written once it takes writes again",
                    self.root,
                    e.strerror or e,
                    self._backlog_bytes >> 20,
                )
                self._failing = True
            return False
        self._pending_bytes -= sum(map(len, lines))
        if self._failing and not self._pending:
            logger.info("trace writes to %s work again; every waiting event written", self.root)
            self._failing = False
        return True

    def _trim(self) -> None:
        """Drop waiting events past the backlog limit, the oldest of the session written to least
        recently first (memory stays bounded)."""
        while self._pending_bytes > self._backlog_bytes and self._pending:
            sid = next(iter(self._pending))
            lines = self._pending[sid]
            self._pending_bytes -= len(lines.pop(0))
            if not lines:
                del self._pending[sid]
            self._lost[sid] = self._lost.get(sid, 0) + 1
            self._count("dropped")
            if self._lost[sid] == 1:  # once per session; the metric counts every event
                logger.error("trace of session %s is losing events: the backlog is full", sid)

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.trace_errors.labels(outcome).inc()

    def _gauge(self) -> None:
        if self._metrics is not None:
            self._metrics.trace_pending.set(sum(len(v) for v in self._pending.values()))


def _append(path: Path, data: bytes) -> None:
    """Append ``data`` whole or not at all (a half line would read as a corrupt event)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)  # the folder was removed under us
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):  # the write's own error is the one reported
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def valid_session_id(session_id: str) -> bool:
    """Session ids become file names: letters, digits, ``_.-`` only."""
    # fullmatch: ``$`` would also match before a final newline ("abc\n" names a file too).
    return bool(_SAFE_ID.fullmatch(session_id)) and session_id not in (".", "..")
