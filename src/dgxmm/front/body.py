"""A request body read whole, within its limits: never more than the limit buffered, never a wait
without end, never more bodies held at once than the budget allows.

The admin API's guard and the gateway both need the body before they act (the guard replays it
to the app after the token check; the gateway checks and forwards it), and both must refuse a
body past their limit before holding it. One reader, so the limits are enforced the same way:

* **Size.** ``None`` as soon as the body passes ``limit`` bytes (the caller answers 413).
* **Progress.** ``BodyTimeout`` when no byte of it came for ``timeout_s`` (``[server]
  body_timeout_s``): a request with a head and an unfinished body would otherwise hold its
  place for as long as its client likes (the caller answers 408 and closes the connection).
* **All bodies together.** With a ``BodyBudget``, the bytes of every body being read or held may
  not pass its limit: ``OverBudget`` for the body that would (the caller answers 503), so many
  large bodies held open at once cannot grow dgxmm's memory without bound.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive


class ClientGone(Exception):
    """The caller hung up before its body was read: there is nobody to answer."""


class BodyTimeout(Exception):
    """No byte of the body came within the timeout."""


class OverBudget(Exception):
    """The bodies held at once would pass the budget."""


class BodyBudget:
    """Bytes of request bodies held at once, in all: ``take`` refuses what would pass ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        self.held -= size

    def resize(self, old: int, new: int) -> None:
        """A body held is replaced by one of another size (the router's served name in place of
        an alias): the budget counts the new one, even past its limit (by a name's length)."""
        self.held += new - old


async def read_body(
    receive: Receive, limit: int, *, timeout_s: float | None = None, budget: BodyBudget | None = None
) -> bytes | None:
    """The whole body, or None as soon as it passes ``limit``; ClientGone on a disconnect,
    BodyTimeout, OverBudget. With a ``budget``, the caller owns ``len(body)`` of it on success and
    gives it back when it is done with the body; on every other outcome it was given back here."""
    chunks: list[bytes] = []
    size = 0
    kept = False  # the caller owns what was taken (the whole body came)
    try:
        while True:
            try:
                async with asyncio.timeout(timeout_s):
                    message = await receive()
            except TimeoutError:
                raise BodyTimeout from None
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk: bytes = message.get("body", b"")
            if size + len(chunk) > limit:
                return None
            if budget is not None and not budget.take(len(chunk)):
                raise OverBudget
            size += len(chunk)
            chunks.append(chunk)
            if not message.get("more_body", False):
                kept = True
                return b"".join(chunks)
    finally:
        if budget is not None and not kept:
            budget.give(size)
