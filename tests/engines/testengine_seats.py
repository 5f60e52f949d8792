"""The test engine's seats: how many requests it runs at once, the rest waiting in arrival order,
as an engine's ``max_num_seqs`` admits them. ``peak`` is what a test reads (``GET /_test/seats``)
to see that a limit in front of the engine held."""

from __future__ import annotations

import asyncio
from collections import deque


class Seats:
    """FIFO limiter of running requests, resizable live.

    asyncio.Semaphore cannot change its size, and /_test/config may change
    max_num_seqs while requests wait, so this keeps its own queue.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0
        self.peak = 0  # the most requests that ran at once (what a limit in front of it lets through)
        self._queue: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def acquire(self) -> None:
        """Take a seat, queueing behind earlier arrivals if none is free."""
        if self.running < self.limit and not self._queue:
            self.running += 1
            self.peak = max(self.peak, self.running)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut in self._queue:
                self._queue.remove(fut)
            elif fut.done() and not fut.cancelled():
                self.release()  # seat granted just as the client hung up
            raise

    def release(self) -> None:
        self.running -= 1
        self.wake()

    def wake(self) -> None:
        """Hand free seats to the oldest waiters (also after a resize)."""
        while self._queue and self.running < self.limit:
            fut = self._queue.popleft()
            if not fut.done():
                self.running += 1
                self.peak = max(self.peak, self.running)
                fut.set_result(None)
