"""Pooled engine connections the engine has already closed: found before the request is written.

An engine may close a kept-alive connection at any moment between two requests (an idle timeout,
a cap on requests per connection, llama-server after every streamed answer). asyncio learns of the
close only when its loop next reads the socket, so the pool can hand out a connection whose FIN
(or reset) is already in the kernel. Like urllib3's ``is_connection_dropped`` and Go's idle-
connection read loop, the request class below polls the socket in the same step that writes the
request: an idle HTTP/1.1 connection has nothing to read, so a readable socket means EOF, a reset
or stray bytes, and the connection is closed before a byte of the request is sent.

That failure then reaches the caller as aiohttp's "Can not write request body" error caused by
its own ``ClientConnectionResetError`` ("Cannot write to closing transport"), the one failure that
proves the engine cannot have received the whole request (``nothing_sent``). Every other failure
after the write (the connection closed or reset before any response byte) is ambiguous: the
engine may have read the request and begun generating, so it is never replayed.
"""

from __future__ import annotations

import asyncio
import select
from contextvars import ContextVar
from typing import Protocol

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.client_proto import ResponseHandler
from aiohttp.connector import Connection

EXPECT_STREAM: ContextVar[bool] = ContextVar("dgxmm_upstream_expect_stream", default=False)


class Reuse(Protocol):
    """What the request class asks of its engine's client about connection reuse."""

    closes_after_streams: bool

    def stale(self, protocol: ResponseHandler | None) -> None:
        """A connection was found closed by the engine before a request was written to it."""

    def carries_stream(self, protocol: ResponseHandler) -> None:
        """The request about to be written on this connection asks for a streamed answer."""

    def carries_plain(self, protocol: ResponseHandler) -> None:
        """... and this one does not."""


def peer_closed(transport: asyncio.BaseTransport) -> bool:
    """Whether an idle connection's socket is readable: closed, reset or sent unasked bytes."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()  # not select(): descriptors above 1023 are common under load
    poller.register(sock.fileno(), select.POLLIN)
    return bool(poller.poll(0))


def checked_request(reuse: Reuse) -> type[aiohttp.ClientRequest]:
    """A request class that drops a connection the engine closed, right before writing to it,
    and keeps a streamed answer's connection out of the pool when the engine closes after those.

    aiohttp sends the request line and headers together with the body, from ``write_bytes``; the
    check runs there, in the same step as the write (a separate task on Python 3.11, so checking
    when the connection leaves the pool would leave a whole loop iteration between check and
    write). Whether the request asks for a stream comes from ``EXPECT_STREAM``, set by the
    caller around ``session.request`` (the writer task runs in a copy of the caller's context).
    """

    class CheckedRequest(aiohttp.ClientRequest):
        async def write_bytes(
            self, writer: AbstractStreamWriter, conn: Connection, content_length: int | None = None
        ) -> None:
            transport, protocol = conn.transport, conn.protocol
            if transport is not None and peer_closed(transport):
                reuse.stale(protocol)
                transport.close()  # the write below now fails with nothing sent
            elif protocol is not None:
                if not EXPECT_STREAM.get():
                    reuse.carries_plain(protocol)
                elif reuse.closes_after_streams:
                    protocol.force_close()  # not pooled again when the answer ends
                else:
                    reuse.carries_stream(protocol)
            await super().write_bytes(writer, conn, content_length)

    return CheckedRequest


def nothing_sent(exc: BaseException) -> bool:
    """Whether a failed request provably never fully left dgxmm, so resending cannot run it twice.

    aiohttp raises ``ClientConnectionResetError`` only from its request writer, when the
    connection was closed before (all of) the request could be handed to it; the body writer
    reports it as ``ClientOSError("Can not write request body")`` caused by it. An engine that
    lacks part of the request cannot have started generating.
    """
    return isinstance(exc, aiohttp.ClientOSError) and isinstance(exc.__cause__, aiohttp.ClientConnectionResetError)
