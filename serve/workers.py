"""Several gateway processes on one node: ``python -m serve workers=N``.

uvicorn's supervisor starts N processes that share the listening socket; each builds its own
app from the resolved config the parent wrote under ``sessions.state_dir``. They share the
SQLite session store, the screenshots and the traces; a session's requests are ordered across
processes by its lock file (``serve.gateway``), so retries stay idempotent whichever process
answers. Caches, the model-call queue and ``/metrics`` are per process.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from fastapi import FastAPI

from hivig.config import config_to_yaml, load_config
from hivig.files import write_atomic
from serve.config import ServeConfig
from serve.server import GATEWAY_LOOP, http_protocol

CONFIG_ENV = "HIVIG_SERVE_WORKER_CONFIG"
"""Where a worker finds the resolved config (set by ``run`` before the workers start)."""


def app() -> FastAPI:
    """The app of one worker process (uvicorn's factory).

    A mistake in the config ends the worker with uvicorn's start-up failure status, so the
    supervisor stops instead of restarting it for ever.
    """
    from hivig.config import ConfigError
    from serve.app import create_app

    try:
        return create_app(_config())
    except ConfigError as e:
        logging.getLogger("serve").error("error: %s", e)
        sys.exit(_STARTUP_FAILURE)


_STARTUP_FAILURE = 3
"""uvicorn's exit status for a worker that could not start (its supervisor then stops)."""


def _config() -> ServeConfig:
    return load_config(ServeConfig, os.environ[CONFIG_ENV], [])


def _header_timeout() -> float:
    try:
        return float(os.environ.get("HIVIG_SERVE_HEADER_TIMEOUT_S", "10"))
    except ValueError:
        return 10.0  # ``run`` sets it from the validated config before any worker starts


class WorkerHTTP(http_protocol(_header_timeout())):
    """The head-timeout protocol by import path (workers cannot be handed a class object)."""


def run(cfg: ServeConfig) -> None:
    """Serve ``cfg`` with ``cfg.workers`` processes until stopped."""
    import uvicorn

    resolved = Path(cfg.sessions.state_dir) / ".gateway-config.yaml"
    write_atomic(resolved, config_to_yaml(cfg))
    os.environ[CONFIG_ENV] = str(resolved)
    os.environ["HIVIG_SERVE_HEADER_TIMEOUT_S"] = str(cfg.limits.header_timeout_s)
    uvicorn.run(
        "serve.workers:app",
        factory=True,
        workers=cfg.workers,
        host=cfg.host,
        port=cfg.port,
        log_level=cfg.log_level,
        timeout_graceful_shutdown=int(cfg.graceful_timeout_s),
        http="serve.workers:WorkerHTTP",
        loop=GATEWAY_LOOP,
    )
