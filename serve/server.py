"""How the gateway's HTTP server is run: the protocol both entry points use, and a background
server for programs that need a gateway next to them for a while (examples, the demo, tests).

``python -m serve`` is the way to run a gateway as a service::

    with BackgroundServer(create_app(cfg)) as srv:
        client = CriticClient(srv.url)
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any

from serve.config import LimitsConfig, ServeConfig

log = logging.getLogger(__name__)


def http_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with a deadline on every request head
    (``limits.header_timeout_s``).

    uvicorn times out only idle keep-alive connections: a client that opens a connection and
    sends part of a request line or headers, or nothing, holds it for ever, and enough such
    clients exhaust the server's connections (slowloris). Here a head is due within
    ``header_timeout_s`` of the connection opening, or of the first byte of the next request on
    a kept-alive connection; the connection is closed when it is late. Sending bytes slowly
    does not extend it. Once a head is in, the app reads the body under its own limits.

    httptools (llhttp, in C) rather than h11 (pure Python): parsing two requests per agent step
    costs the gateway about 0.5 ms less CPU per step.
    """
    # Deferred, as in BackgroundServer: importing this module does not load the server stack.
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HeadTimeoutProtocol(HttpToolsProtocol):
        head_timeout_s = header_timeout_s
        _head_timer: asyncio.TimerHandle | None = None
        _in_head = False  # the parser is between a request's first byte and its last header
        _in_body = False  # between a request's last header and the end of its body

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._start_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # Bytes while nothing is served and no body is due: a head has begun (or blank
            # lines, which the parser skips). A pipelined head that arrives while an earlier
            # request is served is timed from that request's answer, as with h11: uvicorn reads
            # no further until then.
            if self._in_body or self._serving():
                self._stop_head_timer()
            else:
                self._start_head_timer()

        def on_message_begin(self) -> None:
            self._in_head = True
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            self._in_head, self._in_body = False, True
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_body = False
            super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # A pipelined request may already be partly in; an idle keep-alive connection is
            # uvicorn's own keep-alive timeout's business.
            if self._in_head and not self._serving():
                self._start_head_timer()
            else:
                self._stop_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def _serving(self) -> bool:
            # ``cycle`` is the latest request parsed, and answers complete in order.
            return self.cycle is not None and not self.cycle.response_complete

        def _start_head_timer(self) -> None:
            if self._head_timer is None:  # never restarted by more bytes of the same head
                self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                log.debug(
                    "closing a connection whose request head took over %s s", self.head_timeout_s
                )
                self.transport.close()

    return HeadTimeoutProtocol


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
