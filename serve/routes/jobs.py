"""``/v1/diagnose`` and ``/v1/jobs``: root-cause analysis as a background job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request

from serve.protocol import DiagnoseRequest, JobAnswer
from serve.respond import JSONResponse, answer_response
from serve.routes._common import ERRORS, body, gateway, openapi_body

router = APIRouter(prefix="/v1", tags=["diagnosis"], responses=ERRORS)


@router.post(
    "/diagnose",
    status_code=202,
    responses={202: {"model": JobAnswer}},
    openapi_extra=openapi_body(DiagnoseRequest),
)
async def diagnose(
    request: Request, req: Annotated[DiagnoseRequest, body(DiagnoseRequest)]
) -> JSONResponse:
    """Start a diagnosis of a session's trace or of a result folder under the allowed roots."""
    return answer_response(gateway(request).diagnoses.start(req), 202)


@router.get("/jobs/{job_id}", responses={200: {"model": JobAnswer}})
async def job(job_id: str, request: Request) -> JSONResponse:
    """A job's status, and its result once done."""
    return answer_response(gateway(request).diagnoses.get(job_id))
