"""Reading a request body's top level off the event loop when it is large.

A small body (at most ``jsonbody.FAST_BYTES``) is read on the loop: the hot path, microseconds.
A larger one is read in a worker thread, ``SCANS`` at a time, so that no caller waits behind a
large body's scan (numpy lets go of the GIL). A scan whose caller hung up still holds its place
until it ends (within a second for any body of 16 MiB).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from dgxmm.controller.errors import Refused
from dgxmm.front.body import Body
from dgxmm.gateway import jsonbody
from dgxmm.gateway.jsonbody import Facts
from dgxmm.gateway.toplevel import Shape

SCANS = 2  # bodies past jsonbody.FAST_BYTES read at once, each in a worker thread (2 cores)
T = TypeVar("T")


async def read_facts(scans: asyncio.Semaphore, body: Body) -> Facts:
    """What the gateway reads of ``body`` (``jsonbody``). A body nested past
    ``toplevel.MAX_DEPTH`` is refused: a Python engine could not parse it."""
    facts = await off_loop(scans, body, lambda: jsonbody.read(body))
    if facts.shape is Shape.TOO_DEEP:
        raise Refused(400, "invalid_json", "the JSON body is nested too deeply")
    return facts


async def off_loop(scans: asyncio.Semaphore, body: Body, read: Callable[[], T]) -> T:
    """``read()``, a reading of ``body``: on the loop when the body is small, else in a worker
    thread once one of ``scans`` is free."""
    if len(body) <= jsonbody.FAST_BYTES:
        return read()
    await scans.acquire()
    try:
        done = asyncio.get_running_loop().run_in_executor(None, read)
    except BaseException:
        scans.release()
        raise
    done.add_done_callback(lambda _: scans.release())
    return await asyncio.shield(done)
