"""Session state behind one small interface: embedded SQLite (default) or memory.

A session is one agent episode. Its state (macro history, executed steps, screens per step, the
recurrence detector's state) is one JSON document, saved in the same transaction as the response
it produced, so a restarted gateway answers a runner's retry of the last step with the stored
response and continues the next step where it left off. SQLite runs in WAL mode with
``synchronous=NORMAL``: readers never wait for the writer, and a crash of the gateway process
loses no committed step (an operating-system crash may lose the last few commits).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from hivig import jsonio
from hivig.contracts import INITIAL_HISTORY

logger = logging.getLogger(__name__)


def _document(text: str | bytes) -> Any:
    """A stored JSON document. Earlier builds could store ``Infinity``/``NaN`` (the strict
    parser refuses them), so such a document is read with the standard library instead."""
    try:
        return jsonio.loads(text)
    except jsonio.JSONDecodeError:
        return json.loads(text)


@dataclass
class SessionState:
    """Everything the gateway keeps about one episode (JSON round-trippable)."""

    session_id: str
    task: str
    platform: str
    screen_w: int
    screen_h: int
    coord_space: str = "screen_px"
    frame_w: int = 0
    frame_h: int = 0
    action_format: str = "auto"
    policy_id: str = ""
    volatile_regions: list[list[int]] = field(default_factory=list)
    created: float = 0.0
    last_seen: float = 0.0
    closed: bool = False
    step_idx: int = -1
    """Latest observed step; -1 before the first observe."""
    screens: dict[str, str] = field(default_factory=dict)
    """Step index (as a string, for JSON) -> image reference of the screen seen before it."""
    progress: str = INITIAL_HISTORY.progress
    last_result: str = INITIAL_HISTORY.last_result
    history_version: int = 0
    stale: bool = False
    steps: list[dict[str, Any]] = field(default_factory=list)
    """Executed steps, oldest first: ``step_idx``, ``intent``, ``action_text``, ``step_text``,
    ``image_ref``, ``last_action_result``, ``actions`` (tool-call JSON, or null when raw)."""
    pointer: list[int] | None = None
    detector: str | None = None
    """The recurrence detector's state (``hivig.recurrence.DetectorState.to_json``)."""
    signals: dict[str, Any] | None = None
    """The detector's latest ``change``, ``recurrence`` and prompt ``note``."""

    @property
    def summary(self) -> str:
        """The macro history as the next history update reads it."""
        return f"Progress Summary: {self.progress}\nLast Action Result: {self.last_result}"

    def history_json(self) -> dict[str, Any]:
        """The ``history`` object of responses."""
        return {
            "progress_summary": self.progress,
            "last_action_result": self.last_result,
            "version": self.history_version,
            "stale": self.stale,
        }

    def echo(self) -> dict[str, Any]:
        """Everything a client needs to re-create this session on another gateway."""
        return {
            "session_id": self.session_id,
            "task": self.task,
            "platform": self.platform,
            "screen": {"w": self.screen_w, "h": self.screen_h},
            "coord_space": self.coord_space,
            "frame": {"w": self.frame_w, "h": self.frame_h},
            "step_idx": self.step_idx,
            "summary": self.history_json(),
            "screens": dict(self.screens),
            "steps": [dict(s) for s in self.steps],
            "pointer": self.pointer,
        }

    def to_json(self) -> str:
        """Serialised state."""
        # A shallow field map: ``asdict`` deep-copies every step first, which cost more than the
        # whole rest of a request once a session has a few dozen steps.
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        return jsonio.dumps(state).decode()

    @classmethod
    def from_json(cls, text: str) -> SessionState:
        """Inverse of ``to_json``."""
        return cls(**_document(text))


@dataclass(frozen=True)
class StoredResponse:
    """A response filed under ``(session, kind, step, key)`` for idempotent retries."""

    kind: str
    step_idx: int
    key: str
    body: dict[str, Any]


class SessionStore(Protocol):
    """Where sessions live. Every method is quick and blocking; callers hold a session lock."""

    def load(self, session_id: str) -> SessionState | None:
        """The session, or ``None``."""
        ...

    def save(
        self,
        state: SessionState,
        response: StoredResponse | None = None,
        *,
        prune_before: int | None = None,
    ) -> None:
        """Write the state (and the response it produced) atomically; with ``prune_before``,
        drop the session's stored responses of earlier steps in the same write (no retry asks
        for them any more)."""
        ...

    def response(
        self, session_id: str, kind: str, step_idx: int, key: str
    ) -> dict[str, Any] | None:
        """A stored response, or ``None``."""
        ...

    def expire(self, idle_before: float, busy: frozenset[str] = frozenset()) -> list[str]:
        """Close sessions last seen before ``idle_before`` (epoch seconds), except ``busy`` ones
        (a request is in flight); their ids."""
        ...

    def forget(self, session_id: str) -> None:
        """Drop a session's stored responses (it is being re-created, or it closed)."""
        ...

    def count_open(self) -> int:
        """Open sessions."""
        ...

    def close(self) -> None:
        """Release the store."""
        ...


class MemoryStore:
    """Sessions in a dict: fast, lost on restart (tests, throwaway runs)."""

    def __init__(self) -> None:
        """An empty store."""
        self._states: dict[str, str] = {}
        self._responses: dict[tuple[str, str, int, str], str] = {}
        self._lock = threading.Lock()

    def load(self, session_id: str) -> SessionState | None:
        with self._lock:
            text = self._states.get(session_id)
        return SessionState.from_json(text) if text is not None else None

    def save(
        self,
        state: SessionState,
        response: StoredResponse | None = None,
        *,
        prune_before: int | None = None,
    ) -> None:
        with self._lock:
            self._states[state.session_id] = state.to_json()
            if prune_before is not None:
                sid = state.session_id
                for key in [k for k in self._responses if k[0] == sid and k[2] < prune_before]:
                    del self._responses[key]
            if response is not None:
                key = (state.session_id, response.kind, response.step_idx, response.key)
                self._responses[key] = jsonio.dumps(response.body)

    def response(
        self, session_id: str, kind: str, step_idx: int, key: str
    ) -> dict[str, Any] | None:
        with self._lock:
            text = self._responses.get((session_id, kind, step_idx, key))
        return _document(text) if text is not None else None

    def expire(self, idle_before: float, busy: frozenset[str] = frozenset()) -> list[str]:
        gone = []
        for sid in list(self._states):
            state = self.load(sid)
            if sid in busy:
                continue
            if state is not None and not state.closed and state.last_seen < idle_before:
                state.closed = True
                self.save(state)
                gone.append(sid)
        return gone

    def forget(self, session_id: str) -> None:
        with self._lock:
            for key in [k for k in self._responses if k[0] == session_id]:
                del self._responses[key]

    def count_open(self) -> int:
        with self._lock:
            texts = list(self._states.values())
        return sum(not jsonio.loads(t)["closed"] for t in texts)

    def close(self) -> None:
        return None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, last_seen REAL NOT NULL, closed INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS responses (
    session_id TEXT NOT NULL, kind TEXT NOT NULL, step_idx INTEGER NOT NULL, key TEXT NOT NULL,
    body TEXT NOT NULL, PRIMARY KEY (session_id, kind, step_idx, key)
);
"""


class SQLiteStore:
    """Sessions in an embedded SQLite file (WAL): a gateway restart loses nothing committed."""

    def __init__(self, path: str | Path) -> None:
        """Open (or create) the database at ``path``."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # One connection shared under a lock: statements take microseconds, and SQLite
        # serialises writers anyway.
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def load(self, session_id: str) -> SessionState | None:
        with self._lock:
            row = self._db.execute(
                "SELECT state FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        return SessionState.from_json(row[0]) if row else None

    def save(
        self,
        state: SessionState,
        response: StoredResponse | None = None,
        *,
        prune_before: int | None = None,
    ) -> None:
        text = state.to_json()  # serialised before the lock: other sessions' writes go on
        body = jsonio.dumps(response.body).decode() if response is not None else None
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO sessions (id, state, last_seen, closed)"
                    " VALUES (?, ?, ?, ?)",
                    (state.session_id, text, state.last_seen, int(state.closed)),
                )
                if prune_before is not None:
                    self._db.execute(
                        "DELETE FROM responses WHERE session_id = ? AND step_idx < ?",
                        (state.session_id, prune_before),
                    )
                if response is not None:
                    self._db.execute(
                        "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                        (
                            state.session_id,
                            response.kind,
                            response.step_idx,
                            response.key,
                            body,
                        ),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def response(
        self, session_id: str, kind: str, step_idx: int, key: str
    ) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT body FROM responses"
                " WHERE session_id = ? AND kind = ? AND step_idx = ? AND key = ?",
                (session_id, kind, step_idx, key),
            ).fetchone()
        return _document(row[0]) if row else None

    def expire(self, idle_before: float, busy: frozenset[str] = frozenset()) -> list[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM sessions WHERE closed = 0 AND last_seen < ?", (idle_before,)
            ).fetchall()
        gone = []
        for (sid,) in rows:
            if sid in busy:
                continue
            try:
                state = self.load(sid)
            except (ValueError, TypeError) as e:
                # An unreadable document must not stop the sweep for every session after it.
                logger.warning("session %s: unreadable state (%s); closed", sid, e)
                with self._lock:
                    self._db.execute("UPDATE sessions SET closed = 1 WHERE id = ?", (sid,))
                gone.append(sid)
                continue
            if state is not None:
                state.closed = True
                self.save(state)
                gone.append(sid)
        return gone

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM responses WHERE session_id = ?", (session_id,))

    def count_open(self) -> int:
        with self._lock:
            return int(
                self._db.execute("SELECT COUNT(*) FROM sessions WHERE closed = 0").fetchone()[0]
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()


def open_store(kind: str, state_dir: str | Path) -> SessionStore:
    """The store a config names (``sqlite`` under ``state_dir``, or ``memory``)."""
    if kind == "memory":
        return MemoryStore()
    return SQLiteStore(Path(state_dir) / "sessions.sqlite")


def now() -> float:
    """Wall-clock seconds (one place, so tests can reason about TTLs)."""
    return time.time()
