"""llama-swap's unload routes, for the scripts written against llama-swap, answered from the
same unload as llama.cpp's ``POST /models/unload`` (the router's unload route, the controller's
precheck, the audit row, the activity record):

- ``POST /api/models/unload/{model}``: that model (the rest of the path, slashes and all, as
  llama-swap reads it) stopped, answered ``OK`` as llama-swap answers; the errors are the
  gateway's (404 for a model the key may not call, 409 for a busy one).
- ``POST /api/models/unload``: llama-swap stops every model at once, busy or not; dgxmm stops
  every on-demand model that is loaded and idle, among those the caller's key may call, one
  unload each (the same precheck: a model with requests in flight or waiting is kept), and
  answers llama-swap's ``{"msg": "ok"}`` with what it stopped and what it kept and why.

Ollama's API holds the rest of ``/api``: these two paths are claimed before it (``asgi``), and
only where ``/api`` at the root is not the admin API's (a base path is set).
"""

from __future__ import annotations

import json
from typing import Any

from dgxmm.gateway.entrance import Entrance
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.responses import send_error, send_json
from dgxmm.gateway.routes import UNLOAD
from dgxmm.llamacpp.request import Kept, ModelsRequest

UNLOAD_PATH = "/api/models/unload"


async def serve(req: GatewayRequest, entrance: Entrance, router: str) -> None:
    """A request whose path begins with ``UNLOAD_PATH`` (``/api/models/unloaded`` is no route)."""
    if req.path != UNLOAD_PATH and not req.path.startswith(UNLOAD_PATH + "/"):
        await send_error(req, 404, "not_found", "Not Found")
        return
    if req.method != "POST":
        await send_error(req, 405, "method_not_allowed", f"{req.path[:200]} answers POST")
        return
    name = req.path[len(UNLOAD_PATH) + 1 :].strip("/")
    if name:
        await entrance.serve(ModelsRequest(req, UNLOAD, f"{router}/{UNLOAD}", named=name))
        return
    listing = Kept(req, "models", f"{router}/models")
    await entrance.serve(listing)  # the caller key's models, checked as every request is
    if listing.answer[0] != 200:
        await req.respond(*listing.answer)
        return
    unloaded: list[str] = []
    kept: list[dict[str, Any]] = []
    for entry in json.loads(listing.answer[2])["data"]:
        idle = entry["status"]["value"] == "loaded" and entry["dgxmm"]["mode"] == "on_demand"
        if not idle or entry["dgxmm"]["alias"]:
            continue
        one = Kept(req, UNLOAD, f"{router}/{UNLOAD}", named=entry["id"])
        await entrance.serve(one)
        status, _, body = one.answer
        if status == 200:
            unloaded.append(entry["id"])
        else:
            kept.append({"model": entry["id"], "error": json.loads(body).get("error")})
    await send_json(req, 200, {"msg": "ok", "unloaded": unloaded, "kept": kept})
