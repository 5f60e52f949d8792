"""Forwarding one request to the engine and its answer back, byte for byte and unbuffered.

Removed on the way up: Authorization, Cookie, Host, forwarding and hop-by-hop headers (and any
named in Connection) and the health-check marker; ``Accept-Encoding: identity`` is sent so the
bytes passed back are the bytes the engine wrote. Removed on the way down: hop-by-hop headers,
Server and Date. Engine errors pass through unchanged. ``x-request-id`` is the request's id both
ways (the caller's own when it sent a sane one): the engine gets it, and the answer carries it
whatever the engine answered.

The request's ``Exchange`` learns the status, when the first engine byte was passed on and how
many bytes were: one clock read per answer and no work per chunk.

Headers stay bytes on both ways (uvicorn hands over lowercase names, the engine client writes
bytes). An answer the engine sent whole in one read (most non-streaming answers) goes back in one
write through the front door's ``respond`` (front/cycle.py); anything else is relayed chunk by
chunk as it comes. An engine that breaks off its answer gets the caller a 502 while nothing of
the answer was sent (inside the stream after a queued notice), else a connection cut short: the
caller sees the answer incomplete, never a made-up end, and the log has one line.
"""

from __future__ import annotations

import json
import logging
import time
from functools import lru_cache

from starlette.types import Scope, Send

from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.models import Deployment
from dgxmm.errors import error_body
from dgxmm.front.cycle import front_of
from dgxmm.ondemand import notice
from dgxmm.ondemand.engineconn import EngineDisconnected, EngineResponse
from dgxmm.ondemand.paths import upstream_path
from dgxmm.ondemand.responses import send_error, sse_error
from dgxmm.ondemand.upstream import UpstreamClients
from dgxmm.telemetry.exchange import HEADER, Exchange
from dgxmm.telemetry.logs import fields

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization",
                        b"te", b"trailer", b"trailers", b"transfer-encoding", b"upgrade"})  # fmt: skip
# ``expect``: the whole body goes with the head, there is nothing to wait for.
DROP_UP = HOP_BY_HOP | {b"authorization", b"cookie", b"host", b"forwarded", b"x-real-ip",
                        b"x-dgxmm-health-check", b"accept-encoding", b"content-length", b"expect",
                        b"x-request-id"}  # fmt: skip
DROP_DOWN = HOP_BY_HOP | {b"server", b"date", b"x-request-id"}
IDENTITY = (b"accept-encoding", b"identity")
UNDERSCORE = ord("_")  # an int: CPython 3.11 tests bytes-in-bytes by raising and clearing a TypeError first (10x slower)
PLAIN_CONNECTION = frozenset({b"keep-alive", b"close"})  # Connection values naming no other header
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]  # fmt: skip


def _named_in_connection(pairs: list[tuple[bytes, bytes]]) -> set[bytes]:
    named: set[bytes] = set()
    for name, value in pairs:
        if name.lower() == b"connection":
            named.update(token.strip().lower() for token in value.split(b",") if token.strip())
    return named


def request_headers(scope: Scope, request_id: str) -> list[tuple[bytes, bytes]]:
    """The headers sent up; names are matched with ``_`` read as ``-``, so ``X_Forwarded_Host``
    or ``Proxy_Authorization`` cannot slip past under another spelling. One pass over the
    headers, a second only when ``Connection`` names a header that is not hop-by-hop anyway."""
    kept: list[tuple[bytes, bytes]] = []
    named: set[bytes] = set()
    for name, value in scope["headers"]:
        lower = name.lower()
        key = lower.replace(b"_", b"-") if UNDERSCORE in lower else lower
        if key in DROP_UP or key.startswith(b"x-forwarded-"):
            if key == b"connection" and value.lower() not in PLAIN_CONNECTION:
                named.update(t.replace(b"_", b"-") for t in _named_in_connection([(name, value)]))
            continue
        kept.append((lower, value))
    named -= DROP_UP
    if named:
        kept = [(k, v) for k, v in kept if k.replace(b"_", b"-") not in named]
    kept.append(IDENTITY)
    kept.append((HEADER, request_id.encode("latin-1")))
    return kept


def response_headers(raw: list[tuple[bytes, bytes]], request_id: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    drop = DROP_DOWN
    for name, _ in raw:
        if name.lower() == b"connection":
            drop = DROP_DOWN | _named_in_connection(raw)
            break
    kept = []
    for name, value in raw:
        key = name.lower()
        if key not in drop:
            kept.append((key, value))
    kept.append(request_id)
    return kept


@lru_cache(maxsize=256)
def _target(endpoint: str) -> str:
    """The path sent to the engine for ``endpoint``, worked out once per endpoint."""
    return upstream_path(["v1", *endpoint.split("/")])


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
        target = _target(endpoint)
        query = scope.get("query_string", b"")
        if query:
            target += "?" + query.decode("latin-1")
        client = self.clients.begin(dep.id, base, engine_of(dep).closes_after_streams, dep.upstream_max_connections)
        try:
            try:
                resp = await client.request(scope["method"], target, body, request_headers(scope, ex.request_id),
                                            streaming)  # fmt: skip
            except (OSError, TimeoutError) as exc:
                # The caller learns which deployment and what kind of failure, never the engine's
                # internal address; the log has the details.
                await self._fail(send, ex, sse_started, 502, f"engine unreachable: {dep.name} ({type(exc).__name__})",
                                 f" (at {base}: {type(exc).__name__}: {exc})")  # fmt: skip
                return
            try:
                if sse_started:
                    await self._continue_sse(send, resp, ex)
                elif prepend_notice and resp.status == 200:
                    await self._with_notice(scope, send, resp, endpoint, ex)
                else:
                    await self._relay(scope, send, resp, ex)
            except EngineDisconnected as exc:
                await self._broke_off(scope, send, ex, sse_started, dep.name, f" (at {base}: {exc})")
            finally:
                ex.bytes = resp.total_bytes
                resp.close()  # an unfinished answer closes its engine connection
        finally:
            self.clients.end(client)

    async def _broke_off(self, scope: Scope, send: Send, ex: Exchange, sse_started: bool, name: str,
                         detail: str) -> None:  # fmt: skip
        """The engine's connection ended before its answer did. Nothing of the answer sent yet:
        502 (inside the stream after a queued notice). Under way: the caller's connection is cut,
        so it sees the answer incomplete, and one line goes to the log (not the server's
        traceback of an application error)."""
        front = front_of(scope)
        if sse_started or (front is not None and not front.response_started):
            await self._fail(send, ex, sse_started, 502, f"the engine broke off its answer: {name}", detail)
            return
        if front is None:
            raise EngineDisconnected(f"the engine broke off its answer{detail}")  # plain ASGI: the server ends it
        ex.code = "ondemand_upstream_error"
        log.warning("request failed: ondemand_upstream_error: the engine broke off its answer: %s%s", name, detail,
                    extra=fields(ex.deployment_id, ex.served_name, ex.request_id, ex.peer))  # fmt: skip
        front.cut()

    async def _relay(self, scope: Scope, send: Send, resp: EngineResponse, ex: Exchange) -> None:
        ex.status = resp.status
        headers = response_headers(resp.headers, ex.header)
        if resp.complete:
            ex.engine_byte = ex.first_byte = time.monotonic()
            await _whole(scope, send, resp.status, headers, resp.take())
            return
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        chunk = await resp.read_chunk()
        ex.engine_byte = ex.first_byte = time.monotonic()
        while chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            chunk = await resp.read_chunk()
        await send({"type": "http.response.body", "body": b""})

    async def _with_notice(self, scope: Scope, send: Send, resp: EngineResponse, endpoint: str, ex: Exchange) -> None:
        raw = notice.prepend(endpoint, await resp.read())
        ex.status = resp.status
        ex.engine_byte = ex.first_byte = time.monotonic()
        await _whole(scope, send, resp.status, response_headers(resp.headers, ex.header), raw)

    async def _continue_sse(self, send: Send, resp: EngineResponse, ex: Exchange) -> None:
        """After the queued notice: the engine's SSE bytes, or its error as an SSE error."""
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
        chunk = await resp.read_chunk()
        ex.engine_byte = time.monotonic()
        while chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            chunk = await resp.read_chunk()
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


async def _whole(scope: Scope, send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """A whole answer with its length: one write through the front door, else two ASGI messages."""
    front = front_of(scope)
    if front is not None:
        front.respond(status, headers, body)
        return
    headers = [(k, v) for k, v in headers if k != b"content-length" and k != b"transfer-encoding"]
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
