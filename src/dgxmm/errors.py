"""Errors with a stable code, an HTTP status and a message meant for the person who sees it, and
the one error envelope every answer of dgxmm uses (admin API and on-demand gateway alike):
``{"error": {"message", "type", "code"}}`` (plus ``field`` for input errors), OpenAI-style."""

from __future__ import annotations

from typing import Any

# The OpenAI-style ``type`` of each status; any other 5xx is ``server_error``, any other 4xx
# ``invalid_request_error``.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """The error envelope: ``{"error": {"message", "type", "code"[, "field"]}}``."""
    error: dict[str, Any] = {"message": message, "type": error_type(status), "code": code}
    if field is not None:
        error["field"] = field
    return {"error": error}


class DgxmmError(Exception):
    status = 500
    code = "internal_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class NotFound(DgxmmError):
    status = 404
    code = "not_found"


class Conflict(DgxmmError):
    """The operation does not fit the deployment's current state (409)."""

    status = 409
    code = "conflict"


class StoreUnavailable(DgxmmError):
    """The database cannot be written now (a full disk, a read-only file system): a change the
    caller asked for is refused (503) rather than made in memory only."""

    status = 503
    code = "store_unavailable"


class InvalidInput(DgxmmError):
    """Input that validates field by field but not as a whole (422, naming the field)."""

    status = 422
    code = "invalid_input"
