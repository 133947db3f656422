"""Operations: liveness, readiness, Prometheus metrics and the gateway's capabilities."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hivig.actions import PLATFORM_ALIASES
from hivig.taxonomy import DIMENSIONS
from serve.config import ACTION_FORMATS, COORD_SPACES, ServeConfig
from serve.respond import JSONResponse
from serve.routes._common import gateway

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 once the warm-up went through the backend and while it keeps answering."""
    ready = getattr(request.app.state, "ready", False)
    detail = getattr(request.app.state, "ready_detail", "starting")
    critic = gateway(request).critic if ready else None
    if critic is not None and critic.health.failing():
        ready = False
        health = critic.health
        detail = f"backend failing: {health.failures} calls in a row ({health.last_reason})"
    elif critic is not None and critic.gate.stuck():
        ready = False
        detail = "every model call place is held by a call past its deadline"
    return JSONResponse({"ready": ready, "detail": detail}, 200 if ready else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics."""
    return Response(
        generate_latest(gateway(request).metrics.registry), media_type=CONTENT_TYPE_LATEST
    )


@router.get("/v1/info")
async def info(request: Request) -> dict[str, Any]:
    """Versions, frame, accepted spaces and formats, limits, deadlines and the taxonomy."""
    cfg: ServeConfig = request.app.state.config
    critic = gateway(request).critic
    return {
        **gateway(request).versions(),
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
            "observe": critic.budget.observe_deadline_s,
            "critique": critic.budget.critique_deadline_s,
        },
        "profile": critic.profile_info(),
        "taxonomy": [d.name for d in DIMENSIONS],
    }
