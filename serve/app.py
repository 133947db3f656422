"""The FastAPI app of the critic gateway: ``create_app(config, backend)``.

The routes (``serve.routes``, one router per resource) validate their body into a
``serve.protocol`` model, call one service of ``serve.gateway.Gateway`` and dump its answer.
The backend is created in the lifespan hook (never at import), or injected, which is how tests
use a stub::

    app = create_app(load_config(ServeConfig, "configs/serve/local.yaml"), backend=None)
    uvicorn.run(app, host="127.0.0.1", port=8080)
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hivig.backends import InferenceBackend, backend_model_name, build_backend, close_backend
from hivig.checkpoint_files import CheckpointError, read_frame
from hivig.config import ConfigError, FrameConfig
from hivig.profiles import ProfileError, load_profile
from hivig.prompts import CRITIC_PROMPTS, load_prompt_dir
from hivig.vision import resize_kernel
from serve import protocol
from serve.config import ServeConfig
from serve.errors import ApiError, StorageError
from serve.gateway import SCHEMA_VERSION, Gateway
from serve.respond import JSONResponse, error_response
from serve.routes import ROUTERS

logger = logging.getLogger(__name__)

_OPEN_PATHS = ("/healthz", "/readyz", "/metrics", "/docs", "/openapi.json")

_REQUEST_MODELS = (
    protocol.SessionCreate,
    protocol.Observe,
    protocol.Critique,
    protocol.ObserveStateless,
    protocol.CritiqueStateless,
    protocol.ImageUpload,
    protocol.DiagnoseRequest,
)
"""The bodies ``serve.routes._common.body`` reads (FastAPI does not see them to document them)."""


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
    return backend_model_name(backend) or cfg.model


def _profile_template(cfg: ServeConfig) -> str | None:
    """The served profile's chat template for an in-process model; ``None`` for hivig's own
    (the checkpoint's template then stands, as training saved it)."""
    if not cfg.critic.profile:
        return None
    profile = load_profile(cfg.critic.profile)
    return None if profile.is_default else profile.chat_template


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
            chosen = await asyncio.to_thread(
                build_backend, cfg.backend, frame=cfg.frame, chat_template=_profile_template(cfg)
            )
        gateway = Gateway(cfg, chosen, model_version(cfg, chosen))
        app.state.gateway = gateway
        app.state.ready = not cfg.warmup
        app.state.ready_detail = "warming up" if cfg.warmup else "ready"
        tasks = [asyncio.create_task(_sweep_loop(gateway, cfg.retention.sweep_every_s))]
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
            gateway.stop_sweeps()
            if backend is None:
                await close_backend(chosen)
            gateway.close()

    if cfg.critic.prompt_dir:
        load_prompt_dir(cfg.critic.prompt_dir, CRITIC_PROMPTS)  # a bad profile fails before serving
    if cfg.critic.profile:
        try:
            load_profile(cfg.critic.profile)
        except ProfileError as e:
            raise ConfigError(f"critic.profile: {e}") from None
    try:
        resize_kernel()  # a misspelt HIVIG_RESIZE_KERNEL fails here, not in the first request
    except ValueError as e:
        raise ConfigError(str(e)) from None
    # No trailing-slash redirects: Starlette builds their Location from the request's Host
    # header, so any client could make the gateway point elsewhere; ``/v1/info/`` is a 404.
    app = FastAPI(
        title="hivig critic gateway",
        version=SCHEMA_VERSION,
        lifespan=lifespan,
        redirect_slashes=False,
    )
    app.state.config = cfg
    token = os.environ.get(cfg.auth_token_env, "") if cfg.auth_token_env else ""
    _add_middleware(app, cfg, token)
    for router in ROUTERS:
        app.include_router(router)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with the request bodies the routes read themselves."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        _, defs = models_json_schema(
            [(m, "validation") for m in _REQUEST_MODELS],
            ref_template="#/components/schemas/{model}",
        )
        doc.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
        app.openapi_schema = doc
    return app.openapi_schema


# ---------------------------------------------------------------------------------------------
# Middleware: size limit, auth, errors


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
"""Error codes of the answers Starlette gives before any route runs."""


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
            return error_response(413, "image_too_large", f"body over {self.max_body} bytes")
        if self.expected and not scope["path"].startswith(_OPEN_PATHS):
            given = headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, self.expected):
                return error_response(401, "unauthorized", "missing or wrong bearer token")
        return None


class _Contain:
    """A bug's exception ends in a 500 here, inside the app, and goes no further.

    Starlette's outermost middleware answers an unhandled exception and then raises it again
    for the server to log, and uvicorn closes the connection on any exception: the client's
    next request on that kept-alive connection met a reset. Caught here, the 500 is answered
    in the documented shape and the connection stays open.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started:  # half an answer is out: only closing the connection ends it
                raise
            # A bug must still answer in the documented shape (runners branch on the code).
            logger.error("unhandled error on %s", scope.get("path", ""), exc_info=exc)
            gateway = getattr(scope["app"].state, "gateway", None) if "app" in scope else None
            if gateway is not None:
                gateway.metrics.errors.labels("internal").inc()
            message = f"{type(exc).__name__}: the gateway failed on this request"
            await error_response(500, "internal", message)(scope, receive, send)


def _add_middleware(app: FastAPI, cfg: ServeConfig, token: str) -> None:
    app.add_middleware(_Guard, max_body=cfg.limits.max_body_bytes, token=token)
    app.add_middleware(_Contain)  # added last: the outermost of ours

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
        # The client hung up mid-body, or the server cut a late body (408 sent already): not a
        # bug, and nobody to answer (what is sent here is dropped).
        logger.debug("client gone before its body was in on %s", request.url.path)
        return error_response(400, "bad_request", "request body not received")

    @app.exception_handler(StarletteHTTPException)
    async def httperror_response(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's own answers (an unknown route, a wrong method) in the documented shape,
        # not {"detail": ...}.
        code = _HTTP_CODES.get(exc.status_code, "bad_request")
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return error_response(exc.status_code, code, message, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Path and query parameters (bodies are validated by serve.routes into ApiError).
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"])
        return error_response(422, "bad_request", f"`{where}`: {first['msg']}")

    @app.exception_handler(StorageError)
    async def storageerror_response(request: Request, exc: StorageError) -> JSONResponse:
        # The disk, not the request or a bug: nothing of the request took effect, so the runner
        # may send it again (its client retries a 503 after Retry-After).
        logger.warning("storage unavailable on %s: %s", request.url.path, exc)
        gateway = getattr(request.app.state, "gateway", None)
        if gateway is not None:
            gateway.metrics.errors.labels("storage_unavailable").inc()
        retry = {"Retry-After": str(cfg.limits.retry_after_s)}
        return error_response(503, "storage_unavailable", f"{exc}; retry later", retry)

    @app.exception_handler(ApiError)
    async def apierror_response(request: Request, exc: ApiError) -> JSONResponse:
        gateway = getattr(request.app.state, "gateway", None)
        if gateway is not None:
            gateway.metrics.errors.labels(exc.code).inc()
        return error_response(exc.status, exc.code, exc.message, exc.headers)


# ---------------------------------------------------------------------------------------------
# Background work


async def _sweep_loop(gateway: Gateway, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        try:
            await gateway.sweep()  # off the event loop: requests are answered meanwhile
        except StorageError as e:  # the disk, not a bug: one line, and the next sweep retries
            logger.warning("session expiry sweep failed: %s", e)
        except Exception:  # a failed sweep must not end the loop; the next one retries
            logger.exception("session expiry sweep failed")


async def _warm_up(app: FastAPI, gateway: Gateway, retry_s: float = 10.0) -> None:
    """One history update and one verdict through the real parser before ``/readyz`` is green.

    Retried until it works: a backend still loading (vLLM compiling its graphs) is not an error.
    """
    while True:
        try:
            app.state.ready_detail = await gateway.steps.warm_up()
            app.state.ready = True
            return
        except Exception as e:  # readiness stays red and says why; liveness is unaffected
            logger.warning("warm-up failed (retrying in %.0f s): %s", retry_s, e, exc_info=True)
            app.state.ready_detail = f"warm-up failed: {e}"
        await asyncio.sleep(retry_s)
