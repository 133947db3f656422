"""The gateway's machine-readable errors: an HTTP status, a stable code and a message.

Every 4xx/5xx body is ``{"error": {"code": ..., "message": ...}}`` so a runner can branch on the
code (``bad_image``, ``unknown_session``, ``step_conflict`` ...) without parsing prose.
"""

from __future__ import annotations


class ApiError(Exception):
    """A request the gateway refuses, with the status and code it answers with."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        """An error answered as ``status`` with body ``{"error": {"code", "message"}}``."""
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}

    def body(self) -> dict[str, dict[str, str]]:
        """The JSON body."""
        return {"error": {"code": self.code, "message": self.message}}


class StorageError(Exception):
    """The gateway's own storage failed (read-only, full, an I/O error, a corrupt file).

    Answered as ``503 storage_unavailable`` with ``Retry-After``: the request did not take
    effect, and the same request later may succeed. The message names no server path.
    """
