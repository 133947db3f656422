"""The test web application: static pages from package data, served by a stdlib HTTP server.

One ``WebApp`` is one ``ThreadingHTTPServer`` on 127.0.0.1 (a free port by default) in a daemon
thread. Everything the pages need ships in ``static/``; nothing is fetched from the network, so
screenshots depend only on the browser build and the installed system fonts.
"""

from __future__ import annotations

import json
import threading
import time
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path

from hivig.logging import get_logger

logger = get_logger(__name__)

PAGES = ("index.html", "items.html", "form.html", "reports.html")
"""The application's pages, in navigation order."""

REPORT_ROWS = (("Q1", "$3.1M"), ("Q2", "$3.6M"), ("Q3", "$4.2M"), ("Q4", "$4.8M"))
"""What the slow report panel shows once loaded."""

DEFAULT_SLOW_SECONDS = 2.0
"""How long ``/api/report`` takes to answer: the spinner stays up this long."""


def static_dir() -> Path:
    """The folder holding the application's HTML, CSS and JS (package data)."""
    return Path(str(resources.files(__package__).joinpath("static")))


class _Handler(SimpleHTTPRequestHandler):
    """Static files plus the one slow JSON endpoint; never cached, logged at debug level."""

    def __init__(self, *args, slow_seconds: float, **kwargs) -> None:
        self._slow_seconds = slow_seconds
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] == "/api/report":
            self._report()
            return
        super().do_GET()

    def _report(self) -> None:
        # A real wait on the server side: the page cannot shortcut it, as with a slow backend.
        time.sleep(self._slow_seconds)
        body = json.dumps({"rows": [list(r) for r in REPORT_ROWS]}).encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # The tab went away while waiting (an episode reset): nobody needs the answer.
            logger.debug("webenv: report client disconnected")

    def end_headers(self) -> None:
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (base-class signature)
        logger.debug("webenv %s " + format, self.address_string(), *args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # Browsers drop connections at will (tab closed, navigation); never print tracebacks.
        logger.debug("webenv: request from %s failed", client_address, exc_info=True)


class WebApp:
    """The test application served on ``127.0.0.1``.

    Use as a context manager or call ``start``/``close``::

        with WebApp() as app:
            page_url = app.url("form.html")

    Args:
        port: TCP port; 0 picks a free one.
        slow_seconds: Delay of the report endpoint behind the spinner panel.
    """

    def __init__(self, port: int = 0, slow_seconds: float = DEFAULT_SLOW_SECONDS) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        if slow_seconds < 0:
            raise ValueError(f"slow_seconds must be >= 0, got {slow_seconds}")
        self._port = port
        self.slow_seconds = slow_seconds
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> WebApp:
        """Bind and serve in a daemon thread; returns ``self``. Idempotent."""
        if self._server is not None:
            return self
        handler = partial(_Handler, directory=str(static_dir()), slow_seconds=self.slow_seconds)
        server = _Server(("127.0.0.1", self._port), handler)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, name="hivig-webenv", daemon=True
        )
        self._thread.start()
        logger.debug("webenv serving %s", self.base_url)
        return self

    @property
    def port(self) -> int:
        """The bound port (after ``start``)."""
        if self._server is None:
            raise RuntimeError("WebApp is not started; call start() first")
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/`` (after ``start``)."""
        return f"http://127.0.0.1:{self.port}/"

    def url(self, page: str = "index.html") -> str:
        """Absolute URL of one page of the application."""
        return self.base_url + page.lstrip("/")

    def close(self) -> None:
        """Stop serving and free the port. Idempotent."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> WebApp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
