"""Limits a hostile client or a broken backend must not get past (second round).

A backend's usage numbers are vetted (a count past 64 bits once made every route a 500), its
answers are bounded in size, screenshots are PNG or JPEG only, request heads are bounded in
size, request bodies in time, and connections in number. Everything runs on loopback with a
bounded number of connections and sub-second or few-second deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import logging
import os
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from hivig.backends import BackendError, OpenAIClient, Sampling
from hivig.backends.openai_client import response_limit
from hivig.messages import ChatMessage, TextPart
from serve.app import create_app
from serve.server import limit_accept_errors
from tests.fakes.gateway import (
    CLICK,
    GOOD,
    SUMMARY,
    LiveServer,
    ScriptedBackend,
    b64,
    gateway_client,
    serve_config,
    session_body,
    start_session,
)
from tests.fakes.openai_server import Reply, ScriptedServer, request_text

FAST = {"timeout_s": 5.0, "max_retries": 2, "backoff_s": 0.0}


def _generate(client: OpenAIClient, max_tokens: int = 16) -> Any:
    messages = [ChatMessage(role="user", content=[TextPart("Is the click correct?")])]

    async def main() -> Any:
        async with client:
            return await client.generate(messages, Sampling(max_tokens=max_tokens))

    return asyncio.run(main())


def _completion(content: str, **usage: Any) -> bytes:
    """A chat completion body with ``usage`` as given (numbers JSON allows, whatever size)."""
    body = {
        "choices": [
            {"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": usage,
    }
    return json.dumps(body).encode()


def _openai_gateway(tmp_path, server: ScriptedServer, *overrides: str) -> TestClient:
    cfg = serve_config(
        tmp_path / "state",
        "backend.kind=openai",
        "backend.model=scripted",
        f"backend.base_url={server.base_url}",
        "backend.max_retries=2",
        "backend.backoff_s=0",
        *overrides,
    )
    return TestClient(create_app(cfg), raise_server_exceptions=False)


def _answer_by_kind(critique: bytes, history: bytes | None = None):
    """A scripted backend answer: ``critique`` for verdicts, a plain summary for the rest."""

    def respond(body: dict) -> Reply:
        if "Current Proposed Step" in request_text(body):
            return Reply(raw_body=critique)
        return Reply(raw_body=history) if history is not None else Reply(content=SUMMARY)

    return respond


# ---------------------------------------------------------------------------------------------
# 15. Usage numbers from the backend


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 10**30, "completion_tokens": 5},
        {"prompt_tokens": -3, "completion_tokens": 5},
        {"prompt_tokens": 7.5, "completion_tokens": 5},
        {"prompt_tokens": "12", "completion_tokens": 5},
        {"prompt_tokens": True, "completion_tokens": 5},
    ],
)
def test_a_usage_count_that_is_not_a_count_is_treated_as_absent(usage, caplog):
    reply = Reply(raw_body=_completion("Good", **usage))
    with (
        ScriptedServer([reply]) as server,
        caplog.at_level(logging.WARNING, logger="hivig.backends.openai_client"),
    ):
        gen = _generate(OpenAIClient(server.base_url, "m", **FAST))
    assert (gen.text, gen.usage.prompt_tokens, gen.usage.completion_tokens) == ("Good", 0, 5)
    assert "usage.prompt_tokens" in caplog.text and "treated as absent" in caplog.text


def test_a_usage_count_past_64_bits_gives_a_normal_verdict_and_commits_the_step(tmp_path):
    huge = {"prompt_tokens": 10**30, "completion_tokens": 10**30}
    # The history answer carries the same usage: both routes must survive it.
    respond = _answer_by_kind(_completion(GOOD, **huge), _completion(SUMMARY, **huge))
    with ScriptedServer(respond=respond) as srv, _openai_gateway(tmp_path, srv) as c:
        sid = start_session(c)
        r = c.post(f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": _png()})
        assert r.status_code == 200, r.text
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
        assert r.status_code == 200, r.text
        assert r.json()["verdict"] == "good" and r.json()["usage"]["prompt"] == 0
        assert c.get(f"/v1/sessions/{sid}").json()["step_idx"] == 0
        stateless = c.post(
            "/v1/critique", json={**session_body(), "screenshot": _png(), "action": CLICK}
        )
        assert stateless.status_code == 200, stateless.text
        assert stateless.json()["verdict"] == "good"


# ---------------------------------------------------------------------------------------------
# 18. Size of the backend's answers


def test_an_answer_over_the_size_limit_is_a_bad_response_not_retried():
    big = _completion("x" * 300_000, prompt_tokens=1, completion_tokens=1)
    with ScriptedServer(default=Reply(raw_body=big)) as server:
        client = OpenAIClient(server.base_url, "m", max_response_bytes=100_000, **FAST)
        with pytest.raises(BackendError) as err:
            _generate(client)
        assert server.request_count == 1  # the same request would be answered as long again
    assert err.value.reason == "bad_response" and "over 100000 bytes" in str(err.value)


def test_the_default_size_limit_follows_the_token_cap():
    assert response_limit(768) < 5 * 1024 * 1024 < response_limit(8192)
    over = _completion("y" * (response_limit(16) + 1000))
    with ScriptedServer([Reply(raw_body=over), Reply(content="Good")]) as server:
        client = OpenAIClient(server.base_url, "m", **FAST)
        with pytest.raises(BackendError, match="over"):
            _generate(client, max_tokens=16)
        assert _generate(client, max_tokens=16).text == "Good"  # an ordinary answer still reads


def test_an_oversized_backend_answer_makes_the_verdict_abstain(tmp_path):
    big = _completion("<criticism>" + "z" * 400_000, prompt_tokens=1, completion_tokens=1)
    limit = "backend.max_response_bytes=200000"
    with (
        ScriptedServer(respond=_answer_by_kind(big)) as server,
        _openai_gateway(tmp_path, server, limit) as c,
    ):
        sid = start_session(c)
        r = c.post(f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": _png()})
        assert r.status_code == 200, r.text
        before = server.request_count
        r = c.post(f"/v1/sessions/{sid}/critique", json={"step_idx": 0, "action": CLICK})
        assert r.status_code == 200, r.text
        assert r.json()["verdict"] == "abstain" and r.json()["status"] == "degraded"
        assert server.request_count == before + 1


def _png(size: tuple[int, int] = (320, 200)) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 210, 220)).save(buf, "PNG")
    return b64(buf.getvalue())


# ---------------------------------------------------------------------------------------------
# 19. Screenshot formats


def _encoded(fmt: str) -> bytes | None:
    """A screen in Pillow format ``fmt``; ``None`` when this Pillow cannot write it."""
    image = Image.new("RGB", (64, 48), (30, 90, 200))
    buf = io.BytesIO()
    try:
        image.save(buf, format=fmt)
    except (OSError, KeyError, ValueError):
        return None
    return buf.getvalue()


REFUSED = ["TIFF", "BMP", "ICO", "TGA", "PCX", "JPEG2000", "AVIF", "WEBP", "GIF", "EPS"]


@pytest.mark.parametrize("fmt", REFUSED)
def test_a_screenshot_in_another_format_is_refused_before_it_is_decoded(tmp_path, fmt):
    data = _encoded(fmt)
    if data is None:
        pytest.skip(f"this Pillow cannot write {fmt}")
    with gateway_client(tmp_path) as c:
        up = c.post("/v1/images", json={"image": b64(data)})
        assert up.status_code == 415, up.text
        assert up.json()["error"]["code"] == "bad_image"
        assert "neither PNG nor JPEG" in up.json()["error"]["message"]
        sid = start_session(c)
        r = c.post(f"/v1/sessions/{sid}/observe", json={"step_idx": 0, "screenshot": b64(data)})
        assert r.status_code == 415 and r.json()["error"]["code"] == "bad_image"


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_png_and_jpeg_screenshots_are_still_served(tmp_path, fmt):
    with gateway_client(tmp_path) as c:
        up = c.post("/v1/images", json={"image": b64(_encoded(fmt))})
        assert up.status_code == 201, up.text


def test_an_image_with_png_magic_but_another_body_is_a_bad_image(tmp_path):
    with gateway_client(tmp_path) as c:
        fake = b"\x89PNG\r\n\x1a\n" + _encoded("BMP")
        up = c.post("/v1/images", json={"image": b64(fake)})
        assert (up.status_code, up.json()["error"]["code"]) == (400, "bad_image")


# ---------------------------------------------------------------------------------------------
# 14 and 16. Connections: body deadline, head size, connection cap


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def _until_closed(sock: socket.socket, seconds: float) -> tuple[bytes, float | None]:
    """What the server sends within ``seconds`` and when it closed (``None``: still open)."""
    data, start = b"", time.monotonic()
    while time.monotonic() - start < seconds:
        sock.settimeout(max(0.01, seconds - (time.monotonic() - start)))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return data, time.monotonic() - start
        if not chunk:
            return data, time.monotonic() - start
        data += chunk
    return data, None


def _post_head(path: str, length: int, extra: bytes = b"") -> bytes:
    return (
        (
            f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n"
        ).encode()
        + extra
        + b"\r\n"
    )


@pytest.fixture
def limited(tmp_path):
    cfg = serve_config(
        tmp_path / "state",
        "limits.body_timeout_s=2.0",
        "limits.header_timeout_s=5.0",
        "limits.max_header_bytes=8192",
        "limits.max_connections=80",
    )
    with LiveServer(create_app(cfg, ScriptedBackend())) as srv:
        yield srv


def test_fifty_unfinished_bodies_are_cut_with_408_and_healthz_keeps_answering(limited, caplog):
    socks = [_connect(limited.url) for _ in range(50)]
    try:
        start = time.monotonic()
        for sock in socks:
            sock.sendall(_post_head("/v1/sessions", 1000) + b'{"task": ')  # never finished
        with httpx.Client(base_url=limited.url, timeout=5) as c:
            for _ in range(3):
                assert c.get("/healthz").status_code == 200
        closed_at = []
        for sock in socks:
            data, closed_after = _until_closed(sock, 10.0)
            assert data.startswith(b"HTTP/1.1 408"), data[:80]
            assert b'"code":"request_timeout"' in data
            assert closed_after is not None
            closed_at.append(time.monotonic() - start)
        # Each body had the 2 s deadline from its own head, none less: the first connection is
        # cut no sooner than 2 s, and the others within a few seconds of it (each on its own
        # clock, not one after another).
        assert closed_at[0] >= 1.9, closed_at[0]
        assert closed_at[-1] - closed_at[0] < 3.0, (closed_at[0], closed_at[-1])
        with httpx.Client(base_url=limited.url, timeout=5) as c:
            assert c.get("/healthz").status_code == 200
    finally:
        for sock in socks:
            sock.close()
    # A cut body is the client's doing, not the gateway's failing: no error lines.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_trickled_body_is_cut_at_the_deadline_and_a_slow_one_in_time_is_served(limited):
    body = json.dumps(session_body()).encode()
    slow = _connect(limited.url)
    trickle = _connect(limited.url)
    try:
        slow.sendall(_post_head("/v1/sessions", len(body)))
        trickle.sendall(_post_head("/v1/sessions", 10_000))
        for piece in (body[:20], body[20:40], body[40:]):
            time.sleep(0.1)  # 0.3 s for the body in all: well within the 2 s
            slow.sendall(piece)
            trickle.sendall(b" " * 10)
        assert _until_closed(slow, 10.0)[0].startswith(b"HTTP/1.1 201")
        # A byte every 0.1 s does not extend the deadline: the 408 comes while the trickle
        # goes on (for 10 s, five deadlines), not once it stops.
        cut_while_trickling = False
        for _ in range(100):
            if select.select([trickle], [], [], 0.1)[0]:
                cut_while_trickling = True
                break
            try:
                trickle.sendall(b" ")
            except OSError:
                cut_while_trickling = True
                break
        data, _ = _until_closed(trickle, 10.0)
        assert cut_while_trickling
        assert data.startswith(b"HTTP/1.1 408"), data[:80]
    finally:
        slow.close()
        trickle.close()


def test_a_head_over_the_size_limit_is_answered_431_and_closed(limited):
    sock = _connect(limited.url)
    try:
        head = b"GET /healthz HTTP/1.1\r\nHost: gw\r\nX-Pad: " + b"a" * 200_000 + b"\r\n\r\n"
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for i in range(0, len(head), 16384):
                sock.sendall(head[i : i + 16384])
        data, closed_after = _until_closed(sock, 3.0)
        assert data.startswith(b"HTTP/1.1 431"), data[:80]
        assert closed_after is not None
    finally:
        sock.close()


def test_blank_lines_before_the_request_line_do_not_hide_a_long_head(limited):
    # Sent at once, so that the server reads it in one piece: the blank lines' ``\r\n\r\n``
    # once ended the count at byte 4 and the whole 30 kB head went through.
    head = b"\r\n\r\nGET /healthz HTTP/1.1\r\nHost: gw\r\nX-Pad: " + b"a" * 30_000 + b"\r\n\r\n"
    sock = _connect(limited.url)
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head)
        data, closed_after = _until_closed(sock, 3.0)
        assert data.startswith(b"HTTP/1.1 431"), data[:80]
        assert closed_after is not None
    finally:
        sock.close()


def test_blank_lines_before_a_short_request_are_still_served(limited):
    sock = _connect(limited.url)
    try:
        sock.sendall(b"\r\n\r\nGET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        assert _until_closed(sock, 3.0)[0].startswith(b"HTTP/1.1 200")
    finally:
        sock.close()


def test_chunked_trailers_over_the_head_limit_are_answered_431_and_closed(limited):
    """Trailers come after the last chunk, while the body is still open: llhttp buffers them
    like headers, so they are held to the head's limit rather than left to the body deadline."""
    sock = _connect(limited.url)
    try:
        sock.sendall(
            b"POST /v1/sessions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n0\r\nX-T: "
        )
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for _ in range(40):  # 160 KiB at most, twenty times the limit
                sock.sendall(b"t" * 4096)
        data, closed_after = _until_closed(sock, 10.0)
        # 431 for its size: left to the body deadline, it was a 408 after 2 s.
        assert data.startswith(b"HTTP/1.1 431"), data[:80]
        assert closed_after is not None
    finally:
        sock.close()


def test_a_chunked_body_with_short_trailers_is_served(limited):
    body = json.dumps(session_body()).encode()
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 50]), body[i : i + 50]) for i in range(0, len(body), 50)
    )
    sock = _connect(limited.url)
    try:
        sock.sendall(
            b"POST /v1/sessions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + chunks
            + b"0\r\nX-T: "
            + b"t" * 4000
            + b"\r\n\r\n"
        )
        data, _ = _until_closed(sock, 5.0)
        assert data.startswith(b"HTTP/1.1 201"), data[:80]
    finally:
        sock.close()


def test_a_head_near_the_limit_with_a_body_in_the_same_packets_is_served(limited):
    upload = json.dumps({"image": _png((640, 400))}).encode()
    head = _post_head("/v1/images", len(upload), b"X-Pad: " + b"p" * 7000 + b"\r\n")
    assert len(head) < 8192 < len(head) + len(upload)
    for split in (len(head) - 2, len(head) - 1, len(head) + 5):
        sock = _connect(limited.url)
        try:
            whole = head + upload
            sock.sendall(whole[:split])  # the head's end straddles two packets
            time.sleep(0.05)
            sock.sendall(whole[split:])
            data, _ = _until_closed(sock, 3.0)
            assert data.startswith(b"HTTP/1.1 201"), (split, data[:80])
        finally:
            sock.close()


def test_connections_past_the_cap_get_503_and_the_gateway_recovers(limited):
    socks = [_connect(limited.url) for _ in range(95)]
    try:
        refused = 0
        for sock in socks[80:]:
            data, closed_after = _until_closed(sock, 2.0)
            refused += data.startswith(b"HTTP/1.1 503") and closed_after is not None
        assert refused >= 10  # the first 80 (less /healthz's own) are held, the rest refused
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.2)
    with httpx.Client(base_url=limited.url, timeout=5) as c:
        assert c.get("/healthz").status_code == 200


def test_failed_accepts_are_logged_once_per_period(caplog):
    loop = asyncio.new_event_loop()
    try:
        limit_accept_errors(loop, every_s=60.0)
        fail = OSError(errno.EMFILE, "Too many open files")
        with caplog.at_level(logging.ERROR):
            for _ in range(2000):
                loop.call_exception_handler(
                    {"message": "socket.accept() out of system resource", "exception": fail}
                )
            loop.call_exception_handler({"message": "something else", "exception": fail})
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records]
    assert sum("cannot accept" in line for line in lines) == 1
    assert sum("something else" in line for line in lines) == 1  # other errors as before


def test_the_accept_error_limiter_is_on_before_the_first_connection(tmp_path, caplog):
    """A process out of files before it ever accepted a connection logs one line, not a
    traceback per failed accept: the limiter comes with the server's loop."""
    cfg = serve_config(tmp_path / "state")
    with LiveServer(create_app(cfg, ScriptedBackend())) as srv:
        loop = srv.server.servers[0].get_loop()
        fail = OSError(errno.EMFILE, "Too many open files")
        context = {"message": "socket.accept() out of system resource", "exception": fail}
        with caplog.at_level(logging.ERROR):
            for _ in range(50):
                loop.call_soon_threadsafe(loop.call_exception_handler, context)
            done = threading.Event()
            loop.call_soon_threadsafe(done.set)
            assert done.wait(10)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert sum("cannot accept" in line for line in lines) == 1, lines[:3]
    assert len(lines) == 1, lines[:3]


_CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from serve.app import create_app
from tests.fakes.gateway import LiveServer, ScriptedBackend, serve_config
cfg = serve_config({state!r}, "limits.body_timeout_s=1.0", "limits.header_timeout_s=5.0")
with LiveServer(create_app(cfg, ScriptedBackend())) as srv:
    print(srv.port, flush=True)
    time.sleep(30)
"""


def _low_fd_limit() -> None:
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


@pytest.mark.skipif(sys.platform != "linux", reason="open-file limits as on Linux")
def test_more_slow_bodies_than_open_files_neither_floods_the_log_nor_stops_healthz(tmp_path):
    """A gateway allowed 256 open files, 300 connections sending headers and never a body:
    the connection cap (fitted under the limit) refuses the excess, so accept never runs out of
    files; once the slow ones are cut, /healthz answers."""
    root = str(Path(__file__).resolve().parents[3])
    script = _CHILD.format(root=root, state=str(tmp_path / "state"))
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_low_fd_limit,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    socks: list[socket.socket] = []
    try:
        port = int(child.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            sock = _connect(url)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(_post_head("/v1/sessions", 1000))
            socks.append(sock)
        time.sleep(2.5)  # past the 1 s body deadline, and a few accept retries
        with httpx.Client(base_url=url, timeout=5) as c:
            assert c.get("/healthz").status_code == 200
    finally:
        for sock in socks:
            sock.close()
        child.terminate()
        _, err = child.communicate(timeout=30)
    text = err.decode(errors="replace")
    assert text.count("Too many open files") <= 2, text[-2000:]
    assert len(text) < 20_000, text[-2000:]
