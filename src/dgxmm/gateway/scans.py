"""Reading what the gateway needs of a body: its facts (``jsonbody``), the model it names
(``modelname``) and what a quota key's request asks (``quota``), on the loop when the body is small (the hot path: microseconds), else in a
worker thread, ``SCANS`` at a time, so that no caller waits behind a large body's scan (numpy
and python-multipart's boundary search let go of the GIL).

A scan whose caller hung up still holds its place until it ends (within a second for any body
of 16 MiB): a thread cannot be stopped, and its place is what bounds the threads at work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from dgxmm.gateway.refused import Refused
from dgxmm.front.body import Body
from dgxmm.gateway import jsonbody, modelname
from dgxmm.gateway.jsonbody import Facts
from dgxmm.gateway.toplevel import Shape

SCANS = 2  # bodies past jsonbody.FAST_BYTES read at once, each in a worker thread (2 cores)

T = TypeVar("T")


class Scans:
    """The gateway's worker-thread scans of large bodies, ``SCANS`` at a time."""

    def __init__(self) -> None:
        self._places = asyncio.Semaphore(SCANS)

    async def facts(self, body: Body) -> Facts:
        """What the gateway reads of ``body`` (``jsonbody.read``). A body nested past
        ``toplevel.MAX_DEPTH`` is refused: a Python engine could not parse it."""
        small = len(body) <= jsonbody.FAST_BYTES
        facts = jsonbody.read(body) if small else await self._in_worker(lambda: jsonbody.read(body))
        if facts.shape is Shape.TOO_DEEP:
            raise Refused(400, "invalid_json", "the JSON body is nested too deeply")
        return facts

    async def name(self, body: Body, facts: Facts, content_type: str | None) -> modelname.Named:
        """The model ``body`` names (``modelname.named``): a JSON body's from its ``facts``; a
        form is read to its end (its last ``model`` field wins), past ``jsonbody.FAST_BYTES``
        in a worker thread. A body that names none is refused (400)."""
        try:
            if len(body) <= jsonbody.FAST_BYTES or facts.shape is Shape.OBJECT:
                return modelname.named(body, facts, content_type)
            return await self._in_worker(lambda: modelname.named(body, facts, content_type))
        except modelname.NoModel as exc:
            raise Refused(400, exc.code, str(exc)) from None

    async def reading(self, body: Body, read: Callable[[], T]) -> T:
        """``read()``, a reading of ``body``: on the loop when the body is small, else in a
        worker thread once a place is free."""
        return read() if len(body) <= jsonbody.FAST_BYTES else await self._in_worker(read)

    async def _in_worker(self, read: Callable[[], T]) -> T:
        await self._places.acquire()
        try:
            done = asyncio.get_running_loop().run_in_executor(None, read)
        except BaseException:
            self._places.release()
            raise
        done.add_done_callback(lambda _: self._places.release())
        return await asyncio.shield(done)
