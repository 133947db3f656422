"""The gateway's JSON answers: orjson-rendered, and the one error shape."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse as _StarletteJSONResponse

from hivig import jsonio


class JSONResponse(_StarletteJSONResponse):
    """A JSON response rendered by orjson (compact UTF-8, as Starlette's but faster)."""

    def render(self, content: Any) -> bytes:
        return jsonio.dumps(content)


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """``{"error": {"code", "message"}}``, the shape of every failure."""
    return JSONResponse({"error": {"code": code, "message": message}}, status, headers=headers)
