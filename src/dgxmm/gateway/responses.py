"""The gateway's own answers: errors in the service's one envelope, small JSON bodies."""

from __future__ import annotations

import json
from typing import Any

from dgxmm.errors import error_body
from dgxmm.gateway.request import GatewayRequest

JSON = (b"content-type", b"application/json")


async def send_json(
    req: GatewayRequest, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await req.respond(status, [JSON, *(headers or [])], json.dumps(body).encode())


async def send_error(
    req: GatewayRequest,
    status: int,
    code: str,
    message: str,
    retry_after: int | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    extra = [(b"retry-after", str(retry_after).encode())] if retry_after is not None else []
    await send_json(req, status, error_body(status, code, message), extra + (headers or []))


def sse_error(status: int, code: str, message: str) -> bytes:
    """A late error inside an SSE stream that already began: the error, then [DONE]."""
    return b"data: " + json.dumps(error_body(status, code, message)).encode() + b"\n\ndata: [DONE]\n\n"
