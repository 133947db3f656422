"""The FastAPI app of the critic gateway: ``create_app(config, backend)``.

Routes validate their body and hand it to ``serve.gateway.Gateway``. The backend is created in
the lifespan hook (never at import), or injected, which is how tests use a stub::

    app = create_app(load_config(ServeConfig, "configs/serve/local.yaml"), backend=None)
    uvicorn.run(app, host="127.0.0.1", port=8080)
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse as _StarletteJSONResponse
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from hivig import jsonio
from hivig.actions import PLATFORM_ALIASES
from hivig.backends import InferenceBackend, build_backend
from hivig.checkpoint_files import CheckpointError, read_frame
from hivig.config import ConfigError, FrameConfig
from hivig.prompts import CRITIC_PROMPTS, load_prompt_dir
from hivig.taxonomy import DIMENSIONS
from serve.config import ACTION_FORMATS, COORD_SPACES, ServeConfig
from serve.errors import ApiError
from serve.gateway import SCHEMA_VERSION, Gateway

logger = logging.getLogger(__name__)

_OPEN_PATHS = ("/healthz", "/readyz", "/metrics", "/docs", "/openapi.json")


class JSONResponse(_StarletteJSONResponse):
    """A JSON response rendered by orjson (compact UTF-8, as Starlette's but faster)."""

    def render(self, content: Any) -> bytes:
        return jsonio.dumps(content)


def checkpoint_frame(path: str) -> FrameConfig:
    """The pixel budget a checkpoint's processor was saved with (the frame it was trained on).

    Raises:
        ConfigError: The folder records no frame (serving it on a guessed one would show the
            model screens at a size it never saw).
    """
    try:
        lo, hi = read_frame(path)
    except CheckpointError as e:
        raise ConfigError(f"backend.model: {e}") from e
    return FrameConfig(min_pixels=lo, max_pixels=hi)


def model_version(cfg: ServeConfig, backend: InferenceBackend) -> str:
    """What ``model_version`` reports: the backend's model name, else the configured one."""
    return str(getattr(backend, "model_name", "") or getattr(backend, "model", "") or cfg.model)


def create_app(cfg: ServeConfig, backend: InferenceBackend | None = None) -> FastAPI:
    """Build the gateway app.

    Args:
        cfg: The resolved config.
        backend: A backend to use as is (tests, embedding); ``None`` builds the one ``cfg.backend``
            describes in the lifespan hook.

    Returns:
        The FastAPI application (``app.state.gateway`` once started).
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        chosen = backend
        if cfg.backend.kind == "transformers" and cfg.backend.model:
            cfg.frame = checkpoint_frame(cfg.backend.model)
        if chosen is None:
            chosen = await asyncio.to_thread(build_backend, cfg.backend, frame=cfg.frame)
        gateway = Gateway(cfg, chosen, model_version(cfg, chosen))
        app.state.gateway = gateway
        app.state.ready = not cfg.warmup
        app.state.ready_detail = "warming up" if cfg.warmup else "ready"
        tasks = [asyncio.create_task(_expire_loop(gateway))]
        if cfg.warmup:
            tasks.append(asyncio.create_task(_warm_up(app, gateway)))
        logger.info(
            "gateway on %s (model %s, frame %s)", cfg.backend.kind, gateway.model_version, cfg.frame
        )
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            aclose = getattr(chosen, "aclose", None)
            if backend is None and aclose is not None:
                await aclose()
            gateway.close()

    if cfg.critic.prompt_dir:
        load_prompt_dir(cfg.critic.prompt_dir, CRITIC_PROMPTS)  # a bad profile fails before serving
    app = FastAPI(title="hivig critic gateway", version=SCHEMA_VERSION, lifespan=lifespan)
    token = os.environ.get(cfg.auth_token_env, "") if cfg.auth_token_env else ""
    _add_middleware(app, cfg, token)
    _add_routes(app, cfg)
    return app


# ---------------------------------------------------------------------------------------------
# Middleware: size limit, auth, errors


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
"""Error codes of the answers Starlette gives before any route runs."""


def _error(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers=headers)


class _Guard:
    """Body-size limit and bearer auth before any route runs.

    Plain ASGI rather than ``@app.middleware("http")``: Starlette's ``BaseHTTPMiddleware`` runs
    every request in a task group of its own and streams the response through a queue, which
    cost more per request than the session store.
    """

    def __init__(self, app: ASGIApp, *, max_body: int, token: str) -> None:
        self.app = app
        self.max_body = max_body
        self.expected = f"Bearer {token}".encode() if token else b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            rejected = self._reject(scope)
            if rejected is not None:
                await rejected(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _reject(self, scope: Scope) -> JSONResponse | None:
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            return _error(413, "image_too_large", f"body over {self.max_body} bytes")
        if self.expected and not scope["path"].startswith(_OPEN_PATHS):
            given = headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, self.expected):
                return _error(401, "unauthorized", "missing or wrong bearer token")
        return None


def _add_middleware(app: FastAPI, cfg: ServeConfig, token: str) -> None:
    app.add_middleware(_Guard, max_body=cfg.limits.max_body_bytes, token=token)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # A bug must still answer in the documented shape (runners branch on the code).
        logger.error("unhandled error on %s", request.url.path, exc_info=exc)
        gateway = getattr(request.app.state, "gateway", None)
        if gateway is not None:
            gateway.metrics.errors.labels("internal").inc()
        return _error(500, "internal", f"{type(exc).__name__}: the gateway failed on this request")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own answers (an unknown route, a wrong method) in the documented shape,
        # not {"detail": ...}.
        code = _HTTP_CODES.get(exc.status_code, "bad_request")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return _error(exc.status_code, code, message, getattr(exc, "headers", None))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        gateway = getattr(request.app.state, "gateway", None)
        if gateway is not None:
            gateway.metrics.errors.labels(exc.code).inc()
        return _error(exc.status, exc.code, exc.message, exc.headers)


async def _body(request: Request, limit: int) -> dict[str, Any]:
    """The JSON object of a request, read with the size limit (chunked bodies too)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, "image_too_large", f"body over {limit} bytes")
        chunks.append(chunk)
    try:
        # Strict: ``NaN``, ``Infinity`` and overflowing numbers are not JSON, so no coordinate
        # can be one. A UTF-8 byte-order mark (some Windows clients send one) is dropped.
        body = jsonio.loads(b"".join(chunks).removeprefix(_BOM) or b"{}")
    except jsonio.JSONDecodeError as e:
        raise ApiError(422, "bad_request", f"body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(422, "bad_request", "body must be a JSON object")
    if _too_deep(body, _MAX_DEPTH):
        # Anything the gateway keeps is written back as JSON, which allows less nesting than
        # it reads; no request field needs more than a few levels.
        raise ApiError(422, "bad_request", f"body nests deeper than {_MAX_DEPTH} levels")
    return body


_BOM = b"\xef\xbb\xbf"
_MAX_DEPTH = 32


def _too_deep(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests lists and objects deeper than ``limit``."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


# ---------------------------------------------------------------------------------------------
# Routes


def _add_routes(app: FastAPI, cfg: ServeConfig) -> None:
    limit = cfg.limits.max_body_bytes

    def gw(request: Request) -> Gateway:
        return request.app.state.gateway

    async def timed(
        route: str, request: Request, work: Awaitable[dict[str, Any]], status: int = 200
    ) -> JSONResponse:
        start = time.perf_counter()
        try:
            out = await work
        finally:
            gw(request).metrics.latency.labels(route).observe(time.perf_counter() - start)
        return JSONResponse(out, status)

    @app.post("/v1/sessions", status_code=201)
    async def create_session(request: Request) -> JSONResponse:
        body = await _body(request, limit)
        return JSONResponse(gw(request).create(body), 201)

    @app.post("/v1/sessions/{sid}/observe")
    async def observe(sid: str, request: Request) -> JSONResponse:
        body = await _body(request, limit)
        return await timed("observe", request, gw(request).observe(sid, body))

    @app.post("/v1/sessions/{sid}/critique")
    async def critique(sid: str, request: Request) -> JSONResponse:
        body = await _body(request, limit)
        return await timed("critique", request, gw(request).critique(sid, body))

    @app.get("/v1/sessions/{sid}")
    async def get_session(sid: str, request: Request) -> JSONResponse:
        return JSONResponse(gw(request).get(sid))

    @app.delete("/v1/sessions/{sid}")
    async def close_session(sid: str, request: Request) -> JSONResponse:
        return JSONResponse(await gw(request).close_session(sid))

    @app.post("/v1/observe")
    async def observe_stateless(request: Request) -> JSONResponse:
        body = await _body(request, limit)
        return await timed("observe_stateless", request, gw(request).observe_stateless(body))

    @app.post("/v1/critique")
    async def critique_stateless(request: Request) -> JSONResponse:
        body = await _body(request, limit)
        return await timed("critique_stateless", request, gw(request).critique_stateless(body))

    @app.post("/v1/images", status_code=201)
    async def upload(request: Request) -> JSONResponse:
        body = await _body(request, limit)
        return JSONResponse(await gw(request).upload(body), 201)

    @app.post("/v1/diagnose", status_code=202)
    async def diagnose(request: Request) -> JSONResponse:
        body = await _body(request, limit)
        return JSONResponse(gw(request).start_diagnosis(body), 202)

    @app.get("/v1/jobs/{job_id}")
    async def job(job_id: str, request: Request) -> JSONResponse:
        return JSONResponse(gw(request).job(job_id))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        ready = getattr(request.app.state, "ready", False)
        detail = getattr(request.app.state, "ready_detail", "starting")
        return JSONResponse({"ready": ready, "detail": detail}, 200 if ready else 503)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(
            generate_latest(gw(request).metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    @app.get("/v1/info")
    async def info(request: Request) -> dict[str, Any]:
        g = gw(request)
        return {
            **g.versions(),
            "backend": cfg.backend.kind,
            "frame": {
                "min_pixels": cfg.frame.min_pixels,
                "max_pixels": cfg.frame.max_pixels,
                "factor": cfg.frame.factor,
            },
            "coord_spaces": list(COORD_SPACES),
            "action_formats": list(ACTION_FORMATS),
            "platforms": sorted(PLATFORM_ALIASES),
            "limits": {
                "max_body_bytes": cfg.limits.max_body_bytes,
                "max_image_bytes": cfg.limits.max_image_bytes,
                "max_candidates": cfg.limits.max_candidates,
                "max_queue": cfg.limits.max_queue,
            },
            "deadlines_s": {
                "observe": cfg.critic.observe_deadline_s,
                "critique": cfg.critic.critique_deadline_s,
            },
            "taxonomy": [d.name for d in DIMENSIONS],
        }


# ---------------------------------------------------------------------------------------------
# Background work


async def _expire_loop(gateway: Gateway, every_s: float = 60.0) -> None:
    while True:
        await asyncio.sleep(every_s)
        try:
            gateway.expire()
        except Exception:  # a failed sweep must not end the loop; the next one retries
            logger.exception("session expiry sweep failed")


async def _warm_up(app: FastAPI, gateway: Gateway, retry_s: float = 10.0) -> None:
    """One history update and one verdict through the real parser before ``/readyz`` is green.

    Retried until it works: a backend still loading (vLLM compiling its graphs) is not an error.
    """
    while True:
        try:
            app.state.ready_detail = await gateway.warm_up()
            app.state.ready = True
            return
        except Exception as e:  # readiness stays red and says why; liveness is unaffected
            logger.warning("warm-up failed (retrying in %.0f s): %s", retry_s, e, exc_info=True)
            app.state.ready_detail = f"warm-up failed: {e}"
        await asyncio.sleep(retry_s)
