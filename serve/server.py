"""How the gateway's HTTP server is run: the protocol both entry points use, and a background
server for programs that need a gateway next to them for a while (examples, the demo, tests).

``python -m serve`` is the way to run a gateway as a service::

    with BackgroundServer(create_app(cfg)) as srv:
        client = CriticClient(srv.url)
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import threading
import time
import weakref
from typing import Any

from serve.config import LimitsConfig, ServeConfig

log = logging.getLogger(__name__)


FD_RESERVE = 256
"""Open files kept for the gateway's own use (store, images, traces, backend connections) when
``limits.max_connections`` is fitted under the process's open-file limit."""


def connection_cap(wanted: int) -> int:
    """``wanted`` connections, lowered to fit the open-file limit less ``FD_RESERVE``: a server
    that runs out of files can accept nothing, ``/healthz`` included."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    usable = soft - FD_RESERVE if soft > 2 * FD_RESERVE else soft // 2
    cap = max(1, min(wanted, usable))
    if cap < wanted:
        log.warning(
            "limits.max_connections lowered from %d to %d: this process may open %d files "
            "(raise ulimit -n to allow more)",
            wanted,
            cap,
            soft,
        )
    return cap


class _EveryFew:
    """Lets one log line through per ``every_s`` seconds and counts the ones held back."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self.held = 0
        self._next = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            self.held += 1
            return False
        self._next = now + self.every_s
        return True

    def take_held(self) -> int:
        held, self.held = self.held, 0
        return held


_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_limited_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def limit_accept_errors(loop: asyncio.AbstractEventLoop, every_s: float = 10.0) -> None:
    """Log a failing ``accept()`` (out of files or memory) once per ``every_s`` on ``loop``.

    asyncio logs each failed accept with a traceback, up to a backlog's worth per wake-up and
    again at every retry: out of files, that grew a log by hundreds of megabytes a minute.
    Other errors go to the handler that was there before.
    """
    if loop in _limited_loops:
        return
    _limited_loops.add(loop)
    previous = loop.get_exception_handler()
    gate = _EveryFew(every_s)

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        accept = "accept" in str(context.get("message", ""))
        if not (accept and isinstance(exc, OSError) and exc.errno in _OUT_OF_RESOURCES):
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        if gate.due():
            log.error(
                "cannot accept connections: %s (%d more such errors since the last line)",
                exc,
                gate.take_held(),
            )

    loop.set_exception_handler(handler)


GATEWAY_LOOP = "serve.server:gateway_loop"
"""uvicorn's ``loop`` setting for every gateway server (``BackgroundServer``, ``python -m
serve`` and its workers): its event loop, with ``limit_accept_errors``."""


def gateway_loop() -> asyncio.AbstractEventLoop:
    """uvicorn's own loop (``loop="auto"``) with the accept-error limiter installed before the
    server listens: a process out of files before its first connection logs no flood either."""
    from uvicorn.loops.auto import auto_loop_factory

    loop = auto_loop_factory(use_subprocess=False)()
    limit_accept_errors(loop)
    return loop


def _answer(status: int, reason: bytes, code: str, message: str, extra: bytes = b"") -> bytes:
    """A whole HTTP answer in the gateway's error shape, closing the connection."""
    body = b'{"error":{"code":"%s","message":"%s"}}' % (code.encode(), message.encode())
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, reason),
            b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body),
            extra,
            b"connection: close\r\n\r\n",
            body,
        ]
    )


def http_protocol(
    header_timeout_s: float,
    *,
    body_timeout_s: float | None = None,
    max_header_bytes: int | None = None,
    max_connections: int | None = None,
) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with limits on every connection: a deadline on every request
    head (``limits.header_timeout_s``) and body (``limits.body_timeout_s``), a size limit on the
    head (``limits.max_header_bytes``) and a cap on open connections (``limits.max_connections``).

    uvicorn times out only idle keep-alive connections: a client that opens a connection and
    sends part of a request line or headers, or nothing, holds it for ever, and enough such
    clients exhaust the server's connections (slowloris). Here a head is due within
    ``header_timeout_s`` of the connection opening, or of the first byte of the next request on
    a kept-alive connection; the connection is closed when it is late. Sending bytes slowly
    does not extend it. A body is due within ``body_timeout_s`` of its head (408, closed).
    llhttp puts no limit on a head's size and httptools buffers a header until it ends: a head
    is counted as it arrives, and past ``max_header_bytes`` it is answered 431 and closed.
    A connection past ``max_connections`` is answered 503 and closed before it sends anything;
    the cap is fitted under the open-file limit, so ``accept()`` never runs out of files (its
    errors, should they come, are logged once per 10 s: ``limit_accept_errors``).

    The three new limits default to the app's ``limits`` (an app built by ``create_app``), else
    to ``LimitsConfig``'s; given here, they win.

    httptools (llhttp, in C) rather than h11 (pure Python): parsing two requests per agent step
    costs the gateway about 0.5 ms less CPU per step.
    """
    # Deferred, as in BackgroundServer: importing this module does not load the server stack.
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    given = (body_timeout_s, max_header_bytes, max_connections)

    class LimitedProtocol(HttpToolsProtocol):
        head_timeout_s = header_timeout_s
        limits: tuple[float, int, int] | None = None
        """``(body_timeout_s, max_header_bytes, max_connections)``, fixed by the first
        connection (from the app's config and ``given``)."""
        refusals = _EveryFew()
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _head_bytes = 0  # bytes of the current head so far
        _head_tail = b""  # the last bytes counted, where a head's end may begin
        _head_started = False  # a request line has begun (blank lines before it skipped)
        _frame_bytes = 0  # bytes of a body that are not body: chunk sizes, trailers
        _in_head = False  # the parser is between a request's first byte and its last header
        _in_body = False  # between a request's last header and the end of its body

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            cls = type(self)
            if cls.limits is None:
                cls.limits = _resolve_limits(self.app, given)
            limit_accept_errors(self.loop)  # a no-op under GATEWAY_LOOP; for other servers

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > self.limits[2]:
                self._refuse()
                return
            self._start_head_timer()

        def data_received(self, data: bytes) -> None:
            if not self._in_body and self._head_too_long(data):
                return
            if self._in_body:
                self._frame_bytes += len(data)  # less the body itself, in ``on_body``
            super().data_received(data)
            if self._in_body and self._frame_too_long():
                return
            # Bytes while nothing is served and no body is due: a head has begun (or blank
            # lines, which the parser skips). A pipelined head that arrives while an earlier
            # request is served is timed from that request's answer, as with h11: uvicorn reads
            # no further until then.
            if self._in_body or self._serving():
                self._stop_head_timer()
            else:
                self._start_head_timer()
            # A body queued behind an earlier answer cannot arrive (uvicorn stopped reading):
            # it is timed once that answer is out (``on_response_complete``).
            if self._in_body and not self.pipeline:
                self._start_body_timer()

        def on_message_begin(self) -> None:
            self._in_head = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_head, self._in_body = False, True
            self._head_bytes, self._head_tail, self._head_started = 0, b"", False
            self._frame_bytes = 0
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            self._frame_bytes -= len(body)
            super().on_body(body)

        def on_chunk_complete(self) -> None:
            # A chunk's size line is counted until its data is in; the last chunk (size 0)
            # completes only after its trailers, which llhttp buffers whole like headers.
            self._frame_bytes = 0

        def on_message_complete(self) -> None:
            self._in_body = False
            self._stop_body_timer()
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # A pipelined request may already be partly in; an idle keep-alive connection is
            # uvicorn's own keep-alive timeout's business.
            if self._in_head and not self._serving():
                self._start_head_timer()
            else:
                self._stop_head_timer()
            if self._in_body and not self.transport.is_closing():
                self._stop_body_timer()  # reading resumes now: the body's time starts again
                self._start_body_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            self._stop_body_timer()
            super().connection_lost(exc)

        def _serving(self) -> bool:
            # ``cycle`` is the latest request parsed, and answers complete in order.
            return self.cycle is not None and not self.cycle.response_complete

        def _head_too_long(self, data: bytes) -> bool:
            if not self._head_started:
                # The parser skips blank lines before a request line: counted, but no end of
                # a head (``\r\n\r\n`` there ended the count before the head had begun).
                rest = data.lstrip(b"\r\n")
                self._head_bytes += len(data) - len(rest)
                self._head_started, data = bool(rest), rest
            # Only the bytes up to the head's end count: a body may follow in the same chunk.
            window = self._head_tail + data if self._head_tail else data
            end = window.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._head_tail))
            self._head_tail = window[-3:]
            if self._head_bytes <= self.limits[1]:
                return False
            self._stop_head_timer()
            if not self.transport.is_closing():
                if not self._serving():  # never in the middle of an answer being written
                    message = f"request line and headers over {self.limits[1]} bytes"
                    self.transport.write(
                        _answer(431, b"Request Header Fields Too Large", "bad_request", message)
                    )
                self.transport.close()
            return True

        def _frame_too_long(self) -> bool:
            # Chunk size lines with their extensions, and trailers, are held to the head's
            # limit: llhttp buffers a trailer until it ends, as it does a header.
            if self._frame_bytes <= self.limits[1] or self.transport.is_closing():
                return False
            self._stop_body_timer()
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                cycle.disconnected = True  # the app reads a disconnect; the 431 is the answer
                cycle.message_event.set()
                message = f"chunk sizes or trailers over {self.limits[1]} bytes"
                self.transport.write(
                    _answer(431, b"Request Header Fields Too Large", "bad_request", message)
                )
            self.transport.close()
            return True

        def _refuse(self) -> None:
            if self.refusals.due():
                log.warning(
                    "connection limit (%d) reached: new connections get 503 "
                    "(%d more since the last line)",
                    self.limits[2],
                    self.refusals.take_held(),
                )
            message = f"over {self.limits[2]} open connections; retry later"
            retry = b"retry-after: 1\r\n"
            self.transport.write(_answer(503, b"Service Unavailable", "overloaded", message, retry))
            self.transport.close()

        def _start_head_timer(self) -> None:
            if self._head_timer is None:  # never restarted by more bytes of the same head
                self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _start_body_timer(self) -> None:
            if self._body_timer is None:  # never restarted by more bytes of the same body
                self._body_timer = self.loop.call_later(self.limits[0], self._body_late)

        def _stop_body_timer(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                log.debug(
                    "closing a connection whose request head took over %s s", self.head_timeout_s
                )
                self.transport.close()

        def _body_late(self) -> None:
            self._body_timer = None
            if self.transport.is_closing():
                return
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                # The app reads a disconnect and whatever it sends is dropped: the 408 is the
                # answer.
                cycle.disconnected = True
                cycle.message_event.set()
                message = f"request body not complete within {self.limits[0]:g} s"
                self.transport.write(_answer(408, b"Request Timeout", "request_timeout", message))
            log.debug("closing a connection whose request body took over %s s", self.limits[0])
            self.transport.close()

    return LimitedProtocol


def _resolve_limits(
    app: Any, given: tuple[float | None, int | None, int | None]
) -> tuple[float, int, int]:
    """``(body_timeout_s, max_header_bytes, max_connections)``: ``given`` where set, else the
    app's ``limits`` (the config of a ``create_app`` app under uvicorn's wrappers), else the
    defaults; the connection cap fitted under the open-file limit."""
    limits = LimitsConfig()
    for _ in range(8):  # uvicorn wraps the app in a few middlewares, each with ``.app``
        cfg = getattr(getattr(app, "state", None), "config", None)
        if isinstance(cfg, ServeConfig):
            limits = cfg.limits
            break
        app = getattr(app, "app", None)
        if app is None:
            break
    body_s, head_bytes, conns = given
    return (
        float(limits.body_timeout_s if body_s is None else body_s),
        int(limits.max_header_bytes if head_bytes is None else head_bytes),
        connection_cap(int(limits.max_connections if conns is None else conns)),
    )


def header_timeout_of(app: Any) -> float:
    """``limits.header_timeout_s`` of an app built by ``create_app`` (it keeps its config in
    ``app.state.config``); the default for any other app."""
    cfg = getattr(getattr(app, "state", None), "config", None)
    limits = cfg.limits if isinstance(cfg, ServeConfig) else LimitsConfig()
    return limits.header_timeout_s


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BackgroundServer:
    """A uvicorn server on 127.0.0.1 in a daemon thread; leaving the block shuts it down
    gracefully (in-flight requests finish)."""

    def __init__(
        self,
        app: Any,
        port: int = 0,
        graceful_s: float = 10.0,
        start_s: float = 120.0,
        header_timeout_s: float | None = None,
    ) -> None:
        """Serve ``app`` on ``port`` (0: a free one); a request head is due within
        ``header_timeout_s`` (``None``: the app's ``limits.header_timeout_s``)."""
        import uvicorn

        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._start_s = start_s
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=int(graceful_s),
            lifespan="on",
            loop=GATEWAY_LOOP,
            http=http_protocol(
                header_timeout_of(app) if header_timeout_s is None else header_timeout_s
            ),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="hivig-gateway", daemon=True)

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + self._start_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.stop()
                raise RuntimeError("the gateway did not start (see the log above)")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Ask for a graceful shutdown and wait for it."""
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=60)

    def __exit__(self, *exc: object) -> None:
        self.stop()
