"""Serve the test web application alone: ``python -m serve.webenv [--port N]``."""

from __future__ import annotations

import argparse
import sys
import time

from serve.webenv._app import DEFAULT_SLOW_SECONDS, WebApp


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m serve.webenv", description=__doc__)
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: a free one)")
    parser.add_argument(
        "--slow-seconds",
        type=float,
        default=DEFAULT_SLOW_SECONDS,
        help="delay of the report panel behind the spinner",
    )
    args = parser.parse_args(argv)
    if args.slow_seconds < 0:
        parser.exit(2, "error: --slow-seconds must be >= 0\n")
    if not 0 <= args.port <= 65535:
        parser.exit(2, f"error: --port must be in 0..65535, got {args.port}\n")
    try:
        app = WebApp(port=args.port, slow_seconds=args.slow_seconds).start()
    except OSError as e:
        parser.exit(
            2,
            f"error: cannot listen on 127.0.0.1:{args.port} ({e.strerror}); pick another --port\n",
        )
    print(f"serving {app.base_url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
