"""Errors with a stable code, an HTTP status and a message meant for the person who sees it."""

from __future__ import annotations


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


class InvalidInput(DgxmmError):
    """Input that validates field by field but not as a whole (422, naming the field)."""

    status = 422
    code = "invalid_input"
