"""Run the gateway app in a background thread (examples, the demo, tests).

``python -m serve`` is the way to run a gateway as a service; this is for programs that need one
next to them for a while::

    with BackgroundServer(create_app(cfg)) as srv:
        client = CriticClient(srv.url)
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BackgroundServer:
    """A uvicorn server on 127.0.0.1 in a daemon thread; leaving the block shuts it down
    gracefully (in-flight requests finish)."""

    def __init__(
        self, app: Any, port: int = 0, graceful_s: float = 10.0, start_s: float = 120.0
    ) -> None:
        """Serve ``app`` on ``port`` (0: a free one)."""
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
