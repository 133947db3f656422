"""``/v1/images``: upload a screenshot once, refer to it by ``image_ref`` after."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request

from serve.protocol import ImageStored, ImageUpload
from serve.respond import JSONResponse, answer_response
from serve.routes._common import ERRORS, body, gateway, openapi_body

router = APIRouter(prefix="/v1/images", tags=["images"], responses=ERRORS)


@router.post(
    "",
    status_code=201,
    responses={201: {"model": ImageStored}},
    openapi_extra=openapi_body(ImageUpload),
)
async def upload(request: Request, req: Annotated[ImageUpload, body(ImageUpload)]) -> JSONResponse:
    """Store a screenshot; its reference names the frame the critic sees (``serve.images``)."""
    return answer_response(await gateway(request).uploads.upload(req), 201)
