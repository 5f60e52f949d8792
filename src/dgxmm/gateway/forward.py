"""Forwarding one request to the engine and its answer back, byte for byte and unbuffered.

On the way up the engine gets the request's headers as ``heads.Heads`` built them (no
credentials, forwarding or hop-by-hop headers), plus ``Accept-Encoding: identity``, so the bytes
passed back are the bytes the engine wrote. Removed on the way down: hop-by-hop headers (and any
named in Connection), Server and Date. Engine errors pass through unchanged. ``x-request-id`` is
the request's id both ways (the caller's own when it sent a sane one): the engine gets it, and
the answer carries it whatever the engine answered.

The request's ``Exchange`` learns the status, when the first engine byte was passed on and how
many bytes were (one clock read per answer), and what the answer cost in tokens
(``usage.UsageReader``, fed each chunk after it was written: one search per chunk). A stream
whose usage dgxmm asked for (``quota.with_usage``: a key with a token quota whose client did not)
passes through ``usageonly.UsageOnly``, which holds out the usage-only chunk; every other byte
passes as the engine wrote it.

Headers stay bytes on both ways (the front door hands over lowercase names, the engine client
writes bytes). An answer the engine sent whole in one read (most non-streaming answers) goes
back in one write (the request's ``respond``); anything else is relayed chunk by chunk as it
comes. An engine that breaks off its answer (it died, or dgxmm ended it as hung) gets the caller
a 502 while nothing of the answer was sent (inside the stream after a queued notice). Under way,
an event stream that broke off between two events ends with the gateway's error event and
``[DONE]``, which SSE clients (the OpenAI SDK among them) raise as an error; any other answer
gets its connection cut short, so the caller sees it incomplete. Never a made-up end; the log
has one line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from functools import lru_cache

from dgxmm.deploy.engines import engine_of
from dgxmm.records.deployment import Deployment
from dgxmm.errors import error_body
from dgxmm.gateway import notice
from dgxmm.engineclient.connection import EngineAborted, EngineDisconnected, EngineResponse
from dgxmm.gateway.heads import HOP_BY_HOP, PLAIN_CONNECTION, Heads
from dgxmm.gateway.paths import upstream_path
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.responses import send_error, sse_error
from dgxmm.gateway.routes import AT_ROOT
from dgxmm.engineclient.pool import UpstreamClients
from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.usagescan import UsageReader
from dgxmm.gateway.usageonly import UsageOnly
from dgxmm.logs import fields

log = logging.getLogger(__name__)

DROP_DOWN = HOP_BY_HOP | {b"server", b"date", b"x-request-id"}
IDENTITY = b"accept-encoding: identity\r\nx-request-id: "  # the request id follows
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
# An engine's header names, lowercased, b"" for those not passed back (b"connection" for that
# one, whose value may name more): worked out once per name, as the same few repeat.
MAX_DOWN = 512
_DOWN: dict[bytes, bytes] = {}


def _down(name: bytes) -> bytes:
    low = name.lower()
    kept = low if low == b"connection" or low not in DROP_DOWN else b""
    if len(_DOWN) < MAX_DOWN:
        _DOWN[name] = kept
    return kept


def upstream_headers(heads: Heads, request_id: str) -> bytes:
    """The header lines sent to the engine (the engine client adds Host and Content-Length)."""
    return b"%b%b%b\r\n" % (heads.upstream, IDENTITY, request_id.encode("latin-1"))


def response_headers(raw: list[tuple[bytes, bytes]], request_id: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """The engine's headers passed back: lowercase names, ``request_id`` last."""
    kept = []
    named: set[bytes] | None = None
    for name, value in raw:
        low = _DOWN.get(name)
        if low is None:
            low = _down(name)
        if low == b"connection":
            if value.lower() not in PLAIN_CONNECTION:
                named = (named or set()) | {t.strip().lower() for t in value.split(b",") if t.strip()}
        elif low:
            kept.append((low, value))
    if named:
        kept = [(k, v) for k, v in kept if k not in named]
    kept.append(request_id)
    return kept


def _between_events(resp: EngineResponse) -> bool:
    """Whether ``resp`` is an event stream (chunked, so more can follow) whose bytes passed on so
    far end with a whole event other than the final ``[DONE]``: an error event appended there is
    read as one. (After ``[DONE]`` the caller has the whole answer and stops reading.)"""
    last = resp.last
    if not last.endswith((b"\n\n", b"\r\n\r\n")) or last.rstrip().endswith(b"[DONE]"):
        return False
    return _event_stream(resp)


def _event_stream(resp: EngineResponse) -> bool:
    """Whether ``resp`` is an event stream that more can follow (chunked, no Content-Length)."""
    kinds = {
        name.lower(): value for name, value in resp.headers if name.lower() in (b"content-type", b"content-length")
    }
    return b"content-length" not in kinds and kinds.get(b"content-type", b"").startswith(b"text/event-stream")


@lru_cache(maxsize=256)
def _target(endpoint: str) -> str:
    """The path sent to the engine for ``endpoint``, worked out once per endpoint: under /v1,
    but llama-server's own routes (``routes.AT_ROOT``) at its root."""
    return upstream_path([*([] if endpoint in AT_ROOT else ["v1"]), *endpoint.split("/")])


class Forwarder:
    def __init__(self, clients: UpstreamClients) -> None:
        self.clients = clients

    @staticmethod
    async def start_sse(req: GatewayRequest, ex: Exchange) -> None:
        ex.status = 200
        await req.start(200, ex.own_headers([*SSE_HEADERS, ex.header]))

    async def forward(
        self,
        req: GatewayRequest,
        heads: Heads,
        dep: Deployment,
        endpoint: str,
        body: bytes | bytearray,
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
            await self._fail(req, ex, sse_started, 502, f"{dep.name} has no engine address")
            return
        target = _target(endpoint)
        query = req.query
        if query:
            target += "?" + query.decode("latin-1")
        handle = dep.runtime_handle
        client = self.clients.begin(
            dep.id,
            base,
            engine_of(dep).closes_after_streams,
            dep.upstream_max_connections,
            handle.api_key if handle else None,
        )
        ex.usage = UsageReader(streaming)
        try:
            try:
                resp = await client.request(req.method, target, body, upstream_headers(heads, ex.request_id), streaming)
            except (OSError, TimeoutError) as exc:
                # The caller learns which deployment and what kind of failure, never the engine's
                # internal address; the log has the details.
                await self._fail(
                    req,
                    ex,
                    sse_started,
                    502,
                    f"engine unreachable: {dep.name} ({type(exc).__name__})",
                    f" (at {base}: {type(exc).__name__}: {exc})",
                )
                return
            try:
                if sse_started:
                    await self._continue_sse(req, resp, ex)
                elif prepend_notice and resp.status == 200:
                    await self._with_notice(req, resp, endpoint, ex)
                else:
                    await self._relay(req, resp, ex)
            except EngineDisconnected as exc:
                await self._broke_off(req, resp, ex, sse_started, dep.name, exc, f" (at {base}: {exc})")
            except asyncio.CancelledError:  # a hang-up, or the request ended under way (``inflight``)
                ex.between_events = _between_events(resp) if resp.last else sse_started or _event_stream(resp)
                raise
            finally:
                ex.bytes = resp.total_bytes
                ex.usage.end()
                resp.close()  # an unfinished answer closes its engine connection
        finally:
            self.clients.end(client)

    async def _broke_off(
        self,
        req: GatewayRequest,
        resp: EngineResponse,
        ex: Exchange,
        sse_started: bool,
        name: str,
        exc: EngineDisconnected,
        detail: str,
    ) -> None:
        """The engine's connection ended before its answer did. Nothing of the answer sent yet:
        502 (inside the stream after a queued notice). Under way: an event stream that stopped
        between two events gets the error event and ``[DONE]``; anything else has the caller's
        connection cut, so it sees the answer incomplete. One line goes to the log (not the
        server's traceback of an application error)."""
        message = str(exc) if isinstance(exc, EngineAborted) else f"the engine broke off its answer: {name}"
        if not req.response_started or sse_started or _between_events(resp):
            await self._fail(req, ex, req.response_started, 502, message, detail)
            return
        ex.code = "ondemand_upstream_error"
        log.warning(
            "request failed: ondemand_upstream_error: %s%s",
            message,
            detail,
            extra=fields(ex.deployment_id, ex.served_name, ex.request_id, ex.peer),
        )
        req.cut()

    async def _relay(self, req: GatewayRequest, resp: EngineResponse, ex: Exchange) -> None:
        ex.status = resp.status
        headers = ex.own_headers(response_headers(resp.headers, ex.header))
        usage = ex.usage
        unasked = ex.unasked if resp.status == 200 else None
        if resp.complete:
            ex.engine_byte = ex.first_byte = time.monotonic()
            whole = resp.take()
            await req.respond(
                resp.status, headers, whole if unasked is None else unasked.pass_on(whole) + unasked.end()
            )
            if usage is not None:
                usage.whole(whole)
            return
        if unasked is not None:
            headers = [(k, v) for k, v in headers if k != b"content-length"]  # a chunk may be held out
        await req.start(resp.status, headers)  # with the engine's Content-Length, if it gave one
        chunk = await resp.read_chunk()
        ex.engine_byte = ex.first_byte = time.monotonic()
        await self._pass_on(req, resp, chunk, usage, unasked)

    @staticmethod
    async def _pass_on(
        req: GatewayRequest,
        resp: EngineResponse,
        chunk: bytes,
        usage: UsageReader | None,
        unasked: UsageOnly | None,
    ) -> None:
        """The engine's answer from ``chunk`` on, chunk by chunk, then the end: all of it, but a
        usage-only chunk held out (``unasked``)."""
        while chunk:
            await req.write(chunk if unasked is None else unasked.pass_on(chunk))
            if usage is not None:
                usage.feed(chunk)  # after the write: counting never delays a byte
            chunk = await resp.read_chunk()
        await req.end(b"" if unasked is None else unasked.end())

    async def _with_notice(self, req: GatewayRequest, resp: EngineResponse, endpoint: str, ex: Exchange) -> None:
        raw = notice.prepend(endpoint, await resp.read())
        ex.status = resp.status
        ex.engine_byte = ex.first_byte = time.monotonic()
        await req.respond(resp.status, ex.own_headers(response_headers(resp.headers, ex.header)), raw)
        if ex.usage is not None:
            ex.usage.whole(raw)

    async def _continue_sse(self, req: GatewayRequest, resp: EngineResponse, ex: Exchange) -> None:
        """After the queued notice: the engine's SSE bytes, or its error as an SSE error."""
        if resp.status >= 400:
            raw = await resp.read()
            ex.engine_byte = time.monotonic()
            try:
                error = json.loads(raw)["error"]
                data = {"error": error if isinstance(error, dict) else {"message": str(error)}}
            except (ValueError, KeyError, TypeError, RecursionError):
                data = error_body(resp.status, "ondemand_upstream_error", raw.decode("utf-8", "replace")[:500])
            await req.end(b"data: " + json.dumps(data).encode() + b"\n\ndata: [DONE]\n\n")
            return
        chunk = await resp.read_chunk()
        ex.engine_byte = time.monotonic()
        await self._pass_on(req, resp, chunk, ex.usage, ex.unasked)

    @staticmethod
    async def _fail(
        req: GatewayRequest, ex: Exchange, sse_started: bool, status: int, message: str, detail: str = ""
    ) -> None:
        """The engine could not be asked: 502 (or its SSE form); ``detail`` is for the log only."""
        ex.code = "ondemand_upstream_error"
        log.warning(
            "request failed: ondemand_upstream_error: %s%s",
            message,
            detail,
            extra=fields(ex.deployment_id, ex.served_name, ex.request_id, ex.peer),
        )
        if sse_started:
            await req.end(sse_error(status, "ondemand_upstream_error", message))
        else:
            ex.status = status
            await send_error(req, status, "ondemand_upstream_error", message, headers=[ex.header])
