"""Forwarding one request to the engine and its answer back, byte for byte and unbuffered.

Removed on the way up: Authorization, Cookie, Host, forwarding and hop-by-hop headers (and any
named in Connection) and the health-check marker; ``Accept-Encoding: identity`` is sent so the
bytes passed back are the bytes the engine wrote. Removed on the way down: hop-by-hop headers,
Server and Date. Engine errors pass through unchanged. ``x-request-id`` is the request's id both
ways (the caller's own when it sent a sane one): the engine gets it, and the answer carries it
whatever the engine answered.

The request's ``Exchange`` learns the status, when the first engine byte was passed on and how
many bytes were: one clock read per answer and no work per chunk.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import aiohttp
from starlette.types import Scope, Send

from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.models import Deployment
from dgxmm.errors import error_body
from dgxmm.ondemand import notice
from dgxmm.ondemand.paths import upstream_path
from dgxmm.ondemand.responses import send_error, sse_error
from dgxmm.ondemand.upstream import UpstreamClients
from dgxmm.telemetry.exchange import Exchange
from dgxmm.telemetry.logs import fields

log = logging.getLogger(__name__)


HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                        "te", "trailer", "trailers", "transfer-encoding", "upgrade"})  # fmt: skip
DROP_UP = HOP_BY_HOP | {"authorization", "cookie", "host", "forwarded", "x-real-ip",
                        "x-dgxmm-health-check", "accept-encoding", "content-length", "x-request-id"}  # fmt: skip
DROP_DOWN = HOP_BY_HOP | {"server", "date", "x-request-id"}
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]  # fmt: skip


def _named_in_connection(pairs: list[tuple[str, str]]) -> set[str]:
    named: set[str] = set()
    for name, value in pairs:
        if name == "connection":
            named.update(token.strip().lower() for token in value.split(",") if token.strip())
    return named


def request_headers(scope: Scope, request_id: str) -> list[tuple[str, str]]:
    """The headers sent up; names are matched with ``_`` read as ``-``, so ``X_Forwarded_Host``
    or ``Proxy_Authorization`` cannot slip past under another spelling."""
    pairs = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]]
    drop = DROP_UP | {name.replace("_", "-") for name in _named_in_connection(pairs)}
    kept = [(k, v) for k, v in pairs
            if (name := k.replace("_", "-")) not in drop and not name.startswith("x-forwarded-")]  # fmt: skip
    return kept + [("accept-encoding", "identity"), ("x-request-id", request_id)]


def response_headers(raw: Any, request_id: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    pairs = [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in raw]
    drop = DROP_DOWN | _named_in_connection(pairs)
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in pairs if k not in drop] + [request_id]


class Forwarder:
    def __init__(self, clients: UpstreamClients) -> None:
        self.clients = clients

    @staticmethod
    async def start_sse(send: Send, ex: Exchange) -> None:
        ex.status = 200
        await send({"type": "http.response.start", "status": 200, "headers": [*SSE_HEADERS, ex.header]})

    async def forward(
        self,
        scope: Scope,
        send: Send,
        dep: Deployment,
        endpoint: str,
        body: bytes,
        ex: Exchange,
        *,
        sse_started: bool = False,
        prepend_notice: bool = False,
        streaming: bool = False,
    ) -> None:
        """Forward one request for ``endpoint`` (the checked path after ``/v1/``, e.g.
        ``chat/completions``) to ``dep``'s engine and its answer back. ``streaming``: the request
        asks for a streamed answer (``"stream": true``)."""
        base = dep.base_url
        if base is None:
            await self._fail(send, ex, sse_started, 502, f"{dep.name} has no engine address")
            return
        url = base + upstream_path(["v1", *endpoint.split("/")])
        query = scope.get("query_string", b"")
        if query:
            url += "?" + query.decode("latin-1")
        async with self.clients.session(dep.id, base, engine_of(dep).closes_after_streams) as client:
            try:
                resp = await client.request(scope["method"], url, body, request_headers(scope, ex.request_id),
                                            streaming)  # fmt: skip
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                # The caller learns which deployment and what kind of failure, never the engine's
                # internal address (aiohttp's messages carry it); the log has the details.
                await self._fail(send, ex, sse_started, 502, f"engine unreachable: {dep.name} ({type(exc).__name__})",
                                 f" (at {base}: {type(exc).__name__}: {exc})")  # fmt: skip
                return
            try:
                if sse_started:
                    await self._continue_sse(send, resp, ex)
                elif prepend_notice and resp.status == 200:
                    await self._with_notice(send, resp, endpoint, ex)
                else:
                    await self._relay(send, resp, ex)
            finally:
                ex.bytes = resp.content.total_bytes
                resp.close()  # an unfinished answer closes its engine connection

    async def _relay(self, send: Send, resp: aiohttp.ClientResponse, ex: Exchange) -> None:
        ex.status = resp.status
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": response_headers(resp.raw_headers, ex.header)})  # fmt: skip
        content = resp.content
        chunk = await content.readany()
        ex.engine_byte = ex.first_byte = time.monotonic()
        while chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            chunk = await content.readany()
        await send({"type": "http.response.body", "body": b""})

    async def _with_notice(self, send: Send, resp: aiohttp.ClientResponse, endpoint: str, ex: Exchange) -> None:
        raw = notice.prepend(endpoint, await resp.read())
        ex.status = resp.status
        ex.engine_byte = ex.first_byte = time.monotonic()
        headers = [(k, v) for k, v in response_headers(resp.raw_headers, ex.header) if k != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await send({"type": "http.response.body", "body": raw})

    async def _continue_sse(self, send: Send, resp: aiohttp.ClientResponse, ex: Exchange) -> None:
        """After the queued notice: the engine's SSE bytes, or its error as an SSE error."""
        content = resp.content
        if resp.status >= 400:
            raw = await resp.read()
            ex.engine_byte = time.monotonic()
            try:
                error = json.loads(raw)["error"]
                data = {"error": error if isinstance(error, dict) else {"message": str(error)}}
            except (ValueError, KeyError, TypeError, RecursionError):
                data = error_body(resp.status, "ondemand_upstream_error", raw.decode("utf-8", "replace")[:500])
            await send({"type": "http.response.body",
                        "body": b"data: " + json.dumps(data).encode() + b"\n\ndata: [DONE]\n\n"})  # fmt: skip
            return
        chunk = await content.readany()
        ex.engine_byte = time.monotonic()
        while chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            chunk = await content.readany()
        await send({"type": "http.response.body", "body": b""})

    @staticmethod
    async def _fail(send: Send, ex: Exchange, sse_started: bool, status: int, message: str, detail: str = "") -> None:
        """The engine could not be asked: 502 (or its SSE form); ``detail`` is for the log only."""
        ex.code = "ondemand_upstream_error"
        log.warning("request failed: ondemand_upstream_error: %s%s", message, detail,
                    extra=fields(ex.deployment_id, ex.served_name, ex.request_id, ex.peer))  # fmt: skip
        if sse_started:
            await send({"type": "http.response.body",
                        "body": sse_error(status, "ondemand_upstream_error", message)})  # fmt: skip
        else:
            ex.status = status
            await send_error(send, status, "ondemand_upstream_error", message, headers=[ex.header])
