"""What every route shares: the strict JSON body reader, the gateway, latency timing.

A route parses its body (``body``), calls one service method of the gateway and dumps the
answer object it gets (``serve.respond.answer_response``); it decides nothing itself.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Depends, Request
from pydantic import BaseModel, ValidationError

from hivig import jsonio
from serve.errors import ApiError
from serve.gateway import Gateway
from serve.protocol import ErrorAnswer, error_of
from serve.respond import JSONResponse, answer_response

M = TypeVar("M", bound=BaseModel)

_BOM = b"\xef\xbb\xbf"
MAX_DEPTH = 32
"""Deepest nesting of lists and objects a body may have."""

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorAnswer} for status in (400, 401, 404, 409, 413, 415, 422, 429, 503)
}
"""The error answers every ``/v1`` route documents (one shape for all)."""


def gateway(request: Request) -> Gateway:
    return request.app.state.gateway


async def read_json(request: Request, limit: int) -> dict[str, Any]:
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
    if too_deep(body, MAX_DEPTH):
        # Anything the gateway keeps is written back as JSON, which allows less nesting than
        # it reads; no request field needs more than a few levels.
        raise ApiError(422, "bad_request", f"body nests deeper than {MAX_DEPTH} levels")
    return body


def too_deep(value: Any, limit: int) -> bool:
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


def body(model: type[M]) -> Any:
    """A dependency giving the request body validated into ``model`` (422 in the error shape).

    The body is read here rather than by FastAPI so that the size limit holds for chunked
    uploads and the JSON is parsed strictly; ``openapi_body`` documents it.
    """

    async def read(request: Request) -> M:
        raw = await read_json(request, request.app.state.config.limits.max_body_bytes)
        try:
            return model.model_validate(raw)
        except ValidationError as e:
            code, message = error_of(e)
            raise ApiError(422, code, message) from None

    return Depends(read)


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """The ``openapi_extra`` of a route whose body ``body(model)`` reads."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


async def timed(
    route: str, request: Request, work: Awaitable[BaseModel], status: int = 200
) -> JSONResponse:
    """Answer with ``work``'s answer object, its latency observed under ``route``."""
    start = time.perf_counter()
    try:
        out = await work
    finally:
        gateway(request).metrics.latency.labels(route).observe(time.perf_counter() - start)
    return answer_response(out, status)
