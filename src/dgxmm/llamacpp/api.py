"""llama.cpp's model-management routes at the listener's root, each one of the model router's
requests in another shape (``request.ModelsRequest``), served through the gateway's one entrance with
every check ``/v1`` makes (peer guard, key, rate limit, the caller key's models, the activity
log, labelled ``llamacpp``):

- ``GET /models``: the router's list (``GET /v1/models``), whose entries carry llama.cpp's
  ``status`` (``gateway.modelstatus``); nothing starts.
- ``POST /models/load {"model": NAME}``: the model started as a first request would start it
  (its slot at once when it is ready, else the start, make-room or the queue; a caller key that
  may not call it may not load it), answered ``{"success": true}`` once it is ready, or with the
  error a request would get. The router's load route (``gateway.loading``), sending the engine
  nothing.
- ``POST /models/unload {"model": NAME}``: the model stopped through the controller's unload,
  which never stops one with requests in flight or waiting (409, as for Ollama's unload); an
  always-on model is 403 (the admin API stops it).
- ``GET /running``: llama-swap's list of what runs now, from the same list; and llama-swap's
  ``POST /api/models/unload[/{model}]`` (``swap``) from the same unload.
- ``GET /models/sse``: each change of a model's load state, as llama.cpp's router streams it
  (``sse``).
- ``GET /props?model=NAME``: llama-server's props of a ready llama.cpp model, its own answer;
  of any other, what dgxmm knows without starting or waking it (``gateway.props``).
- ``POST /infill``, ``/completion`` (llama-server's own, which editors' completion and its native
  clients call) and ``/reranking``: the router's traffic by the body's ``model``, cold start
  included, forwarded to the engine's ``/infill``, ``/completion`` and ``/v1/reranking``, the body
  and the answer (a stream too) passed through as they are.
"""

from __future__ import annotations

import asyncio

from dgxmm.events import EventBus
from dgxmm.gateway.entrance import Entrance
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.responses import send_error
from dgxmm.gateway.routes import LOAD, PROPS, UNLOAD
from dgxmm.llamacpp import sse, swap
from dgxmm.llamacpp.request import ModelsRequest

ROUTES = {("GET", "/models"): "models", ("GET", "/running"): "running", ("GET", "/props"): PROPS}
ROUTES |= {("GET", "/models/sse"): "sse"}
ROUTES |= {("POST", "/models/load"): LOAD, ("POST", "/models/unload"): UNLOAD}
ROUTES |= {("POST", "/infill"): "infill", ("POST", "/completion"): "completion", ("POST", "/reranking"): "reranking"}
READS = frozenset({"/models", "/running", "/props", "/models/sse"})
PATHS = frozenset(path for _, path in ROUTES)


class ModelsApi:
    def __init__(self, router: str, swap_unload: bool = True) -> None:
        self.router = router  # the model router's path (``[router] path``)
        # llama-swap's unload at /api/models/unload (``swap``), where /api is not the admin API's.
        self.swap_unload = swap_unload

    def claims(self, path: str) -> bool:
        """Asked of every request, ``/v1``'s included: a test here, no call further."""
        return path.rstrip("/") in PATHS or (self.swap_unload and path.startswith(swap.UNLOAD_PATH))

    async def serve(self, req: GatewayRequest, entrance: Entrance, bus: EventBus, stopping: asyncio.Event) -> None:
        """``bus`` and ``stopping``: what ``/models/sse`` follows, and when it ends."""
        if self.swap_unload and req.path.startswith(swap.UNLOAD_PATH):
            await swap.serve(req, entrance, self.router)
            return
        route = ROUTES.get((req.method, req.path.rstrip("/")))
        if route is None:
            allowed = "GET" if req.path.rstrip("/") in READS else "POST"  # (of PATHS)
            await send_error(req, 405, "method_not_allowed", f"{req.path[:200]} answers {allowed}")
            return
        if route == "sse":
            await sse.serve(req, entrance, self.router, bus, stopping)
            return
        routed = f"{self.router}/models" if route in ("models", "running") else f"{self.router}/{route}"
        await entrance.serve(ModelsRequest(req, route, routed))
