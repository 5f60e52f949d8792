"""An in-process stand-in of LiteLLM's model admin API, behaving as the real one was observed to
(LiteLLM 1.108.7 through scripts/litellm-proxy.sh): reads omit ``litellm_params.api_key`` but keep custom
``model_info`` keys; each entry gets ``model_info.id``; deleting an unknown id is a 400; every
call needs the master key; ``PATCH /model/{id}/update`` merges ``litellm_params`` and
``model_info`` key by key and keeps the id (404 for an unknown id). Switches make it slow or
failing."""

from __future__ import annotations

import asyncio
import copy
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class StandIn:
    master_key: str = "sk-master"
    entries: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of each call
    delay_s: float = 0.0
    fail_status: int | None = None  # answer every call with this status
    fail_writes: int = 0  # fail the next N add/update/delete calls with 500
    no_update: bool = False  # answer PATCH /model/{id}/update with 405, as a LiteLLM without it
    concurrent: int = 0
    max_concurrent: int = 0
    runner: web.AppRunner | None = None
    url: str = ""

    def writes(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] != "GET"]

    def by_name(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.entries if e["model_name"] == name]

    def add_manual(self, name: str, api_base: str) -> None:
        self.entries.append(
            {
                "model_name": name,
                "litellm_params": {"model": f"openai/{name}", "api_base": api_base, "api_key": "k"},
                "model_info": {"id": str(uuid.uuid4())},
            }
        )

    async def _handle(self, request: web.Request) -> web.Response:
        self.calls.append((request.method, request.path))
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if request.headers.get("Authorization") != f"Bearer {self.master_key}":
                return web.json_response({"error": "Authentication Error"}, status=401)
            if self.fail_status:
                return web.json_response({"error": "down"}, status=self.fail_status)
            if request.method != "GET" and self.fail_writes:
                self.fail_writes -= 1
                return web.json_response({"error": "No DB Connected"}, status=500)
            return await self._route(request)
        finally:
            self.concurrent -= 1

    async def _route(self, request: web.Request) -> web.Response:
        if request.method == "GET" and request.path in ("/model/info", "/v2/model/info"):
            data = []
            for entry in self.entries:
                shown = copy.deepcopy(entry)
                shown["litellm_params"].pop("api_key", None)
                data.append(shown)
            return web.json_response({"data": data})
        body = await request.json()
        if request.method == "PATCH" and request.path.startswith("/model/") and request.path.endswith("/update"):
            return self._update(request.path.split("/")[2], body)
        if request.path == "/model/new":
            entry = copy.deepcopy(body)
            entry.setdefault("model_info", {})["id"] = str(uuid.uuid4())
            self.entries.append(entry)
            return web.json_response({"model_id": entry["model_info"]["id"]})
        if request.path == "/model/delete":
            before = len(self.entries)
            self.entries = [e for e in self.entries if e["model_info"]["id"] != body.get("id")]
            if len(self.entries) == before:
                return web.json_response({"error": f"model {body.get('id')} not found"}, status=400)
            return web.json_response({"message": "deleted"})
        return web.json_response({"error": "not found"}, status=404)

    def _update(self, entry_id: str, body: dict[str, Any]) -> web.Response:
        if self.no_update:
            return web.json_response({"detail": "Method Not Allowed"}, status=405)
        entry = next((e for e in self.entries if e["model_info"]["id"] == entry_id), None)
        if entry is None:
            return web.json_response(
                {"error": {"message": f"Model {entry_id} not found on proxy.", "code": "404"}}, status=404
            )
        for part in ("litellm_params", "model_info"):
            entry[part].update({k: v for k, v in (body.get(part) or {}).items() if v is not None})
        entry["model_info"]["id"] = entry_id
        return web.json_response({"model_id": entry_id, "model_name": entry["model_name"]})

    async def start(self) -> StandIn:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
