"""Several gateway processes on one node: ``python -m serve workers=N``.

uvicorn's supervisor starts N processes that share the listening socket; each builds its own
app from the resolved config the parent wrote under ``sessions.state_dir``. They share the
SQLite session store, the screenshots and the traces; a session's requests are ordered across
processes by its lock file (``serve.gateway``), so retries stay idempotent whichever process
answers. Caches, the model-call queue and ``/metrics`` are per process.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI

from hivig.config import config_to_yaml, load_config
from serve.config import ServeConfig
from serve.server import http_protocol

CONFIG_ENV = "HIVIG_SERVE_WORKER_CONFIG"
"""Where a worker finds the resolved config (set by ``run`` before the workers start)."""


def app() -> FastAPI:
    """The app of one worker process (uvicorn's factory)."""
    from serve.app import create_app

    return create_app(_config())


def _config() -> ServeConfig:
    return load_config(ServeConfig, os.environ[CONFIG_ENV], [])


class WorkerHTTP(http_protocol(float(os.environ.get("HIVIG_SERVE_HEADER_TIMEOUT_S", "10")))):
    """The head-timeout protocol by import path (workers cannot be handed a class object)."""


def run(cfg: ServeConfig) -> None:
    """Serve ``cfg`` with ``cfg.workers`` processes until stopped."""
    import uvicorn

    resolved = Path(cfg.sessions.state_dir) / ".gateway-config.yaml"
    resolved.write_text(config_to_yaml(cfg), encoding="utf-8")
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
    )
