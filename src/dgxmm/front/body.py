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
import ctypes
import ctypes.util
import logging

from starlette.types import Receive

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 128 * 1024  # glibc's default, held fixed


Body = bytes | bytearray  # a request body as read (``read_buffer``) or rewritten (an alias renamed)


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


def return_freed_bodies() -> None:
    """Keep glibc's malloc giving every large block (a body, an answer) its own mapping, so that
    freeing one returns its memory. By default glibc raises that threshold to the size of the
    largest mapped block freed so far (up to 32 MiB): after one 16 MiB body, the next ones come
    from the heap, and their memory stays with the process once they are gone (a hostile test
    saw 4 held bodies cost 113 MiB, not 64). Setting the threshold fixes it at its default."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = getattr(libc, "mallopt", None)
    except OSError:
        mallopt = None
    if mallopt is None or not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        log.debug("malloc's mapping threshold is not settable here (not glibc)")


async def read_body(
    receive: Receive, limit: int, *, timeout_s: float | None = None, budget: BodyBudget | None = None
) -> bytes | None:
    """``read_buffer``'s body as bytes (the admin API's: small, replayed to the app)."""
    body = await read_buffer(receive, limit, timeout_s=timeout_s, budget=budget)
    return None if body is None else bytes(body)


async def read_buffer(
    receive: Receive, limit: int, *, timeout_s: float | None = None, budget: BodyBudget | None = None
) -> bytearray | None:
    """The whole body, or None as soon as it passes ``limit``; ClientGone on a disconnect,
    BodyTimeout, OverBudget. With a ``budget``, the caller owns ``len(body)`` of it on success and
    gives it back when it is done with the body; on every other outcome it was given back here.
    The pieces are appended to one buffer as they come, never joined: a body is held once, not
    twice while its pieces are put together (a large buffer grows in place)."""
    body = bytearray()
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
            if len(body) + len(chunk) > limit:
                return None
            if budget is not None and not budget.take(len(chunk)):
                raise OverBudget
            body += chunk
            if not message.get("more_body", False):
                kept = True
                return body
    finally:
        if budget is not None and not kept:
            budget.give(len(body))
