"""Storage faults never kill the gateway nor lose what it committed.

Provoked: a state folder made read-only under a running gateway (``chattr +i``, and injected
``readonly`` / ``disk I/O`` / ``disk full`` errors where chattr is refused), a full disk (a tiny
tmpfs), random bytes over the store's header after a kill, the store deleted or replaced while
serving, and a trace folder that takes no writes. Every answer must be a documented status,
nothing committed may be lost, and the trace must hold every committed step or the answer must
say it does not.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from serve.errors import StorageError
from serve.server import free_port
from serve.sessions import SessionState, SQLiteStore, StoredResponse
from serve.traces import TraceWriter
from tests.fakes.gateway import (
    CLICK,
    GOOD,
    SUMMARY,
    b64,
    gateway_client,
    observe,
    screen,
    session_body,
)
from tests.fakes.openai_server import Reply, ScriptedServer, request_text

ROOT = Path(__file__).resolve().parents[3]


def _start(c) -> str:
    r = c.post("/v1/sessions", json=session_body())
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def _critique(c, sid: str, k: int):
    return c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": k, "action": CLICK})


def _state(sid: str, task: str = "Open the settings") -> SessionState:
    return SessionState(sid, task, "ubuntu", 320, 200)


def _metric(c, line: str) -> bool:
    return line in c.get("/metrics").text


def _unavailable(r) -> None:
    """A documented 503: the code, a Retry-After, one line naming no server path."""
    assert r.status_code == 503, r.text
    error = r.json()["error"]
    assert error["code"] == "storage_unavailable"
    assert r.headers["Retry-After"] == "1"
    assert "\n" not in error["message"] and not re.search(r"/\w+/", error["message"])


def _chattr(flag: str, *paths: Path) -> None:
    """``chattr flag -R paths``; the test is skipped where the attribute cannot be set."""
    try:
        run = subprocess.run(
            ["chattr", "-R", flag, *map(str, paths)], capture_output=True, text=True, timeout=30
        )
    except FileNotFoundError:
        pytest.skip("chattr is not installed")
    if run.returncode != 0:
        pytest.skip(f"chattr {flag} refused here: {run.stderr.strip()[:200]}")


@contextlib.contextmanager
def _immutable(*paths: Path) -> Iterator[None]:
    _chattr("+i", *paths)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-R", "-i", *map(str, paths)], check=False, timeout=30)


@contextlib.contextmanager
def _tiny_disk(where: Path, size: str = "64k") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``where`` (skipped where mounting is not allowed)."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        run = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except FileNotFoundError:
        pytest.skip("mount is not installed")
    if run.returncode != 0:
        pytest.skip(f"a tmpfs cannot be mounted here: {run.stderr.strip()[:200]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, timeout=30)


def _fill(disk: Path) -> Path:
    """Take every free byte of ``disk``; the file holding them (delete it to free them)."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 512)
    return filler


# ---------------------------------------------------------------------------------------------
# A real `python -m serve` process (the defects killed it or stopped it starting)


def _answer(body: dict) -> Reply:
    return Reply(content=GOOD if "Current Proposed Step" in request_text(body) else SUMMARY)


@contextlib.contextmanager
def _gateway_process(tmp_path: Path, state: Path) -> Iterator[tuple[httpx.Client, Any, Path]]:
    """``python -m serve`` on ``state`` in front of a scripted OpenAI backend."""
    port = free_port()
    log = tmp_path / "gateway.log"
    env = {k: v for k, v in os.environ.items() if k != "HIVIG_SERVE_TOKEN"}
    args = [
        sys.executable, "-m", "serve", "--config", "configs/serve/vllm.yaml", "host=127.0.0.1",
        f"port={port}", "warmup=false", f"sessions.state_dir={state}", "frame.min_pixels=1024",
        "frame.max_pixels=65536",
    ]  # fmt: skip
    with ScriptedServer(respond=_answer) as backend, log.open("w") as out:
        args.append(f"backend.base_url={backend.base_url}")
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                _wait_ready(http, proc, log)
                yield http, proc, log
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)


def _wait_ready(http: httpx.Client, proc: Any, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the gateway exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.TransportError):
            if http.get("/healthz").status_code == 200:
                return
        time.sleep(0.1)
    pytest.fail(f"the gateway did not start:\n{log.read_text()[-3000:]}")


def test_a_read_only_state_folder_answers_503_and_the_gateway_lives_on(tmp_path):
    """Was SIGBUS in the session load (WAL's memory-mapped index), the process dead (135)."""
    state = tmp_path / "state"
    with _gateway_process(tmp_path, state) as (http, proc, log):
        sid = _start(http)
        assert observe(http, sid, 0).status_code == 200
        ref = http.post("/v1/images", json={"image": b64(screen(seed=1))}).json()["image_ref"]
        with _immutable(state):
            try:
                _unavailable(observe(http, sid, 1, CLICK, image_ref=ref))
                _unavailable(_critique(http, sid, 0))
                _unavailable(http.post("/v1/sessions", json=session_body()))
                got = http.get(f"/v1/sessions/{sid}")  # reads still work
            except httpx.TransportError:
                pytest.fail(f"the gateway died (exit status {proc.wait(timeout=30)})")
            assert got.status_code == 200 and got.json()["step_idx"] == 0
            assert http.get("/healthz").status_code == 200 and proc.poll() is None
        # The refused step took no effect: the same request now commits it.
        r = observe(http, sid, 1, CLICK, image_ref=ref)
        assert r.status_code == 200, r.text
        assert _critique(http, sid, 1).status_code == 200
        assert http.get(f"/v1/sessions/{sid}").json()["step_idx"] == 1
        assert proc.poll() is None
    text = log.read_text()
    assert "Traceback" not in text
    assert "storage unavailable on /v1/sessions/" in text


class _FaultyDisk:
    """A store connection whose writes fail as a failing disk fails them; reads still work."""

    _WRITES = ("BEGIN", "INSERT", "UPDATE", "DELETE", "COMMIT")

    def __init__(self, db: Any, message: str) -> None:
        self.db = db
        self.message = message

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.split()[0].upper() in self._WRITES:
            raise sqlite3.OperationalError(self.message)
        return self.db.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db, name)


@pytest.mark.parametrize(
    "message",
    ["attempt to write a readonly database", "disk I/O error", "database or disk is full"],
)
def test_store_faults_answer_503_and_lose_nothing(tmp_path, message):
    """Was a 500 with the traceback of the OperationalError."""
    with gateway_client(tmp_path, raise_server_exceptions=False) as c:
        store = c.app.state.gateway.store
        sid = _start(c)
        assert observe(c, sid, 0).status_code == 200
        store._db = _FaultyDisk(store._db, message)
        _unavailable(observe(c, sid, 1, CLICK))
        _unavailable(_critique(c, sid, 0))
        _unavailable(c.post("/v1/sessions", json=session_body()))
        _unavailable(c.delete(f"/v1/sessions/{sid}"))
        assert c.get(f"/v1/sessions/{sid}").json()["step_idx"] == 0
        assert _metric(c, 'hivig_errors_total{code="storage_unavailable"} 4.0')
        assert not _metric(c, 'hivig_errors_total{code="internal"}')
        store._db = store._db.db  # the disk heals
        assert observe(c, sid, 1, CLICK).status_code == 200
    with gateway_client(tmp_path) as c:  # restarted: every committed step is there
        assert c.get(f"/v1/sessions/{sid}").json()["step_idx"] == 1
        assert observe(c, sid, 2, CLICK).status_code == 200


def test_a_full_disk_answers_503_and_the_step_commits_once_there_is_room(tmp_path):
    with _tiny_disk(tmp_path / "state", "4m") as disk, gateway_client(tmp_path) as c:
        sid = _start(c)
        first = observe(c, sid, 0).json()
        filler = _fill(disk)
        r = observe(c, sid, 1, CLICK, image_ref=first["image_ref"])
        _unavailable(r)
        assert c.get(f"/v1/sessions/{sid}").json()["step_idx"] == 0
        filler.unlink()
        assert observe(c, sid, 1, CLICK, image_ref=first["image_ref"]).status_code == 200
        assert c.get(f"/v1/sessions/{sid}").json()["step_idx"] == 1


def test_the_store_maps_no_shared_memory(tmp_path):
    """What made a read-only disk SIGBUS: WAL's ``-shm`` index is a shared memory mapping."""
    store = SQLiteStore(tmp_path / "sessions.sqlite")
    store.save(_state("s"), StoredResponse("observe", 0, "", {"ok": True}))
    assert store.load("s") is not None
    names = sorted(p.name for p in tmp_path.iterdir())
    assert not any(n.endswith(("-wal", "-shm")) for n in names), names
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "truncate"
    store.close()


def test_a_wal_store_of_an_earlier_build_opens_with_every_session(tmp_path):
    """An earlier build ran in WAL mode; killed, it left its last commits in the -wal file."""
    build = tmp_path / "build"
    build.mkdir()
    old = sqlite3.connect(str(build / "sessions.sqlite"), isolation_level=None)
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("PRAGMA wal_autocheckpoint=0")  # the session stays in the -wal file only
    old.execute(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY, state TEXT NOT NULL,"
        " last_seen REAL NOT NULL, closed INTEGER NOT NULL)"
    )
    old.execute("INSERT INTO sessions VALUES (?, ?, ?, 0)", ("s", _state("s").to_json(), 1.0))
    state = tmp_path / "state"
    state.mkdir()
    for name in ("sessions.sqlite", "sessions.sqlite-wal"):  # what a kill -9 leaves
        (state / name).write_bytes((build / name).read_bytes())
    old.close()
    store = SQLiteStore(state / "sessions.sqlite")
    assert store.load("s") is not None and store.count_open() == 1
    store.close()
    assert not (state / "sessions.sqlite-wal").exists()


# ---------------------------------------------------------------------------------------------
# A corrupt, unopenable, deleted or replaced store


def _corrupt_header(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[:100] = os.urandom(100)  # the 100-byte header, as a torn write after kill -9 leaves it
    path.write_bytes(bytes(data))
    return bytes(data)


def test_a_corrupt_store_is_moved_aside_and_the_gateway_starts_empty(tmp_path):
    """Was a 20-line traceback at start-up and exit status 3."""
    state = tmp_path / "state"
    with gateway_client(tmp_path) as c:
        sid = _start(c)
        echo = observe(c, sid, 0).json()["echo"]
    bad = _corrupt_header(state / "sessions.sqlite")
    (state / "sessions.sqlite-wal").write_bytes(b"left by an earlier build")
    (state / "sessions.sqlite-shm").write_bytes(b"\0" * 64)
    with _gateway_process(tmp_path, state) as (http, proc, log):
        assert observe(http, sid, 1, CLICK).json()["error"]["code"] == "unknown_session"
        r = http.post("/v1/sessions", json={**session_body(), "session_id": sid, "echo": echo})
        assert r.status_code == 201, r.text
        assert observe(http, sid, 1, CLICK).status_code == 200
    lines = log.read_text().splitlines()
    warned = [line for line in lines if "corrupt" in line]
    assert len(warned) == 1 and " WARNING " in warned[0], lines
    assert "Traceback" not in log.read_text()
    (aside,) = state.glob("sessions.sqlite.corrupt-*[0-9Z]")
    assert aside.name in warned[0] and aside.read_bytes() == bad
    assert Path(f"{aside}-wal").read_bytes() == b"left by an earlier build"
    assert Path(f"{aside}-shm").exists()
    assert not (state / "sessions.sqlite-wal").exists()


def test_a_store_damaged_inside_is_moved_aside_too(tmp_path, caplog):
    path = tmp_path / "sessions.sqlite"
    store = SQLiteStore(path)
    for i in range(200):
        store.save(_state(f"s{i}", task="x" * 2000))
    store.close()
    data = bytearray(path.read_bytes())
    data[4096 * 3 : 4096 * 3 + 512] = os.urandom(512)  # a page deep inside; the header is fine
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="serve.sessions"):
        store = SQLiteStore(path)
    assert store.count_open() == 0
    assert len(list(tmp_path.glob("sessions.sqlite.corrupt-*"))) >= 1
    assert "is corrupt" in caplog.text
    store.close()


def test_a_store_that_cannot_be_opened_is_one_line_and_exit_2(tmp_path):
    state = tmp_path / "state"
    (state / "sessions.sqlite").mkdir(parents=True)  # in the way; not a database to move aside
    run = subprocess.run(
        [sys.executable, "-m", "serve", "--config", "configs/serve/vllm.yaml", "warmup=false",
         "host=127.0.0.1", f"sessions.state_dir={state}", f"port={free_port()}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-2000:]
    assert run.stderr.count("\n") == 1 and "cannot be opened" in run.stderr, run.stderr


def test_a_store_deleted_while_serving_is_rewritten_and_survives_a_restart(tmp_path, caplog):
    """Was unnoticed: commits went on into the unlinked file, and a restart had no session."""
    db = tmp_path / "state" / "sessions.sqlite"
    with gateway_client(tmp_path) as c:
        sid = _start(c)
        assert observe(c, sid, 0).status_code == 200
        db.unlink()
        with caplog.at_level(logging.ERROR, logger="serve.sessions"):
            assert observe(c, sid, 1, CLICK).status_code == 200
        assert db.is_file()
        assert "was deleted while in use" in caplog.text
    with gateway_client(tmp_path) as c:
        assert c.get(f"/v1/sessions/{sid}").json()["step_idx"] == 1
        assert observe(c, sid, 2, CLICK).status_code == 200


def test_the_sweep_notices_a_deleted_store_on_an_idle_gateway(tmp_path):
    db = tmp_path / "state" / "sessions.sqlite"
    with gateway_client(tmp_path) as c:
        sid = _start(c)
        db.unlink()
        c.app.state.gateway.expire()
        assert db.is_file()
    store = SQLiteStore(db)
    assert store.load(sid) is not None
    store.close()


def test_a_store_replaced_while_serving_keeps_the_old_sessions_aside(tmp_path, caplog):
    path = tmp_path / "sessions.sqlite"
    store = SQLiteStore(path)
    store.save(_state("old"))
    other = SQLiteStore(tmp_path / "other.sqlite")
    other.save(_state("restored"))
    other.close()
    os.replace(tmp_path / "other.sqlite", path)
    with caplog.at_level(logging.ERROR, logger="serve.sessions"):
        store.save(_state("new"))
    assert store.load("restored") is not None and store.load("new") is not None
    (kept,) = tmp_path.glob("sessions.sqlite.orphan-*[0-9Z]")
    assert kept.name in caplog.text
    orphan = SQLiteStore(kept)
    assert orphan.load("old") is not None
    orphan.close()
    store.close()


def test_store_errors_name_the_operation_not_a_path(tmp_path):
    store = SQLiteStore(tmp_path / "sessions.sqlite")
    store._db = _FaultyDisk(store._db, "disk I/O error")
    with pytest.raises(StorageError, match=r"^session store write failed: disk I/O error$"):
        store.save(_state("s"))
    store._db = store._db.db
    store.save(_state("s"))  # the connection is usable after the failed transaction
    assert store.count_open() == 1
    store.close()


# ---------------------------------------------------------------------------------------------
# A trace folder that takes no writes


def _events(state: Path, sid: str) -> list[tuple[str, int | None]]:
    lines = (state / "traces" / f"{sid}.jsonl").read_text().splitlines()
    return [(e["event"], e.get("step_idx")) for e in map(json.loads, lines)]


@contextlib.contextmanager
def _trace_fault(kind: str, traces: Path) -> Iterator[None]:
    """``traces/`` refuses writes inside the block (a file in its place, immutable, or full)."""
    if kind == "file_in_the_way":
        aside = traces.with_name("traces.aside")
        traces.rename(aside)
        traces.write_text("not a folder")
        try:
            yield
        finally:
            traces.unlink()
            aside.rename(traces)
    elif kind == "immutable":
        with _immutable(traces):
            yield
    else:
        filler = _fill(traces)
        try:
            yield
        finally:
            filler.unlink()


@pytest.mark.parametrize("kind", ["file_in_the_way", "immutable", "full"])
def test_a_trace_folder_that_takes_no_writes_never_fails_a_committed_step(tmp_path, kind):
    """Was a 500 after the step was committed, and the trace lacked its event for good."""
    state = tmp_path / "state"
    with contextlib.ExitStack() as stack:
        if kind == "full":
            stack.enter_context(_tiny_disk(state / "traces", "64k"))
        c = stack.enter_context(gateway_client(tmp_path, raise_server_exceptions=False))
        sid = _start(c)
        assert "trace" not in observe(c, sid, 0).json()
        with _trace_fault(kind, state / "traces"):
            r = observe(c, sid, 1, CLICK)
            assert r.status_code == 200 and r.json()["trace"] == "pending", r.text
            r = _critique(c, sid, 1)
            assert r.status_code == 200 and r.json()["trace"] == "pending", r.text
            assert observe(c, sid, 1, CLICK).json()["trace"] == "pending"  # a retry says so too
            assert c.get(f"/v1/sessions/{sid}").json()["step_idx"] == 1  # committed
            assert _metric(c, 'hivig_trace_errors_total{outcome="deferred"} 2.0')
            assert _metric(c, "hivig_trace_pending 2.0")
        r = observe(c, sid, 2, CLICK)
        assert r.status_code == 200 and "trace" not in r.json()
        assert _metric(c, "hivig_trace_pending 0.0")
        assert _events(state, sid) == [
            ("session", None),
            ("observe", 0),
            ("observe", 1),
            ("critique", 1),
            ("observe", 2),
        ]


def test_waiting_trace_events_are_written_by_the_sweep_and_read_by_diagnose(tmp_path):
    from serve.diagnose.loaders import load_trace

    state = tmp_path / "state"
    with gateway_client(tmp_path) as c:
        sid = _start(c)
        observe(c, sid, 0)
        with _trace_fault("file_in_the_way", state / "traces"):
            assert observe(c, sid, 1, CLICK).json()["trace"] == "pending"
        c.app.state.gateway.expire()
        assert _events(state, sid)[-1] == ("observe", 1)
        assert c.get(f"/v1/sessions/{sid}").status_code == 200
    run = load_trace(state / "traces" / f"{sid}.jsonl")
    assert len(run.steps) == 1


def test_a_full_trace_backlog_drops_the_oldest_events_and_says_so(tmp_path):
    traces = tmp_path / "traces"
    writer = TraceWriter(traces, backlog_bytes=1000)  # about three of these events
    traces.rmdir()
    traces.write_text("in the way")
    for k in range(6):
        assert not writer.write("a" if k < 3 else "b", "observe", step_idx=k, pad="x" * 200)
    assert writer.status("a") == "incomplete" and writer.status("b") == "pending"
    traces.unlink()
    assert writer.flush() == 0
    assert writer.status("b") is None and writer.status("a") == "incomplete"
    kept = [json.loads(line)["step_idx"] for line in (traces / "b.jsonl").open()]
    assert kept == [3, 4, 5]  # the newest survive, in order


def test_a_trace_write_cut_short_by_a_full_disk_leaves_no_half_line(tmp_path):
    with _tiny_disk(tmp_path / "traces", "64k") as disk:
        writer = TraceWriter(disk)
        assert writer.write("s", "session", task="t")
        filler = _fill(disk)
        assert not writer.write("s", "observe", step_idx=0, prompt="p" * 20_000)
        assert [json.loads(line)["event"] for line in (disk / "s.jsonl").open()] == ["session"]
        filler.unlink()
        assert writer.flush() == 0
        events = [json.loads(line)["event"] for line in (disk / "s.jsonl").open()]
    assert events == ["session", "observe"]
