"""The gateway against the second attack: a sweep of thousands of expired sessions while it
serves, a 500 on a kept-alive connection, a trailing slash with a forged Host, a client gone
mid-body, and a state folder that must not only grow."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import socket
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from hivig.config import ConfigError
from hivig.locks import hold_flock
from serve.app import create_app
from serve.sessions import _SCHEMA, SessionState
from tests.fakes.gateway import (
    CLICK,
    LiveServer,
    ScriptedBackend,
    gateway_client,
    observe,
    serve_config,
    start_session,
)


def _code(r: httpx.Response) -> str:
    return r.json()["error"]["code"]


# ---------------------------------------------------------------------------------------------
# The session-expiry sweep


def _idle_sessions(state: Path, n: int, last_seen: float, steps: int = 10) -> list[str]:
    """``n`` open sessions of ``steps`` executed steps each, last seen at ``last_seen``, written
    as the store writes them (another process's, say)."""
    state.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(state / "sessions.sqlite", isolation_level=None)
    db.executescript(_SCHEMA)
    step = {
        "intent": "Click the settings button",
        "action_text": '<tool_call>\n{"name": "computer_use", "arguments": {}}\n</tool_call>',
        "step_text": "Action: click(80, 60)\nIntent: open the settings",
        "image_ref": "sha256:" + "ab" * 32,
        "last_action_result": "The click opened the settings page as intended.",
        "progress_summary": "The settings page is open; the display panel comes next. " * 3,
        "actions": [{"type": "left_click", "x": 80, "y": 60}],
    }
    ids = [f"idle{i:05d}" for i in range(n)]
    rows = []
    for sid in ids:
        s = SessionState(sid, "Open the settings", "ubuntu", 320, 200, last_seen=last_seen)
        s.steps = [{"step_idx": k, **step} for k in range(steps)]
        s.step_idx = steps
        rows.append((sid, s.to_json(), last_seen, 0))
    db.execute("BEGIN")
    db.executemany("INSERT INTO sessions VALUES (?, ?, ?, ?)", rows)
    db.execute("COMMIT")
    db.close()
    return ids


def _open_count(url: str) -> float | None:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith("hivig_sessions_open "):
            return float(line.split()[1])
    return None


def test_a_sweep_of_3000_expired_sessions_keeps_the_gateway_answering(tmp_path):
    state = tmp_path / "state"
    _idle_sessions(state, 3000, last_seen=time.time() - 3600)
    cfg = serve_config(state, "sessions.ttl_s=600", "retention.sweep_every_s=1.0")
    waits: list[float] = []
    app = create_app(cfg, ScriptedBackend())
    with LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        live = c.post("/v1/sessions", json={**_body(), "session_id": "live"}).json()
        assert live["created"] is True
        deadline = time.monotonic() + 120
        # /healthz every 0.1 s until the sweep has closed them all, and a request that reads
        # the store (which the sweep writes) each time as well.
        while time.monotonic() < deadline:
            for path in ("/healthz", "/v1/sessions/live"):
                start = time.monotonic()
                assert c.get(path).status_code == 200
                waits.append(time.monotonic() - start)
            if _open_count(srv.url) == 1.0:
                break
            time.sleep(0.1)
    assert _open_count_in(state) == 1
    # Before: the sweep ran on the event loop, 3,000 sessions one commit each, and nothing
    # was answered meanwhile (several seconds). Now a request waits one slice at most.
    print(f"slowest of {len(waits)} answers during the sweep: {max(waits):.3f} s")
    assert max(waits) < 0.5, f"slowest answer during the sweep: {max(waits):.2f} s"
    closes = [p for p in (state / "traces").glob("idle*.jsonl")]
    assert len(closes) == 3000
    event = json.loads(closes[0].read_text().splitlines()[-1])
    assert (event["event"], event["reason"]) == ("close", "ttl")


def _open_count_in(state: Path) -> int:
    db = sqlite3.connect(state / "sessions.sqlite")
    try:
        return db.execute("SELECT COUNT(*) FROM sessions WHERE closed = 0").fetchone()[0]
    finally:
        db.close()


def _body() -> dict:
    return {"task": "Open the settings", "platform": "ubuntu", "screen": {"w": 320, "h": 200}}


def test_the_sweep_closes_every_slice_and_skips_a_session_being_served(tmp_path):
    ids = _idle_sessions(tmp_path / "state", 600, last_seen=time.time() - 3600, steps=1)
    with gateway_client(tmp_path, None, "sessions.ttl_s=600") as c:
        gateway = c.app.state.gateway
        served = gateway.sessions.locks.setdefault(ids[0], asyncio.Lock())
        asyncio.run(served.acquire())  # a request for it is in flight
        assert sorted(gateway.expire()) == ids[1:]  # 600 sessions: three slices
        served.release()
        assert c.get(f"/v1/sessions/{ids[1]}").json()["closed"] is True
        assert _code(observe(c, ids[1], 2, CLICK)) == "unknown_session"
        assert gateway.expire() == [ids[0]]


# ---------------------------------------------------------------------------------------------
# A 500 on a kept-alive connection


def _app_with_a_bug(tmp_path: Path):
    app = create_app(serve_config(tmp_path / "state"), ScriptedBackend())

    async def bug() -> dict:  # a route with a bug, as any route may have one
        raise RuntimeError("a bug")

    app.add_api_route("/v1/bug", bug)
    return app


def test_a_500_leaves_the_kept_alive_connection_usable(tmp_path, caplog):
    with LiveServer(_app_with_a_bug(tmp_path)) as srv:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            r = c.get("/v1/bug")
            assert (r.status_code, _code(r)) == (500, "internal")
            first = r.extensions["network_stream"].get_extra_info("client_addr")
            r = c.get("/healthz")
            assert r.status_code == 200
            assert r.extensions["network_stream"].get_extra_info("client_addr") == first
        # The same on a bare socket: the second request on the connection is answered.
        host, port = srv.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"GET /v1/bug HTTP/1.1\r\nHost: gw\r\n\r\n")
            assert _response(s).startswith(b"HTTP/1.1 500")
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
            assert _response(s).startswith(b"HTTP/1.1 200")
        metrics = httpx.get(f"{srv.url}/metrics").text
    assert 'hivig_errors_total{code="internal"} 2.0' in metrics
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 2 and all("unhandled error on /v1/bug" in r.message for r in logged)


def _response(s: socket.socket) -> bytes:
    """One whole response (head and ``Content-Length`` body); what came before a close."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


# ---------------------------------------------------------------------------------------------
# Trailing slashes and a forged Host


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/v1/info/"), ("POST", "/v1/sessions/"), ("GET", "/healthz/")]
)
def test_a_trailing_slash_is_a_404_never_a_redirect_to_the_host_header(tmp_path, method, path):
    with gateway_client(tmp_path) as c:
        r = c.request(method, path, headers={"Host": "evil.example"}, follow_redirects=False)
        assert (r.status_code, _code(r)) == (404, "not_found")
        assert "location" not in r.headers
        assert c.get("/v1/info").status_code == 200


# ---------------------------------------------------------------------------------------------
# A client gone mid-body


def test_a_client_gone_mid_body_is_no_internal_error(tmp_path, caplog):
    cfg = serve_config(tmp_path / "state")
    with LiveServer(create_app(cfg, ScriptedBackend())) as srv:
        host, port = srv.url.removeprefix("http://").split(":")
        for _ in range(3):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(
                    b"POST /v1/sessions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json"
                    b"\r\nContent-Length: 1000\r\n\r\n" + b'{"task": "' + b"x" * 100
                )
                time.sleep(0.2)  # the body has begun: the route is reading it
        time.sleep(0.5)
        metrics = httpx.get(f"{srv.url}/metrics").text
        assert httpx.get(f"{srv.url}/healthz").status_code == 200
    assert 'code="internal"' not in metrics
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# ---------------------------------------------------------------------------------------------
# Retention


def _du(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_closed_sessions_are_removed_past_their_age_and_past_the_cap(tmp_path):
    state = tmp_path / "state"
    overrides = ("retention.closed_max=3", "retention.closed_keep_s=3600")
    with gateway_client(tmp_path, None, *overrides) as c:
        gateway = c.app.state.gateway
        sids = []
        for _ in range(8):
            sid = start_session(c)
            observe(c, sid, 0)
            assert c.delete(f"/v1/sessions/{sid}").status_code == 200
            sids.append(sid)
            time.sleep(0.01)  # distinct last_seen: the oldest go first
        kept_open = start_session(c)
        assert len(list((state / "locks").iterdir())) == 8
        gateway.expire()
        # The three most recently seen closed sessions stay; the open one is untouched.
        assert [c.get(f"/v1/sessions/{s}").status_code for s in sids] == [404] * 5 + [200] * 3
        assert c.get(f"/v1/sessions/{kept_open}").json()["closed"] is False
        # Their lock files went with them; traces stay (retention.remove_traces is off).
        assert sorted(p.stem for p in (state / "locks").iterdir()) == []
        assert all(gateway.traces.path(s).is_file() for s in sids)
        # Past closed_keep_s every closed session goes.
        gateway.cfg.retention.closed_keep_s = 1e-3
        time.sleep(0.01)
        gateway.expire()
        assert [c.get(f"/v1/sessions/{s}").status_code for s in sids[-3:]] == [404] * 3
        assert c.get(f"/v1/sessions/{kept_open}").status_code == 200
        # A removed session is re-created from its echo, as any lost one.
        assert c.post("/v1/sessions", json={**_body(), "session_id": sids[0]}).status_code == 201


def test_the_state_folder_stops_growing_with_closed_sessions(tmp_path):
    state = tmp_path / "state"
    overrides = ("retention.closed_max=5", "retention.remove_traces=true")
    sizes = []
    with gateway_client(tmp_path, None, *overrides) as c:
        for _ in range(4):
            for _ in range(10):
                sid = start_session(c)
                for k in range(6):
                    observe(c, sid, k, CLICK if k else None)
                c.delete(f"/v1/sessions/{sid}")
            c.app.state.gateway.expire()
            sizes.append(_du(state / "traces") + _du(state / "locks"))
            assert len(list((state / "traces").iterdir())) == 5
    # The store file keeps its freed pages for the next sessions; the rest is bounded.
    assert sizes[-1] <= sizes[0] * 1.1


def test_a_lock_file_in_use_is_kept_until_released(tmp_path):
    state = tmp_path / "state"
    with gateway_client(tmp_path) as c:
        sid = start_session(c)
        observe(c, sid, 0)
        c.delete(f"/v1/sessions/{sid}")
        path = state / "locks" / f"{sid}.lock"
        fd = os.open(path, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)  # another worker serving a request on it
        try:
            c.app.state.gateway.expire()
            assert path.exists()
        finally:
            os.close(fd)
        c.app.state.gateway.expire()
        assert not path.exists()


def test_a_waiter_on_a_removed_lock_file_locks_the_new_one(tmp_path):
    path = tmp_path / "s.lock"

    async def scenario() -> tuple[tuple[int, int], tuple[int, int]]:
        held = os.open(path, os.O_RDWR | os.O_CREAT)
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = asyncio.create_task(hold_flock(path))
        await asyncio.sleep(0.05)  # it has opened the file and waits for the lock
        path.unlink()  # the sweep removes it, holding the lock
        os.close(held)
        fd = await asyncio.wait_for(waiter, 5)
        try:
            st, locked = os.stat(path), os.fstat(fd)
            return (st.st_dev, st.st_ino), (locked.st_dev, locked.st_ino)
        finally:
            os.close(fd)

    on_disk, locked = asyncio.run(scenario())
    assert on_disk == locked  # the lock held is the file every other process finds


def test_finished_diagnosis_jobs_are_removed_after_their_ttl(tmp_path):
    state = tmp_path / "state"
    with gateway_client(tmp_path, None, "retention.jobs_keep_s=3600") as c:
        sid = start_session(c)
        observe(c, sid, 0)
        job_id = c.post("/v1/diagnose", json={"session_id": sid}).json()["job_id"]
        for _ in range(200):
            if c.get(f"/v1/jobs/{job_id}").json()["status"] != "pending":
                break
            time.sleep(0.05)
        folder = state / "diagnoses" / job_id
        dead = state / "diagnoses" / ("d" * 32)  # a job whose process died mid-way
        dead.mkdir(parents=True)
        (dead / "job.json").write_text(json.dumps({"status": "pending"}))
        gateway = c.app.state.gateway
        gateway.expire()
        assert folder.is_dir() and dead.is_dir()
        old = time.time() - 7200
        os.utime(dead / "job.json", (old, old))
        record = json.loads((folder / "job.json").read_text())
        (folder / "job.json").write_text(json.dumps({**record, "finished": old}))
        gateway.jobs.clear()  # another process's job, known from its file only
        gateway.expire()
        assert not folder.exists() and not dead.exists()
        assert c.get(f"/v1/jobs/{job_id}").status_code == 404


@pytest.mark.parametrize(
    "override",
    ["retention.sweep_every_s=0", "retention.closed_keep_s=-1", "retention.closed_max=-1"],
)
def test_retention_values_are_checked(tmp_path, override):
    with pytest.raises(ConfigError, match="retention"):
        serve_config(tmp_path, override)
