"""llama-server's ``GET /props?model=NAME`` through the router (``routes.PROPS``, which only
llama.cpp's API at the root reaches, ``llamacpp.api``): clients of many-model servers (the
``pi`` agent's ``pi-llama``, Open WebUI) read a model's context and settings there.

A ready llama.cpp engine knows its own props: the request is forwarded to its ``/props`` and
its answer passed on unchanged (no slot: it reads, as the per-deployment model entry does).
Any other model (stopped, asleep, starting, failed) or engine kind (vLLM, SGLang and commands
serve no ``/props``) gets the little dgxmm can say truthfully without it: the context where
known (``modelmeta``), the served name, the load state, and the model's path to the key
file's key only (a caller key learns no path of the host). Nothing here starts or wakes a
model. A caller key that may not call the model gets the 404 a load would give it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from dgxmm.gateway.exchange import Exchange, model_given
from dgxmm.gateway.forward import Forwarder
from dgxmm.gateway.heads import Heads
from dgxmm.gateway.keyrecord import KEY_FILE
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.responses import send_json
from dgxmm.gateway.router import Router
from dgxmm.records.deployment import Role, State

SERVES_PROPS = frozenset({"llamacpp"})  # engine kinds whose server answers GET /props
MAX_NAME_SHOWN = 200


async def answer(router: Router, forwarder: Forwarder, req: GatewayRequest, heads: Heads, ex: Exchange) -> None:
    """The engine's own ``/props`` for a ready llama.cpp model, else dgxmm's; or refuse."""
    names = parse_qs(req.query.decode("latin-1")).get("model")
    if not names or not names[-1]:
        raise Refused(400, "invalid_request", "GET /props?model=NAME: the query names the model")
    name = names[-1]
    caller = ex.caller
    assert caller is not None  # (the key was checked)
    ex.model = model_given(name)
    unknown = Refused(404, "model_not_found", f"the model {name[:MAX_NAME_SHOWN]!r} does not exist on this host")
    dep = router.find(name)
    if dep is None or dep.role is Role.DECIDER or not caller.allows(router.canonical(name)):
        raise unknown
    ex.deployment_id, ex.served_name = dep.id, dep.served_name
    if dep.state is State.READY and dep.engine in SERVES_PROPS:
        await forwarder.forward(req, heads, dep, "props", bytearray(), ex)
        return
    await router.contexts.learn((dep,))
    entry = router.model(name)
    if entry is None:  # deleted while its header was read
        raise unknown
    meta = entry.get("meta", {})
    out: dict[str, Any] = {
        "default_generation_settings": {"n_ctx": meta["n_ctx"]} if "n_ctx" in meta else {},
        "model_alias": dep.served_name,
        "status": entry["status"],
    }
    if caller is KEY_FILE:
        out["model_path"] = dep.model_path or dep.model
    ex.status = 200
    await send_json(req, 200, out, [ex.header])
