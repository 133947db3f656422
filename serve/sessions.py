"""Session state behind one small interface: embedded SQLite (default) or memory.

A session is one agent episode. Its state (macro history, executed steps, screens per step, the
recurrence detector's state) is one JSON document, saved in the same transaction as the response
it produced, so a restarted gateway answers a runner's retry of the last step with the stored
response and continues the next step where it left off. SQLite runs with a rollback journal
(``journal_mode=TRUNCATE``, ``synchronous=NORMAL``): every commit is on disk before its answer
leaves, a failing disk is an error on the request (``serve.errors.StorageError``, answered 503),
never a crash, and a corrupt file is moved aside at start-up (clients re-create their sessions
from the echo).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from hivig import jsonio
from hivig.contracts import INITIAL_HISTORY
from hivig.files import atomic_path
from serve.errors import StorageError

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
    summary_text: str = ""
    """The model's own text inside ``<summary>`` of the latest update, for a profile that feeds
    it back verbatim (``render.summary_feedback: inner``); empty: ``summary`` is fed back."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """Executed steps, oldest first: ``step_idx``, ``intent``, ``action_text``, ``step_text``,
    ``image_ref``, ``last_action_result``, ``progress_summary``, ``actions`` (tool-call JSON, or
    null when raw) and, once the next screen is seen, ``changed`` (``serve.protocol.EchoStep``)."""
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


_REQUEST = "_request"
"""Where a stored document keeps ``StoredResponse.request`` beside the answer's fields."""


@dataclass(frozen=True)
class StoredResponse:
    """A response filed under ``(session, kind, step, key)`` for idempotent retries.

    Attributes:
        kind: ``observe`` or ``critique``.
        step_idx: The step it answered.
        key: What else names the request (a critique's proposals and screen); ``""`` for none.
        body: The answer as sent (``serve.protocol.dump_answer``), replayed as is.
        request: A digest of what the request stated beyond its key, compared on a retry (an
            observe's action and previous screen); ``None`` when there is nothing to compare.
    """

    kind: str
    step_idx: int
    key: str
    body: dict[str, Any]
    request: str | None = None

    def document(self) -> dict[str, Any]:
        """The JSON object stored: the answer's fields, then the request digest."""
        return self.body if self.request is None else {**self.body, _REQUEST: self.request}

    @classmethod
    def of_document(
        cls, kind: str, step_idx: int, key: str, document: dict[str, Any]
    ) -> StoredResponse:
        """Inverse of ``document``."""
        request = document.pop(_REQUEST, None)
        return cls(kind, step_idx, key, document, request)


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
    ) -> StoredResponse | None:
        """A stored response, or ``None``."""
        ...

    def expire(
        self, idle_before: float, busy: frozenset[str] = frozenset(), limit: int | None = None
    ) -> list[str]:
        """Close sessions last seen before ``idle_before`` (epoch seconds), except ``busy`` ones
        (a request is in flight), and drop their stored responses: at most ``limit`` of them
        (the longest idle first), in one write; their ids."""
        ...

    def purge_closed(self, before: float, keep: int, limit: int) -> list[str]:
        """Remove closed sessions last seen before ``before``, and the oldest closed ones past
        the ``keep`` most recent: at most ``limit`` of them, in one write; their ids."""
        ...

    def open_among(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` name open sessions."""
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
                self._responses[key] = jsonio.dumps(response.document())

    def response(
        self, session_id: str, kind: str, step_idx: int, key: str
    ) -> StoredResponse | None:
        with self._lock:
            text = self._responses.get((session_id, kind, step_idx, key))
        if text is None:
            return None
        return StoredResponse.of_document(kind, step_idx, key, _document(text))

    def expire(
        self, idle_before: float, busy: frozenset[str] = frozenset(), limit: int | None = None
    ) -> list[str]:
        gone = []
        for sid in list(self._states):
            if limit is not None and len(gone) >= limit:
                break
            state = self.load(sid)
            if sid in busy:
                continue
            if state is not None and not state.closed and state.last_seen < idle_before:
                state.closed = True
                self.save(state)
                self.forget(sid)
                gone.append(sid)
        return gone

    def purge_closed(self, before: float, keep: int, limit: int) -> list[str]:
        with self._lock:
            closed = sorted(
                (doc["last_seen"], sid)
                for sid, doc in ((sid, jsonio.loads(t)) for sid, t in self._states.items())
                if doc["closed"]
            )
            excess = len(closed) - keep
            gone = [sid for i, (seen, sid) in enumerate(closed) if i < excess or seen < before]
            for sid in gone[:limit]:
                del self._states[sid]
        for sid in gone[:limit]:
            self.forget(sid)
        return gone[:limit]

    def open_among(self, ids: list[str]) -> set[str]:
        with self._lock:
            texts = {sid: self._states.get(sid) for sid in ids}
        return {sid for sid, t in texts.items() if t is not None and not jsonio.loads(t)["closed"]}

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
CREATE INDEX IF NOT EXISTS sessions_by_age ON sessions (closed, last_seen);
"""
# The index lets the sweep and the open-sessions count read ids and ages without walking every
# state document (the column after a large document lies in its overflow pages).

_PARAMS = 500
"""Ids bound in one ``IN (...)`` list (SQLite allows 32,766 from 3.32 on, 999 before)."""


class SQLiteStore:
    """Sessions in an embedded SQLite file: a gateway restart loses nothing committed.

    Storage faults never take the process down: every SQLite I/O goes through ``read(2)`` and
    ``write(2)`` (a rollback journal, no memory-mapped WAL index), so a read-only, full or
    failing disk is an error on the request (``StorageError``), and a file deleted or replaced
    under the running gateway is noticed on the next write and put back.
    """

    def __init__(self, path: str | Path) -> None:
        """Open (or create) the database at ``path``; a corrupt one is moved aside first.

        Raises:
            StorageError: The file cannot be opened, or is corrupt and cannot be moved aside.
        """
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db, self._inode = self._open()
        except (OSError, sqlite3.Error) as e:
            raise StorageError(f"session store {self.path} cannot be opened: {e}") from e

    # -- the file ------------------------------------------------------------------------------

    def _open(self) -> tuple[sqlite3.Connection, tuple[int, int] | None]:
        # The header is checked before SQLite sees the file: on a file it cannot read, closing
        # the connection deletes the -wal and -shm files that belong with it.
        reason = _bad_header(self.path)
        if reason is None:
            try:
                return _connect(self.path)
            except sqlite3.DatabaseError as e:
                if not _corrupt(e):
                    raise
                reason = str(e)
        target = _quarantine(self.path)
        logger.warning(
            "session store %s is corrupt (%s): moved aside to %s; starting with no sessions "
            "(clients re-create theirs from the echo)",
            self.path,
            reason,
            target.name,
        )
        return _connect(self.path)

    def _reattach(self) -> None:
        """Put the sessions back in a real file when the path no longer names the open one.

        A deleted store would otherwise go on taking commits into an unlinked inode, and every
        session would be gone at the next restart.
        """
        found = _inode(self.path)
        if found == self._inode:
            return
        if found is None:
            _copy_to(self._db, self.path)
            logger.error(
                "session store %s was deleted while in use: rewrote it from the open file "
                "(no session lost)",
                self.path,
            )
        else:
            kept = _free_name(self.path, "orphan")
            _copy_to(self._db, kept)
            logger.error(
                "session store %s was replaced while in use: serving the new file; the "
                "sessions the old one held are kept in %s",
                self.path,
                kept.name,
            )
        db, inode = self._open()  # before the old file is let go: a failure keeps it in use
        self._db.close()
        self._db, self._inode = db, inode

    @contextlib.contextmanager
    def _use(self, what: str, *, write: bool = False) -> Iterator[sqlite3.Connection]:
        """The connection under the lock; a fault of the disk or the file is a StorageError."""
        with self._lock:
            try:
                if write:
                    self._reattach()
                yield self._db
            except sqlite3.DatabaseError as e:
                if not _storage_fault(e):
                    raise
                raise StorageError(f"session store {what} failed: {e}") from e
            except OSError as e:
                raise StorageError(f"session store {what} failed: {e.strerror or e}") from e

    # -- the store -----------------------------------------------------------------------------

    def load(self, session_id: str) -> SessionState | None:
        with self._use("read") as db:
            row = db.execute(
                "SELECT state, closed FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
        if not row:
            return None
        state = SessionState.from_json(row[0])
        # The column is the truth: the sweep closes sessions without rewriting their documents.
        state.closed = bool(row[1])
        return state

    def save(
        self,
        state: SessionState,
        response: StoredResponse | None = None,
        *,
        prune_before: int | None = None,
    ) -> None:
        text = state.to_json()  # serialised before the lock: other sessions' writes go on
        body = jsonio.dumps(response.document()).decode() if response is not None else None
        with self._use("write", write=True) as db:
            db.execute("BEGIN")
            try:
                # An upsert rewrites the row in place; REPLACE deletes it and inserts it anew,
                # touching the key index and the free list twice (about 0.1 ms more CPU per
                # commit of a 16 KB document). The row ends up the same either way.
                db.execute(
                    "INSERT INTO sessions (id, state, last_seen, closed) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (id) DO UPDATE SET state = excluded.state,"
                    " last_seen = excluded.last_seen, closed = excluded.closed",
                    (state.session_id, text, state.last_seen, int(state.closed)),
                )
                if prune_before is not None:
                    db.execute(
                        "DELETE FROM responses WHERE session_id = ? AND step_idx < ?",
                        (state.session_id, prune_before),
                    )
                if response is not None:
                    db.execute(
                        "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?)",
                        (
                            state.session_id,
                            response.kind,
                            response.step_idx,
                            response.key,
                            body,
                        ),
                    )
                db.execute("COMMIT")
            except BaseException:
                _rollback(db)
                raise

    def response(
        self, session_id: str, kind: str, step_idx: int, key: str
    ) -> StoredResponse | None:
        with self._use("read") as db:
            row = db.execute(
                "SELECT body FROM responses"
                " WHERE session_id = ? AND kind = ? AND step_idx = ? AND key = ?",
                (session_id, kind, step_idx, key),
            ).fetchone()
        if not row:
            return None
        return StoredResponse.of_document(kind, step_idx, key, _document(row[0]))

    def expire(
        self, idle_before: float, busy: frozenset[str] = frozenset(), limit: int | None = None
    ) -> list[str]:
        # A write check even when nothing expires: the sweep notices a deleted file on an idle
        # gateway too. Only the ``closed`` column changes (``load`` reads it): no document is
        # parsed or rewritten, so an unreadable one cannot stop the sweep either.
        fetch = -1 if limit is None else limit + len(busy)
        with self._use("expiry", write=True) as db, _transaction(db):
            rows = db.execute(
                "SELECT id FROM sessions WHERE closed = 0 AND last_seen < ?"
                " ORDER BY last_seen LIMIT ?",
                (idle_before, fetch),
            ).fetchall()
            gone = [sid for (sid,) in rows if sid not in busy][:limit]
            for chunk in _chunks(gone):
                marks = ",".join("?" * len(chunk))
                db.execute(f"UPDATE sessions SET closed = 1 WHERE id IN ({marks})", chunk)
                db.execute(f"DELETE FROM responses WHERE session_id IN ({marks})", chunk)
        return gone

    def purge_closed(self, before: float, keep: int, limit: int) -> list[str]:
        with self._use("retention", write=True) as db, _transaction(db):
            (closed,) = db.execute("SELECT COUNT(*) FROM sessions WHERE closed = 1").fetchone()
            excess = closed - keep
            rows = db.execute(
                "SELECT id, last_seen FROM sessions WHERE closed = 1 ORDER BY last_seen LIMIT ?",
                (limit,),
            ).fetchall()
            # Oldest first, so the sessions to remove are a prefix of ``rows``.
            gone = [sid for i, (sid, seen) in enumerate(rows) if i < excess or seen < before]
            for chunk in _chunks(gone):
                marks = ",".join("?" * len(chunk))
                db.execute(f"DELETE FROM sessions WHERE id IN ({marks})", chunk)
                db.execute(f"DELETE FROM responses WHERE session_id IN ({marks})", chunk)
        return gone

    def open_among(self, ids: list[str]) -> set[str]:
        found: set[str] = set()
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            with self._use("read") as db:
                rows = db.execute(
                    f"SELECT id FROM sessions WHERE closed = 0 AND id IN ({marks})", chunk
                ).fetchall()
            found.update(sid for (sid,) in rows)
        return found

    def forget(self, session_id: str) -> None:
        with self._use("write", write=True) as db:
            db.execute("DELETE FROM responses WHERE session_id = ?", (session_id,))

    def count_open(self) -> int:
        with self._use("read") as db:
            return int(db.execute("SELECT COUNT(*) FROM sessions WHERE closed = 0").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


_BUSY_TIMEOUT_S = 5.0
"""How long a statement waits for another process's lock before failing with ``locked``."""


def _connect(path: Path) -> tuple[sqlite3.Connection, tuple[int, int] | None]:
    """A connection to a checked store, and the file it opened."""
    db = sqlite3.connect(
        str(path), check_same_thread=False, isolation_level=None, timeout=_BUSY_TIMEOUT_S
    )
    try:
        # TRUNCATE, not WAL: WAL memory-maps its index (the -shm file), and a write to that
        # mapping on a read-only or failing disk is SIGBUS, which kills the process. A rollback
        # journal does plain file I/O, so the same fault is an error on one request, and other
        # processes can still share the file. No mapping of the database file either (a file
        # truncated under a mapping is SIGBUS on read). NORMAL still syncs the journal and the
        # database at every commit, so a commit is on disk before its answer leaves: about
        # 0.9 ms a commit, where WAL took 0.08 ms.
        mode = db.execute("PRAGMA journal_mode=TRUNCATE").fetchone()[0]
        if mode != "truncate":
            raise sqlite3.OperationalError(f"journal mode stays {mode} (another process has it)")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA mmap_size=0")
        (check,) = db.execute("PRAGMA quick_check").fetchone()
        if check != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed ({check})")
        db.executescript(_SCHEMA)
    except BaseException:
        db.close()
        raise
    return db, _inode(path)


_MAGIC = b"SQLite format 3\x00"


def _bad_header(path: Path) -> str | None:
    """Why the file at ``path`` is no SQLite database by its first bytes; ``None`` when it may
    be one (or is absent or empty: SQLite starts an empty store there)."""
    try:
        with path.open("rb") as f:
            head = f.read(len(_MAGIC))
    except FileNotFoundError:
        return None
    if head and head != _MAGIC:
        return "its header is not an SQLite header"
    return None


def _corrupt(e: sqlite3.DatabaseError) -> bool:
    """Whether SQLite says the file is no database, or a damaged one."""
    name = getattr(e, "sqlite_errorname", None) or ""
    if name:
        return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))
    return type(e) is sqlite3.DatabaseError  # raised by ``_connect`` for a failed quick_check


def _storage_fault(e: sqlite3.DatabaseError) -> bool:
    """A fault of the disk or the file (read-only, I/O, full, locked, corrupt), not of the code
    (an integrity or programming error stays a bug)."""
    return type(e) in (sqlite3.OperationalError, sqlite3.DatabaseError)


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction; ``IMMEDIATE`` takes the write lock before the first read, so
    another process's sweep cannot pick the same sessions in between."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        _rollback(db)
        raise


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for i in range(0, len(ids), _PARAMS):
        yield ids[i : i + _PARAMS]


def _rollback(db: sqlite3.Connection) -> None:
    """Undo a failed transaction; SQLite may have undone it already (an I/O error does)."""
    if db.in_transaction:
        # The caller re-raises the original error; a failed ROLLBACK must not replace it.
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


def _inode(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of the file at ``path``; ``None`` when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


_COMPANIONS = ("", "-journal", "-wal", "-shm")
"""The store and the files SQLite keeps beside it (an earlier build ran in WAL mode)."""


def _free_name(path: Path, label: str) -> Path:
    """``<name>.<label>-<UTC time>`` beside ``path``, not yet taken by any companion file."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        name = f"{path.name}.{label}-{stamp}" + (f".{n}" if n else "")
        if not any(path.with_name(name + s).exists() for s in _COMPANIONS):
            return path.with_name(name)
    raise OSError(f"no free name for {path.name}.{label}-{stamp}")


def _quarantine(path: Path) -> Path:
    """Move a corrupt store and its companions aside (kept for inspection); the new name."""
    target = _free_name(path, "corrupt")
    for suffix in _COMPANIONS:
        src = path.with_name(path.name + suffix)
        if src.exists():
            # The companions keep their suffix, so SQLite opens the moved files as one store.
            src.rename(target.with_name(target.name + suffix))
    return target


def _copy_to(db: sqlite3.Connection, path: Path) -> None:
    """Write everything ``db`` holds to a new file at ``path``, atomically."""
    with atomic_path(path) as tmp:
        try:
            out = sqlite3.connect(str(tmp))
            try:
                db.backup(out)
            finally:
                out.close()
        finally:
            tmp.with_name(tmp.name + "-journal").unlink(missing_ok=True)


def open_store(kind: str, state_dir: str | Path) -> SessionStore:
    """The store a config names (``sqlite`` under ``state_dir``, or ``memory``)."""
    if kind == "memory":
        return MemoryStore()
    return SQLiteStore(Path(state_dir) / "sessions.sqlite")


def now() -> float:
    """Wall-clock seconds (one place, so tests can reason about TTLs)."""
    return time.time()
