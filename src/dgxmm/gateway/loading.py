"""The router's load and unload routes (``routes.OWN``), which only the Ollama API's empty
prompt reaches: a load takes a slot the way traffic does (at once when the model is ready, else
through ``slotwait``: the start, make-room, the queue) and gives it back at once, sending the
engine nothing; an unload asks the controller to stop the model, which it does only while
nothing is in flight and nobody waits for it (``Controller.unload``). Each one done writes an
audit row (``load`` or ``unload``, actor ``gateway``) naming the caller's key: a caller stops or
starts what an administrator may be looking for."""

from __future__ import annotations

import asyncio
import time

from dgxmm.gateway.collaborators import Audit, Slots
from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.forward import Forwarder
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.responses import send_json
from dgxmm.gateway.routes import LOAD
from dgxmm.gateway.slotwait import wait_for_slot
from dgxmm.records.deployment import Deployment, State


async def load_or_unload(
    slots: Slots,
    forwarder: Forwarder,
    req: GatewayRequest,
    endpoint: str,
    dep: Deployment,
    ex: Exchange,
    audit: Audit | None = None,
) -> None:
    """Answer 200 ``{"done_reason": "load"|"unload"}`` once done, or refuse."""
    if endpoint == LOAD:
        if not dep.is_on_demand and dep.state is not State.READY:
            raise Refused(503, "not_on_demand", f"{dep.name} is always on and {dep.state}")
        if dep.is_on_demand:
            slot = slots.try_slot(dep.id)
            if slot is None:
                waited = await wait_for_slot(
                    slots, forwarder, None, req, endpoint, dep, asyncio.Event(), False, False, ex
                )
                if waited is None:  # refused, and answered
                    return
                slot = waited[0]
                ex.cold, ex.slot_at = slot.cold, time.monotonic()
            if ex.keep_alive is not None:
                slots.keep_alive(dep.id, ex.keep_alive)
            slot.release()
        reason = "load"
    else:
        if not dep.is_on_demand:
            raise Refused(409, "not_on_demand", f"{dep.name} is always on: the admin API stops it")
        if dep.state is not State.STOPPED and not await slots.unload(dep.id):
            raise Refused(409, "busy", f"{dep.name} is {dep.state} or has requests in flight: not stopped")
        reason = "unload"
    if audit is not None:
        key = ex.caller.name if ex.caller is not None else None
        text = f"{reason} of {dep.name} through the {ex.api} API by the key {key}"
        audit.audit(reason, actor="gateway", user=key, deployment_id=dep.id, text=text)
    ex.status = 200
    await send_json(req, 200, {"done_reason": reason}, ex.own_headers([ex.header]))
