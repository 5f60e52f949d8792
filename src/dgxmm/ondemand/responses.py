"""Raw ASGI answers of the gateway: errors in the service's one envelope, small JSON bodies."""

from __future__ import annotations

import json
from typing import Any

from starlette.types import Send

from dgxmm.errors import error_body


async def send_json(
    send: Send, status: int, body: Any, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    data = json.dumps(body).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()), *(headers or [])],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": data})


async def send_error(
    send: Send, status: int, code: str, message: str, retry_after: int | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:  # fmt: skip
    extra = [(b"retry-after", str(retry_after).encode())] if retry_after is not None else []
    await send_json(send, status, error_body(status, code, message), extra + (headers or []))


def sse_error(status: int, code: str, message: str) -> bytes:
    """A late error inside an SSE stream that already began: the error, then [DONE]."""
    return b"data: " + json.dumps(error_body(status, code, message)).encode() + b"\n\ndata: [DONE]\n\n"
