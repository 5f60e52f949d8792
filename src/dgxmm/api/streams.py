"""The console's server-sent event streams, ended cleanly when dgxmm shuts down.

sse-starlette hears the server's exit signal itself. Left alone it cancels the stream there and
then, and the response never gets its last, empty body: uvicorn logs "ASGI callable returned
without completing response" for every page left open at a shutdown. Given a shutdown event it
sets the event first and waits up to a grace period; ``until`` makes the stream's events end at
that event, so the response ends as any finished stream does, and the browser reconnects to the
next dgxmm as after a dropped connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import anyio
from sse_starlette.sse import EventSourceResponse

PING_S = 15  # a comment line this often keeps an idle stream open through proxies
SHUTDOWN_GRACE_S = 2.0  # how long a stream may take to end once the shutdown is heard


def event_stream(events: AsyncIterator[dict[str, str]]) -> EventSourceResponse:
    """An SSE response of ``events`` that ends, completed, when the server shuts down."""
    stop = anyio.Event()
    return EventSourceResponse(
        until(events, stop), ping=PING_S, shutdown_event=stop, shutdown_grace_period=SHUTDOWN_GRACE_S
    )


async def until(events: AsyncIterator[dict[str, str]], stop: anyio.Event) -> AsyncIterator[dict[str, str]]:
    """``events`` until ``stop`` is set. The event being waited for is then cancelled, as it is
    when the stream itself is cancelled (the client left), which runs the source's own clean-up,
    such as closing its subscription."""
    stopped = asyncio.ensure_future(stop.wait())
    following: asyncio.Future[dict[str, str]] | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(events))
            await asyncio.wait({following, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not following.done():
                return
            try:
                event = following.result()
            except StopAsyncIteration:
                return
            yield event
    finally:
        stopped.cancel()
        if following is not None and not following.done():
            following.cancel()  # (the source must not be running when it is closed below)
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await following
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
