"""The gateway's JSON answers: orjson-rendered answer objects, and the one error shape."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse as _StarletteJSONResponse
from pydantic import BaseModel

from hivig import jsonio
from serve.protocol import dump_answer


class JSONResponse(_StarletteJSONResponse):
    """A JSON response rendered by orjson (compact UTF-8, as Starlette's but faster)."""

    def render(self, content: Any) -> bytes:
        return jsonio.dumps(content)


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """``{"error": {"code", "message"}}``, the shape of every failure."""
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers=headers)


def answer_response(answer: BaseModel, status: int = 200) -> JSONResponse:
    """An answer object (``serve.protocol``) as its JSON response."""
    return JSONResponse(dump_answer(answer), status)
