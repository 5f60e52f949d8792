"""The console's event streams end cleanly (api/streams.py): at the shutdown event, and when the
stream itself is cancelled (the client left) while it waits for the source's next event; either
way the source's own clean-up runs and nothing is left running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio

from dgxmm.api.streams import until


class Source:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self.closed = False

    async def events(self) -> AsyncIterator[dict[str, str]]:
        try:
            while True:
                yield await self.queue.get()
        finally:
            self.closed = True


async def test_events_pass_until_the_shutdown_event_then_the_source_is_closed() -> None:
    source, stop = Source(), anyio.Event()
    stream = until(source.events(), stop)
    source.queue.put_nowait({"event": "a"})
    assert await anext(stream) == {"event": "a"}
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    stop.set()
    try:
        await waiting
        raise AssertionError("the stream went on after the shutdown event")
    except StopAsyncIteration:
        pass
    assert source.closed


async def test_a_cancelled_stream_closes_its_source_while_it_waits() -> None:
    source, stop = Source(), anyio.Event()
    stream = until(source.events(), stop)

    async def read() -> None:
        async for _ in stream:
            pass

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(0.01)  # waiting for the source's next event
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)
    await stream.aclose()
    assert source.closed and reader.cancelled()
