"""Ollama's routes at the listener's root (``/api/...``): each a request of the model router's,
served through the gateway's one entrance (``OllamaRequest``), but those dgxmm does elsewhere.

- ``GET /api/version``, ``/api/tags``, ``/api/ps``: the router's list (``GET /v1/models``, a
  caller key's own models only), answered in Ollama's shapes (``views``); nothing starts.
- ``POST /api/show``: the entry of the model the body names in the router's list. Its small
  body (``SHOW_BYTES`` at most) is read before the gateway's checks; no other body is.
- ``POST /api/chat``, ``/api/generate``, ``/api/embed``, ``/api/embeddings``: the router's
  traffic, through the same slot, cold start and queue as ``/v1``.
- ``POST /api/pull`` of an ``hf.co`` name, with the admin token: into the model store, with
  Ollama's progress lines (``pull``).
- ``/api/pull`` of any other name, ``/api/push``, ``/api/create``, ``/api/copy``,
  ``/api/delete``: 501 or 403, saying where dgxmm does that (the model store, the admin API).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Protocol

from dgxmm.front.body import BodyTimeout, ClientGone
from dgxmm.gateway.collaborators import DeploymentPeek, OndemandStatus
from dgxmm.gateway.entrance import Entrance
from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.modelmeta import context_of
from dgxmm.gateway.router import LATEST
from dgxmm.gateway.request import Dialect, GatewayRequest
from dgxmm.ollama import modelinfo, views
from dgxmm.ollama.answers import error_line
from dgxmm.ollama.pull import Pulls, pull
from dgxmm.ollama.request import JSON, NotListed, OllamaRequest, Whole
from dgxmm.records.deployment import Deployment
from dgxmm.settings import Settings

PREFIX = "/api"
SHOW_BYTES = 64 * 1024  # a show body names a model: nothing longer is one
TRAFFIC = {"/api/chat": "chat", "/api/generate": "generate", "/api/embed": "embed", "/api/embeddings": "embeddings"}
READS = {"/api/version": "version", "/api/tags": "tags", "/api/ps": "ps"}
ELSEWHERE = {
    "/api/pull": (
        501,
        "dgxmm pulls hf.co/ORG/REPO[:QUANT] names here, with its admin token; any other model into its model "
        "store: POST {base}/api/models (the console's Models page)",
    ),
    "/api/push": (501, "dgxmm does not push models anywhere"),
    "/api/create": (
        403,
        "a model is a deployment in dgxmm: POST {base}/api/deployments (the admin API, or the console)",
    ),
    "/api/copy": (403, "a model's other names are its deployment's aliases: the admin API ({base}/api/deployments)"),
    "/api/delete": (403, "deployments are removed through the admin API (DELETE {base}/api/deployments/{{id}})"),
}


class Deployments(DeploymentPeek, Protocol):
    """The deployer, as Ollama's routes read it: a record by id and by name."""

    def by_name(self, name: str) -> Deployment | None: ...


class Timers(OndemandStatus, Protocol):
    """The controller, as ``/api/ps`` reads it: its status of a deployment and the idle timeout
    of its coming idle period (a caller's keep_alive, or the deployment's)."""

    def idle_timeout_of(self, dep: Deployment) -> float: ...


class OllamaApi:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.router = settings.router.path
        ollama = settings.ollama
        self.dialect = Dialect("ollama", keyless=ollama.keyless_key, translates=True)
        self.version = ollama.version
        self.base = settings.server.base_path

    @staticmethod
    def claims(path: str) -> bool:
        return path == PREFIX or path.startswith(PREFIX + "/")

    async def serve(
        self,
        req: GatewayRequest,
        entrance: Entrance,
        deployer: Deployments,
        controller: Timers,
        store: tuple[Pulls, str] | None = None,
    ) -> None:
        """One request under ``/api``; ``store``: the model store and the admin token its pulls take."""
        path, method = req.path.rstrip("/"), req.method
        wrapped: OllamaRequest | None = None
        if path == "/api/pull" and method == "POST" and store is not None:
            refusal = ELSEWHERE[path][1].format(base=self.base)
            await pull(req, store[0], store[1], self.settings.server.body_timeout_s, refusal)
            return
        if path in TRAFFIC and method == "POST":
            kind = TRAFFIC[path]
            endpoint = "embeddings" if kind in ("embed", "embeddings") else "chat/completions"

            def context(name: str, ex: Exchange) -> int | None:
                """The engine's context of ``name``, for the caller's key's models only."""
                plain = name.removesuffix(LATEST) if deployer.by_name(name) is None else name
                dep = deployer.by_name(plain)
                caller = ex.caller
                allowed = caller is not None and caller.allows(plain)
                return context_of(dep) if dep is not None and allowed else None

            wrapped = OllamaRequest(req, kind, f"{self.router}/{endpoint}", self.dialect, context=context)
        elif path in READS and method == "GET":
            kind = READS[path]
            wrapped = OllamaRequest(
                req, kind, f"{self.router}/models", self.dialect, self._reading(kind, deployer, controller)
            )
        elif path == "/api/show" and method == "POST":
            wrapped = await self._show(req, deployer)
            if wrapped is None:  # answered (a bad body), or the caller is gone
                return
        elif path in ELSEWHERE:
            status, message = ELSEWHERE[path]
            await req.respond(status, [JSON], error_line(message.format(base=self.base)))
            return
        if wrapped is None:
            await req.respond(404, [JSON], error_line(f"{method} {path[:200]} is not a route of Ollama's API"))
            return
        await entrance.serve(wrapped)

    def _reading(self, kind: str, deployer: Deployments, controller: Timers) -> Whole:
        """What the router's list becomes for a read route."""

        async def answer(listed: dict[str, Any], _req: OllamaRequest) -> dict[str, Any]:
            if kind == "version":
                return {"version": self.version}
            if kind == "tags":
                return views.tags(listed["data"], deployer.peek)
            return views.ps(listed["data"], deployer.peek, lambda dep: self._expiry(dep, controller))

        return answer

    def _expiry(self, dep: Deployment, controller: Timers) -> float | None:
        """When ``dep``'s idle timer would stop it (wall clock), None for never."""
        if not dep.is_on_demand:
            return None
        status = controller.status(dep.id)
        timeout = controller.idle_timeout_of(dep)
        if timeout == 0:  # never for idleness (keep_alive -1, idle_timeout_s = 0)
            return None
        if status["inflight"]:
            return time.time() + timeout
        return float(status["last_request_at"] or dep.state_changed_at) + timeout

    async def _show(self, req: GatewayRequest, deployer: DeploymentPeek) -> OllamaRequest | None:
        """The show request, its small body read first; None after answering a bad body. The
        model is looked for in the router's list, which holds a caller key's models only."""
        try:
            raw = await req.body(SHOW_BYTES, timeout_s=self.settings.server.body_timeout_s)
        except ClientGone:
            return None
        except BodyTimeout:
            await req.respond(408, [JSON, (b"connection", b"close")], error_line("the body made no progress"))
            return None
        try:
            body = json.loads(raw) if raw is not None else None
        except (ValueError, RecursionError):
            body = None
        name = (body.get("model") or body.get("name")) if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            await req.respond(400, [JSON], error_line('show takes a JSON body naming a model: {"model": NAME}'))
            return None

        async def answer(listed: dict[str, Any], _req: OllamaRequest) -> dict[str, Any]:
            for entry in listed["data"]:
                dep = deployer.peek(entry["dgxmm"]["deployment_id"])
                if dep is not None and name in (entry["id"], views.tagged(entry["id"])):
                    return views.show(dep, await asyncio.to_thread(modelinfo.read, dep))
            raise NotListed(f"model '{name[:200]}' not found")

        return OllamaRequest(req, "show", f"{self.router}/models", self.dialect, answer, early=raw)
