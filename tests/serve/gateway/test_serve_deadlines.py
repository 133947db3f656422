"""Timeouts between a runner's client and a real gateway.

The client waits the gateway's deadline plus a grace, so a stalled backend reaches the runner as
the gateway's degraded answer (and the client's breaker, which is for a dead gateway, stays
closed). The server closes a connection whose request head does not arrive in time (slowloris).
Deadlines here are fractions of a second; every wait is bounded.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httpx
import pytest

from hivig.config import ConfigError, load_config
from serve.app import create_app
from serve.client import ClientConfig, CriticClient
from serve.config import CriticConfig, ServeConfig
from tests.fakes.gateway import CLICK, LiveServer, ScriptedBackend, screen, serve_config

# ---------------------------------------------------------------------------------------------
# Client deadlines


def _recording_gateway(info: dict[str, Any] | None, waits: dict[str, float]) -> httpx.Client:
    """A mock transport answering the API's shapes; ``waits`` gets each route's read timeout
    (what the client was prepared to wait for that call)."""
    versions = {"model_version": "m", "prompt_version": "p", "schema_version": "1"}

    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        waits[path.rsplit("/", 1)[-1]] = request.extensions["timeout"]["read"]
        if path == "/v1/sessions":
            return httpx.Response(201, json={"session_id": "s1", "echo": {}, **versions})
        if path == "/v1/info":
            if info is None:
                return httpx.Response(404, json={"error": {"code": "not_found"}})
            return httpx.Response(200, json={**info, **versions})
        if path.endswith("/observe"):
            history = {"progress_summary": "", "last_action_result": "", "version": 1}
            return httpx.Response(200, json={"step_idx": 0, "history": history, **versions})
        return httpx.Response(200, json={"verdict": "good", "confidence": 0.9, **versions})

    return httpx.MockTransport(handle)


def _episode_waits(info: dict[str, Any] | None, **cfg: Any) -> dict[str, float]:
    waits: dict[str, float] = {}
    config = ClientConfig(base_url="http://gw", **cfg)
    with CriticClient(config=config, transport=_recording_gateway(info, waits)) as client:
        s = client.start("t", "ubuntu", (100, 100))
        assert s.observe(0, b"png").ok and s.critique(0, CLICK).is_good
    return waits


def test_the_default_client_waits_past_the_default_gateway_deadline():
    """Both used to be 8 s: the client gave up when the gateway's degraded answer was due."""
    gateway = CriticConfig()
    waits = _episode_waits(None)  # a gateway that does not say its deadlines
    assert waits["observe"] >= gateway.observe_deadline_s + 1.0
    assert waits["critique"] >= gateway.critique_deadline_s + 1.0


def test_the_client_follows_the_deadlines_the_gateway_states():
    info = {"deadlines_s": {"observe": 30.0, "critique": 3.0}}
    waits = _episode_waits(info, deadline_grace_s=1.5)
    assert waits["observe"] == pytest.approx(31.5, abs=0.05)
    assert waits["critique"] == pytest.approx(4.5, abs=0.05)
    # An explicit deadline is the client's own choice; the grace still comes on top.
    waits = _episode_waits(info, critique_deadline_s=1.0, deadline_grace_s=0.5)
    assert waits["critique"] == pytest.approx(1.5, abs=0.05)


def test_a_stalled_backend_reaches_the_runner_as_the_gateways_degraded_answer(tmp_path):
    """Client and gateway configured with the same deadline (as the defaults were): the client
    now waits for the gateway's answer; no client-side fail-open, the breaker stays closed and
    the first call after the backend recovers is a real verdict."""
    gateway_deadline = 0.3
    cfg = serve_config(
        tmp_path / "state",
        f"critic.observe_deadline_s={gateway_deadline}",
        f"critic.critique_deadline_s={gateway_deadline}",
    )
    backend = ScriptedBackend(delay_s=1.0)  # slower than the gateway's deadline
    config = ClientConfig(
        observe_deadline_s=gateway_deadline,
        critique_deadline_s=gateway_deadline,
        breaker_failures=2,  # the three stalled calls below would open it if they counted
    )
    with LiveServer(create_app(cfg, backend)) as srv, CriticClient(srv.url, config) as client:
        s = client.start("Open the settings", "ubuntu", (320, 200))
        assert s.observe(0, screen(seed=0)).status == "ok"  # step 0 asks no model
        for k in range(2):
            if k:
                obs = s.observe(k, screen(seed=k), CLICK)
                assert (obs.status, obs.reason) == ("degraded", "timeout"), obs
            v = s.critique(k, CLICK)
            assert (v.verdict, v.status, v.reason) == ("abstain", "degraded", "timeout"), v
            assert v.source == "fallback"  # the gateway's answer, not the client's ("client")
        assert s.failures == {} and client.breaker.state == "closed"
        backend.delay_s = 0.0  # the backend recovers
        obs = s.observe(2, screen(seed=2), CLICK)
        assert obs.status == "ok" and obs.history.progress_summary
        v = s.critique(2, CLICK)
        assert v.is_good and v.source == "model" and v.status == "ok"
        assert client.breaker.state == "closed"


# ---------------------------------------------------------------------------------------------
# Request-head timeout

PARTIAL_HEAD = b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\n"


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.settimeout(5)  # a bound on every recv below: a test never hangs
    return sock


def _closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes ``sock`` (``recv`` gives b"" then)."""
    start = time.monotonic()
    assert sock.recv(1024) == b""
    return time.monotonic() - start


def _session_request(keep_alive: bool = True) -> list[bytes]:
    """A complete ``POST /v1/sessions`` in three pieces: request line, headers, body."""
    body = json.dumps({"task": "t", "platform": "ubuntu", "screen": {"w": 320, "h": 200}}).encode()
    headers = (
        b"Host: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n".encode()
        + (b"" if keep_alive else b"Connection: close\r\n")
        + b"\r\n"
    )
    return [b"POST /v1/sessions HTTP/1.1\r\n", headers, body]


def _status(sock: socket.socket) -> int:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(rest) < length:
        rest += sock.recv(4096)
    return int(head.split(b" ")[1])


@pytest.fixture
def head_server(tmp_path):
    cfg = serve_config(tmp_path / "state", "limits.header_timeout_s=0.6")
    with LiveServer(create_app(cfg, ScriptedBackend())) as srv:
        yield srv


def test_partial_request_heads_are_closed_after_the_header_timeout(head_server):
    stalled = [_connect(head_server.url) for _ in range(4)]
    silent = _connect(head_server.url)  # connects and never sends a byte
    try:
        for sock in stalled:
            sock.sendall(PARTIAL_HEAD)
        # Meanwhile the gateway serves everyone else.
        with httpx.Client(base_url=head_server.url, timeout=5) as c:
            assert c.get("/healthz").status_code == 200
        for sock in [*stalled, silent]:
            assert _closed_after(sock) < 2.0
    finally:
        for sock in [*stalled, silent]:
            sock.close()


def test_trickling_bytes_do_not_extend_the_header_timeout(head_server):
    sock = _connect(head_server.url)
    try:
        start = time.monotonic()
        sock.sendall(b"POST /v1/sessions HTTP/1.1\r\nX-Slow: ")
        sock.settimeout(0.1)
        for _ in range(30):  # a header byte every 0.1 s until the server hangs up
            try:
                closed = sock.recv(1) == b""
            except TimeoutError:
                sock.sendall(b"x")
                continue
            break
        assert closed
        assert 0.5 <= time.monotonic() - start < 1.5  # the 0.6 s from the first byte
    finally:
        sock.close()


def test_a_slow_but_complete_head_is_served_and_the_next_head_is_timed_again(head_server):
    sock = _connect(head_server.url)
    try:
        for piece in _session_request():
            sock.sendall(piece)
            time.sleep(0.2)  # 0.4 s for the head in all: within the 0.6 s
        assert _status(sock) == 201
        # Idle on the kept-alive connection for longer than the head timeout: that is
        # uvicorn's keep-alive timeout's business (5 s), the next request is still served.
        time.sleep(0.8)
        sock.sendall(b"".join(_session_request()))
        assert _status(sock) == 201
        # The next head starts its own timer.
        sock.sendall(PARTIAL_HEAD)
        assert 0.4 <= _closed_after(sock) < 2.0
    finally:
        sock.close()


async def _slow_app(scope, receive, send):
    """``/slow`` answers after 1 s; ``/early`` answers at once without reading its body."""
    import asyncio

    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(1.0)
    elif scope["path"] != "/early":
        while (await receive()).get("more_body"):
            pass
    status = 413 if scope["path"] == "/early" else 200
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": scope["path"].encode()})


def _answers(sock: socket.socket, seconds: float) -> tuple[bytes, bool]:
    """What the server sends within ``seconds``, and whether it closed the connection."""
    data, end = b"", time.monotonic() + seconds
    while time.monotonic() < end:
        sock.settimeout(max(0.01, end - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


@pytest.fixture
def slow_server():
    with LiveServer(_slow_app, header_timeout_s=0.5) as srv:
        yield srv


def test_pipelined_heads_behind_a_slow_answer_are_not_timed_out(slow_server):
    """A head that waits behind an answer taking longer than the head timeout is timed from
    that answer on, not from its own first byte (h11's behaviour, kept on httptools)."""
    sock = _connect(slow_server.url)
    try:
        sock.sendall(
            b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\nGET /a HTTP/1.1\r\nHost: a\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHo"
        )
        time.sleep(0.1)
        sock.sendall(b"st: a\r\n\r\n")
        data, closed = _answers(sock, 2.0)
        assert data.count(b"HTTP/1.1 200") == 3 and not closed
        # A pipelined head left unfinished is closed once the answers before it are out.
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\nGET /x HTTP/1.1\r\nHo")
        data, closed = _answers(sock, 3.0)
        assert data.count(b"HTTP/1.1 200") == 1 and closed
    finally:
        sock.close()


def test_a_body_still_arriving_after_an_early_answer_is_not_a_late_head(slow_server):
    sock = _connect(slow_server.url)
    try:
        sock.sendall(b"POST /early HTTP/1.1\r\nHost: a\r\nContent-Length: 20000\r\n\r\n")
        data, closed = _answers(sock, 0.3)
        assert b"HTTP/1.1 413" in data and not closed
        for _ in range(10):  # the rest of the body over 1 s, twice the head timeout
            sock.sendall(b"x" * 2000)
            time.sleep(0.1)
        sock.sendall(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
        data, closed = _answers(sock, 1.0)
        assert b"HTTP/1.1 200" in data
    finally:
        sock.close()


def test_the_header_timeout_is_validated():
    with pytest.raises(ConfigError, match="header_timeout_s"):
        load_config(ServeConfig, None, ["limits.header_timeout_s=0"])


def test_python_m_serve_runs_uvicorn_with_the_header_timeout(tmp_path, monkeypatch):
    import uvicorn

    from serve.__main__ import main

    seen: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(kw))
    overrides = [
        "backend.kind=openai",
        "backend.base_url=http://127.0.0.1:9/v1",
        "model=critic",
        f"sessions.state_dir={tmp_path / 'state'}",
        "limits.header_timeout_s=3.5",
    ]
    assert main(overrides) == 0
    assert seen["http"].head_timeout_s == 3.5
