"""How the gateway answers a request it refuses or fails, and one it ends under way.

A refusal is the service's error envelope with its status, or, once an SSE answer began (a
queued notice was sent), the error event and ``[DONE]``. The failures of a request dgxmm
accepted are one warning line each, with the request id. A request ended under way
(``inflight``: its key revoked or narrowed, its expiry, or an administrator's ``end-requests``)
gets the same answer where it can still be read as one, else its connection cut short.
"""

from __future__ import annotations

import asyncio
import logging

from dgxmm.controller.errors import OndemandError
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.responses import send_error, sse_error
from dgxmm.logs import fields

log = logging.getLogger(__name__)

# Refusals that are failures of a request dgxmm accepted: logged as warnings with the request id.
FAILURES = frozenset(
    {
        "ondemand_queue_full",
        "ondemand_queue_timeout",
        "does_not_fit",
        "start_failed",
        "ondemand_stopped",
        "ondemand_cancelled",
        "shutting_down",
        "key_revoked",  # the ends of requests under way (``ended``)
        "model_not_allowed",
        "request_ended",
    }
)
ENDED_WRITE_S = 5  # how long an ended request's error may wait for its caller to read it


async def refuse(req: GatewayRequest, ex: Exchange, exc: OndemandError, started: bool = False) -> None:
    """Answer the error (inside the SSE answer when it already began) and note it."""
    ex.code = exc.code
    if exc.code in FAILURES:
        log.warning(
            "request failed: %s: %s",
            exc.code,
            exc.message,
            extra=fields(ex.deployment_id, ex.served_name, ex.request_id, ex.peer),
        )
    if started:
        await req.end(sse_error(exc.status, exc.code, exc.message))
    else:
        ex.status = exc.status
        headers = [ex.header, (b"connection", b"close")] if exc.close else [ex.header]
        await send_error(req, exc.status, exc.code, exc.message, exc.retry_after, headers)


async def ended(req: GatewayRequest, ex: Exchange, reason: Refused) -> None:
    """The request was ended under way with ``reason``: its error answer while none began, its
    error event when an event stream began and stopped between two events (``ex.between_events``),
    else its connection cut short, as for an engine that broke off (``forward``). A caller that
    reads nothing more does not hold it past ``ENDED_WRITE_S``."""
    try:
        async with asyncio.timeout(ENDED_WRITE_S):
            if not req.response_started or ex.between_events:
                await refuse(req, ex, reason, req.response_started)
                return
    except TimeoutError:
        pass
    ex.code = reason.code
    req.cut()
