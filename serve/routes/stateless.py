"""``/v1/observe`` and ``/v1/critique``: the caller keeps the history, nothing is stored."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request

from serve.protocol import (
    CritiqueAnswer,
    CritiqueStateless,
    ObserveAnswer,
    ObserveStateless,
    RankedAnswer,
)
from serve.respond import JSONResponse
from serve.routes._common import ERRORS, body, gateway, openapi_body, timed

router = APIRouter(prefix="/v1", tags=["stateless"], responses=ERRORS)


@router.post(
    "/observe",
    responses={200: {"model": ObserveAnswer}},
    openapi_extra=openapi_body(ObserveStateless),
)
async def observe_stateless(
    request: Request, req: Annotated[ObserveStateless, body(ObserveStateless)]
) -> JSONResponse:
    """A history update from the caller's previous summary and the two screens."""
    work = gateway(request).steps.observe_stateless(req)
    return await timed("observe_stateless", request, work)


@router.post(
    "/critique",
    responses={200: {"model": CritiqueAnswer | RankedAnswer}},
    openapi_extra=openapi_body(CritiqueStateless),
)
async def critique_stateless(
    request: Request, req: Annotated[CritiqueStateless, body(CritiqueStateless)]
) -> JSONResponse:
    """A verdict from the caller's executed trajectory and the current screen."""
    work = gateway(request).steps.critique_stateless(req)
    return await timed("critique_stateless", request, work)
