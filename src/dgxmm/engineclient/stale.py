"""Pooled engine connections the engine has already closed: found before the request is written.

An engine may close a kept-alive connection at any moment between two requests (an idle timeout,
a cap on requests per connection, llama-server after every streamed answer). asyncio learns of the
close only when its loop next reads the socket, so the pool can hold a connection whose FIN (or
reset) is already in the kernel. Like urllib3's ``is_connection_dropped`` and Go's idle-connection
read loop, the pool polls the socket of a connection it takes out, in the same step as the write
of the request (no await in between): an idle HTTP/1.1 connection has nothing to read, so a
readable socket means EOF, a reset or stray bytes, and the connection is closed instead, with not
a byte of the request written to it. That is the one failure that proves the engine cannot have
received the request; every failure after the write is ambiguous, so nothing is ever resent.
"""

from __future__ import annotations

import asyncio
import select
from typing import Protocol


class Polled(Protocol):
    poller: select.poll | None


def poller_of(transport: asyncio.BaseTransport) -> select.poll | None:
    """A poll object watching the transport's socket for input (None without a socket).
    ``poll()``, not ``select()``: descriptors above 1023 are common under load."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    return poller


def peer_closed(conn: Polled) -> bool:
    """Whether an idle connection's socket is readable: closed, reset or sent unasked bytes."""
    poller = conn.poller
    return poller is not None and bool(poller.poll(0))
