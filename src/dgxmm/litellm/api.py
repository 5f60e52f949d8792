"""LiteLLMAdmin: the few calls of LiteLLM's model admin API that dgxmm makes.

Shared by the sync (``sync.py``) and ``dgxmm litellm purge`` (``purge.py``). Every call
is authenticated with LiteLLM's master key, read from its file on each use so a rotated master key
needs no restart. Any answer of 300 or more is a ``SyncError`` naming the call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from dgxmm.settings import LiteLLMSettings


class SyncError(Exception):
    pass


class LiteLLMAdmin:
    def __init__(self, settings: LiteLLMSettings, http: aiohttp.ClientSession) -> None:
        self.settings = settings
        self._http = http
        self.writes = 0  # add, update and delete calls made, for tests and the host view

    def master_key(self) -> str:
        path = self.settings.master_key_file
        try:
            key = Path(path).read_text().strip() if path else ""
        except OSError as exc:
            raise SyncError(f"cannot read litellm.master_key_file: {exc.strerror}") from None
        if not key:
            raise SyncError("no LiteLLM master key (litellm.master_key_file)")
        return key

    async def entries(self, master: str) -> list[dict[str, Any]]:
        """Every model entry LiteLLM has (``/v2/model/info``, else the older ``/model/info``)."""
        try:
            body = await self.call("GET", "/v2/model/info", master)
        except SyncError:
            body = await self.call("GET", "/model/info", master)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise SyncError("LiteLLM's model list has no 'data' list")
        return [e for e in data if isinstance(e, dict)]

    async def add(self, master: str, body: dict[str, Any]) -> None:
        await self.call("POST", "/model/new", master, body)

    async def update(self, master: str, entry_id: str, body: dict[str, Any]) -> None:
        """Change some fields of an entry in place; it keeps its id, so it never goes missing.
        LiteLLM merges ``litellm_params`` and ``model_info`` key by key (the stored key stays)."""
        await self.call("PATCH", f"/model/{entry_id}/update", master, body)

    async def delete(self, master: str, entry_id: str) -> None:
        await self.call("POST", "/model/delete", master, {"id": entry_id})

    async def call(self, method: str, path: str, master: str, body: Any = None) -> Any:
        url = (self.settings.url or "").rstrip("/") + path
        headers = {"Authorization": f"Bearer {master}"}
        timeout = aiohttp.ClientTimeout(total=60)
        if method != "GET":
            self.writes += 1
        async with self._http.request(method, url, json=body, headers=headers, timeout=timeout) as resp:
            text = await resp.text()
            if resp.status >= 300:
                raise SyncError(f"{method} {path}: HTTP {resp.status}: {text[:200]}")
        try:
            return json.loads(text) if text else None
        except ValueError:
            raise SyncError(f"{method} {path}: answer is not JSON") from None
