"""A loopback OpenAI-compatible server that answers from a script, for tests and benchmarks.

It is a real HTTP/1.1 server on 127.0.0.1 (a free port) run by an asyncio loop in a background
thread, so clients are exercised over real sockets: latency, error statuses, timeouts, malformed
bodies and the reasoning-field variants of vLLM/SGLang can all be scripted. It stops itself after
``lifetime_s`` so a forgotten server never outlives its test.

Example::

    replies = [Reply(status=503), Reply(content="<summary>ok</summary>")]
    with ScriptedServer(replies=replies, latency_s=0.05) as server:
        client = OpenAIClient(server.base_url, "scripted")
        ...
        assert server.request_count == 2

Answering from the prompt (data_gen tests)::

    def respond(body: dict) -> Reply | str:
        return "Bad" if "delete" in request_text(body) else "Good"

    with ScriptedServer(respond=respond) as server: ...
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Literal

from hivig.logging import get_logger

logger = get_logger(__name__)

ReasoningField = Literal["reasoning_content", "reasoning"]

# Listen backlog: a small one (the stdlib's http.server uses 5) makes bursts of new connections
# wait for SYN retransmits (about 1 s each), which would show up as latency not in the script.
_LISTEN_BACKLOG = 256


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    Attributes:
        content: Assistant message content (may carry inline ``<think>`` markup).
        reasoning: Reasoning text, sent in ``reasoning_field`` when not ``None``.
        reasoning_field: ``reasoning_content`` (older vLLM, SGLang) or ``reasoning``.
        status: HTTP status; non-200 answers carry an OpenAI-style error body.
        delay_s: Extra seconds to wait before answering (beyond the server's ``latency_s``).
        raw_body: Bytes sent verbatim instead of a JSON completion (malformed-body tests).
        headers: Extra response headers, e.g. ``{"Retry-After": "1"}``.
        finish_reason: ``finish_reason`` of the choice.
        prompt_tokens: Reported prompt tokens.
        completion_tokens: Reported completion tokens; by default the content's word count.
        drop_connection: Close the socket without answering (a transport error).
    """

    content: str | None = "ok"
    reasoning: str | None = None
    reasoning_field: ReasoningField = "reasoning_content"
    status: int = 200
    delay_s: float = 0.0
    raw_body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    finish_reason: str = "stop"
    prompt_tokens: int = 10
    completion_tokens: int | None = None
    drop_connection: bool = False


Responder = Callable[[dict[str, Any]], "Reply | str"]


def request_text(body: dict[str, Any]) -> str:
    """All text of a chat request's messages, joined by newlines (for prompt-driven answers)."""
    chunks: list[str] = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            chunks.append(content)
        elif isinstance(content, list):
            chunks.extend(p.get("text", "") for p in content if p.get("type") == "text")
    return "\n".join(chunks)


def request_images(body: dict[str, Any]) -> list[bytes]:
    """Decoded bytes of every base64 ``data:`` image URL in a chat request, in order.

    Raises:
        ValueError: An image URL is not a base64 data URL.
    """
    images: list[bytes] = []
    for message in body.get("messages", []):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if part.get("type") != "image_url":
                continue
            url = part["image_url"]["url"]
            header, sep, payload = url.partition(",")
            if not sep or not header.startswith("data:") or not header.endswith(";base64"):
                raise ValueError(f"not a base64 data URL: {url[:40]!r}")
            images.append(base64.b64decode(payload, validate=True))
    return images


class ScriptedServer:
    """Background HTTP server implementing ``POST /v1/chat/completions`` from a script.

    Each request takes the next ``Reply`` from ``replies``; when they run out (or none were
    given) ``respond(body)`` decides, and without a ``respond`` the ``default`` reply is used.
    ``GET /v1/models`` lists ``model``; ``GET /health`` answers 200.

    The server is an asyncio loop in one daemon thread: scripted delays are timers, not sleeping
    threads, so hundreds of slow requests cost no threads and the server competes with the
    client under test for the interpreter lock from a single thread. ``respond`` runs on that
    loop and should return quickly.
    """

    def __init__(
        self,
        replies: Iterable[Reply | str] = (),
        *,
        respond: Responder | None = None,
        default: Reply | None = None,
        latency_s: float = 0.0,
        model: str = "scripted",
        lifetime_s: float = 300.0,
        keep_requests: int = 1000,
    ) -> None:
        """Prepare the script; the socket opens on ``start()`` or ``with``.

        Args:
            replies: Answers for the first requests, in arrival order.
            respond: Function of the decoded request body, used after ``replies``.
            default: Answer when neither ``replies`` nor ``respond`` decides.
            latency_s: Seconds added to every request before answering.
            model: Model name reported in answers and ``/v1/models``.
            lifetime_s: The server shuts itself down this many seconds after ``start()``.
            keep_requests: Most recent request bodies kept in ``requests``.
        """
        self._queue: deque[Reply] = deque(_as_reply(r) for r in replies)
        self._respond = respond
        self._default = default or Reply()
        self.latency_s = latency_s
        self.model = model
        self.lifetime_s = lifetime_s
        self._lock = threading.Lock()
        self._count = 0
        self._in_flight = 0
        self._max_in_flight = 0
        self._bodies: deque[dict[str, Any]] = deque(maxlen=keep_requests)
        self.respond_errors: list[str] = []
        """Exceptions raised by ``respond`` (each was answered with a 500)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._port: int | None = None
        self._stopped = threading.Event()
        self._expiry: asyncio.Future[None] | None = None

    # ----------------------------------------------------------------------------------------
    # Life cycle

    def start(self) -> ScriptedServer:
        """Bind 127.0.0.1 on a free port and serve from a daemon thread.

        Returns:
            ``self``, for chaining.

        Raises:
            RuntimeError: The server was started before.
        """
        if self._loop is not None:
            raise RuntimeError("ScriptedServer already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(
            target=loop.run_forever, name="hivig-scripted-server", daemon=True
        )
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._open(), loop).result()
        logger.debug("scripted server listening on %s", self.base_url)
        return self

    async def _open(self) -> None:
        self._server = await asyncio.start_server(
            self._serve_connection, "127.0.0.1", 0, backlog=_LISTEN_BACKLOG
        )
        self._port = int(self._server.sockets[0].getsockname()[1])
        asyncio.get_running_loop().call_later(self.lifetime_s, self._expire)

    def stop(self) -> None:
        """Stop serving: close the socket, cut scripted delays short, end the thread.

        Safe to call twice, and after the server stopped itself.
        """
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or self._stopped.is_set():
            return
        if thread is threading.current_thread():
            raise RuntimeError("stop() cannot be called from the server's own loop")
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._stopped.set()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _expire(self) -> None:
        logger.warning("scripted server reached its lifetime of %g s; stopping", self.lifetime_s)

        async def shutdown_and_stop() -> None:
            await self._shutdown()
            asyncio.get_running_loop().stop()

        self._expiry = asyncio.ensure_future(shutdown_and_stop())

    def __enter__(self) -> ScriptedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------------------------------
    # Introspection

    @property
    def port(self) -> int:
        """The bound TCP port."""
        if self._port is None:
            raise RuntimeError("ScriptedServer is not running")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``, the root an OpenAI client takes."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def request_count(self) -> int:
        """Chat completion requests received so far."""
        with self._lock:
            return self._count

    @property
    def max_in_flight(self) -> int:
        """Most chat completion requests handled at the same time so far."""
        with self._lock:
            return self._max_in_flight

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Decoded bodies of the most recent requests (undecodable ones as ``{}``)."""
        with self._lock:
            return list(self._bodies)

    def push(self, *replies: Reply | str) -> None:
        """Append answers to the script while the server runs."""
        with self._lock:
            self._queue.extend(_as_reply(r) for r in replies)

    # ----------------------------------------------------------------------------------------
    # Connections (on the server loop)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            # HTTP/1.1 keep-alive: one connection carries many requests, as with a real pool.
            while await self._serve_request(reader, writer):
                pass
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError):
            pass  # server stopping, or the client went away mid-request
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one request; returns whether the connection stays open."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False  # clean close between requests
        except asyncio.LimitOverrunError:
            await _write(writer, 431, _error_body(431, "request head too large"))
            return False
        request = _parse_head(head)
        if request is None:
            await _write(writer, 400, _error_body(400, "malformed request head"))
            return False
        method, path, headers = request
        if "chunked" in headers.get("transfer-encoding", ""):
            await _write(writer, 411, _error_body(411, "send a Content-Length"))
            return False
        raw = await reader.readexactly(int(headers.get("content-length") or 0))
        keep_alive = headers.get("connection", "").lower() != "close"
        route = path.split("?", 1)[0].rstrip("/")
        if method == "POST" and route == "/v1/chat/completions":
            return await self._chat(raw, writer) and keep_alive
        if method == "GET" and route == "/v1/models":
            listing = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
            await _write(writer, 200, listing)
        elif method == "GET" and route == "/health":
            await _write(writer, 200, {"status": "ok"})
        else:
            await _write(writer, 404, _error_body(404, f"no route {method} {path}"))
        return keep_alive

    async def _chat(self, raw: bytes, writer: asyncio.StreamWriter) -> bool:
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            # Counted and recorded, but answered without consuming the script.
            self._record({})
            await _write(writer, 400, _error_body(400, "request body is not a JSON object"))
            self._done()
            return True
        self._record(body)
        try:
            reply = self._next_reply(body)
            delay = self.latency_s + reply.delay_s
            if delay > 0:
                await asyncio.sleep(delay)
            if reply.drop_connection:
                return False
            if reply.raw_body is not None:
                await _write(writer, reply.status, reply.raw_body, reply.headers)
            elif reply.status != 200:
                await _write(
                    writer, reply.status, _error_body(reply.status, "scripted"), reply.headers
                )
            else:
                await _write(writer, 200, self._completion(reply), reply.headers)
            return True
        finally:
            self._done()

    def _record(self, body: dict[str, Any]) -> None:
        with self._lock:
            self._count += 1
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            self._bodies.append(body)

    def _done(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _next_reply(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self._respond is None:
            return self._default
        try:
            return _as_reply(self._respond(body))
        except Exception as e:  # noqa: BLE001 (recorded in respond_errors, answered 500)
            logger.exception("scripted respond() failed")
            with self._lock:
                self.respond_errors.append(f"{type(e).__name__}: {e}")
            return Reply(status=500)

    def _completion(self, reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.reasoning is not None:
            message[reply.reasoning_field] = reply.reasoning
        completion = reply.completion_tokens
        if completion is None:
            completion = len((reply.content or "").split()) + len((reply.reasoning or "").split())
        return {
            "id": f"chatcmpl-scripted-{self._count}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": reply.prompt_tokens + completion,
            },
        }


def _as_reply(item: Reply | str) -> Reply:
    if isinstance(item, Reply):
        return item
    if isinstance(item, str):
        return Reply(content=item)
    raise TypeError(f"a scripted answer must be a Reply or a str, got {type(item).__name__}")


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]] | None:
    """``(method, path, lower-cased headers)`` of a request head, or ``None`` if malformed."""
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, path, version = lines[0].split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/1."):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            return None
        headers[name.strip().lower()] = value.strip()
    return method, path, headers


async def _write(
    writer: asyncio.StreamWriter,
    status: int,
    payload: Any,
    headers: dict[str, str] | None = None,
) -> None:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode("utf-8")
    reason = HTTPStatus(status).phrase if status in _KNOWN_STATUSES else "Scripted"
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    # Head and body in one write: a split write would let Nagle's algorithm hold the body back
    # until the client's delayed ACK (about 40 ms on Linux).
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)
    await writer.drain()


_KNOWN_STATUSES = {s.value for s in HTTPStatus}


def _error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "scripted_error", "code": status}}
