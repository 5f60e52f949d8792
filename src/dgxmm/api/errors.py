"""The admin API's errors, in the service's one envelope (``dgxmm.errors.error_body``).

Validation errors name the field (``field``) so the UI can show the message next to it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dgxmm.deploy.budget import InsufficientMemory
from dgxmm.records.deployment import InvalidTransition
from dgxmm.errors import DgxmmError, error_body


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, code, message, field), status_code=status, headers=headers)


def _problem(err: Any) -> tuple[str | None, str]:
    """One validation error: the field it names (None for the body as a whole) and its message."""
    loc = [str(part) for part in err["loc"] if part not in ("body", "query", "path") and not isinstance(part, int)]
    message = str(err["msg"]).removeprefix("Value error, ")
    field = ".".join(loc) or None
    if field is None and ":" in message:  # whole-model checks say "field: problem"
        field, message = (part.strip() for part in message.split(":", 1))
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    return field, message


def _validation(request: Request, exc: Exception) -> JSONResponse:
    """The first problem as the envelope's message and field; when there are more, every one in
    ``errors`` too, so a form shows them all at once."""
    assert isinstance(exc, RequestValidationError)
    problems = [_problem(err) for err in exc.errors()]
    field, message = problems[0]
    body = error_body(422, "invalid_input", f"{field}: {message}" if field else message, field)
    if len(problems) > 1:
        body["error"]["errors"] = [{"field": name, "message": text} for name, text in problems]
    return JSONResponse(body, status_code=422)


def _dgxmm(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, DgxmmError)
    return error_response(exc.status, exc.code, exc.message, exc.field)


def _memory(request: Request, exc: Exception) -> JSONResponse:
    return error_response(409, "insufficient_memory", str(exc))


def _transition(request: Request, exc: Exception) -> JSONResponse:
    return error_response(409, "conflict", str(exc))


def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    headers = dict(exc.headers) if exc.headers else None
    return error_response(exc.status_code, code, str(exc.detail), headers=headers)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(DgxmmError, _dgxmm)
    app.add_exception_handler(InsufficientMemory, _memory)
    app.add_exception_handler(InvalidTransition, _transition)
    app.add_exception_handler(StarletteHTTPException, _http)
