"""``/v1/sessions``: open, observe, critique, inspect and close an episode."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Request

from serve.protocol import (
    Critique,
    CritiqueAnswer,
    Observe,
    ObserveAnswer,
    RankedAnswer,
    SessionClosed,
    SessionCreate,
    SessionCreated,
    SessionInfo,
)
from serve.respond import JSONResponse, answer_response
from serve.routes._common import ERRORS, body, gateway, openapi_body, timed

router = APIRouter(prefix="/v1/sessions", tags=["sessions"], responses=ERRORS)


@router.post(
    "",
    status_code=201,
    responses={201: {"model": SessionCreated}},
    openapi_extra=openapi_body(SessionCreate),
)
async def create_session(
    request: Request, req: Annotated[SessionCreate, body(SessionCreate)]
) -> JSONResponse:
    """Start an episode, or re-create a lost one from its ``echo``."""
    return answer_response(gateway(request).sessions.create(req), 201)


@router.post(
    "/{sid}/observe",
    responses={200: {"model": ObserveAnswer}},
    openapi_extra=openapi_body(Observe),
)
async def observe(
    sid: str, request: Request, req: Annotated[Observe, body(Observe)]
) -> JSONResponse:
    """The executed step and the screen after it: the history update."""
    return await timed("observe", request, gateway(request).steps.observe(sid, req))


@router.post(
    "/{sid}/critique",
    responses={200: {"model": CritiqueAnswer | RankedAnswer}},
    openapi_extra=openapi_body(Critique),
)
async def critique(
    sid: str, request: Request, req: Annotated[Critique, body(Critique)]
) -> JSONResponse:
    """The verdict on a proposed action (``action``), or ranked verdicts (``candidates``)."""
    return await timed("critique", request, gateway(request).steps.critique(sid, req))


@router.get("/{sid}", responses={200: {"model": SessionInfo}})
async def get_session(sid: str, request: Request) -> JSONResponse:
    """The session's step and echo."""
    return answer_response(gateway(request).sessions.get(sid))


@router.delete("/{sid}", responses={200: {"model": SessionClosed}})
async def close_session(
    sid: str, request: Request, outcome: Literal["success", "failure"] | None = None
) -> JSONResponse:
    """Close the session (sessions also expire after ``sessions.ttl_s`` idle).

    ``?outcome=success|failure``: the task's evaluated outcome, as the runner's evaluator scored
    it; recorded on the trace's close event (``data_gen ingest-runs --format trace`` reads it).
    """
    return answer_response(await gateway(request).sessions.close(sid, outcome))
