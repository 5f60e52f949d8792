"""A traffic request's wait for a slot, off the hot path: the controller may start the model,
make room or queue it. A queued streaming chat or completions request gets its notice the
moment it queues, or, when its caller asked for progress, its SSE answer at once with the wait's
lines as reasoning (progress.py); a request that goes away while it waits stops waiting, and
gives back a slot granted at that very moment."""

from __future__ import annotations

import asyncio
import time

from dgxmm.controller.errors import OndemandError
from dgxmm.controller.slots import Slot
from dgxmm.gateway import notice
from dgxmm.gateway.collaborators import Slots, TrafficObserver
from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.forward import Forwarder
from dgxmm.gateway.progress import Told
from dgxmm.gateway.refusal import refuse
from dgxmm.gateway.request import GatewayRequest
from dgxmm.records.deployment import Deployment


async def wait_for_slot(
    slots: Slots,
    forwarder: Forwarder,
    observer: TrafficObserver | None,
    req: GatewayRequest,
    endpoint: str,
    dep: Deployment,
    queued: asyncio.Event,
    notice_stream: bool,
    notice_body: bool,
    ex: Exchange,
    told: Told | None = None,
) -> tuple[Slot, bool] | None:
    """Wait for a slot of ``slots`` (the controller), telling the caller of it as ``told`` says
    (then no notice). Returns the slot and whether the SSE answer already began, or None after
    answering an error (the ``observer`` told of it)."""
    acquiring = asyncio.create_task(
        slots.acquire(
            dep.id,
            on_queued=queued.set if (notice_stream or notice_body) else None,
            arrival=ex.arrival,
            request_id=ex.request_id,
            priority=ex.priority,
        )
    )
    started = False
    try:
        if told is not None:
            await forwarder.start_sse(req, ex)
            ex.first_byte = time.monotonic()
            started = ex.between_events = True
            await told.until(req, acquiring, ex.arrival)
        elif notice_stream:
            queued_wait = asyncio.create_task(queued.wait())
            try:
                await asyncio.wait([acquiring, queued_wait], return_when=asyncio.FIRST_COMPLETED)
            finally:
                queued_wait.cancel()  # also on a hang-up: no task left waiting forever
            if queued.is_set():
                await forwarder.start_sse(req, ex)
                ex.first_byte = time.monotonic()
                await req.write(notice.stream_chunk(endpoint, dep.served_name))
                started = ex.between_events = True
        return await acquiring, started
    except OndemandError as exc:
        if observer is not None:
            observer.refused(dep.id, exc.code)
        await refuse(req, ex, exc, started)
        return None
    except BaseException:
        await _abandon(acquiring)
        raise


async def _abandon(acquiring: asyncio.Task[Slot]) -> None:
    """The request is going away while it waited for a slot: stop waiting, and release a slot
    that was granted at that very moment."""
    if not acquiring.done():
        acquiring.cancel()
        await asyncio.gather(acquiring, return_exceptions=True)
    if not acquiring.cancelled() and acquiring.exception() is None:
        acquiring.result().release()
