"""LiteLLMSync: keeps LiteLLM's model list in step with dgxmm's deployments.

Always-on deployments are registered pointing at their engine while it is ready; on-demand ones
in every state but failed, pointing at the gateway with the on-demand key, so the model name stays
callable while the engine is stopped. Each sync reads LiteLLM's entries, computes the entries it
should have (``desired``, a pure function), then adds before it deletes, so a name never goes
missing during a switch. Only entries whose ``model_info`` carries ``dgxmm_id`` are touched.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from dgxmm.deploy.deployer import Change, Deployer
from dgxmm.deploy.models import Deployment, State
from dgxmm.ondemand.keys import fingerprint
from dgxmm.settings import LiteLLMSettings, OndemandSettings

log = logging.getLogger(__name__)

HEALTH_CHECK_PARAMS = {"extra_headers": {"x-dgxmm-health-check": "1"}}
TRIGGER_STATES = frozenset({State.READY, State.FAILED, State.PLANNED})


class SyncError(Exception):
    pass


class PartialSync(SyncError):
    """Some writes failed; the statuses of the others are known."""


@dataclass(frozen=True)
class Entry:
    """One model entry as dgxmm wants it in LiteLLM."""

    deployment_id: str
    model_name: str
    litellm_params: dict[str, Any]
    model_info: dict[str, Any]

    def body(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "litellm_params": self.litellm_params,
                "model_info": self.model_info}  # fmt: skip

    def matches(self, existing: dict[str, Any]) -> bool:
        """Whether an entry read back from LiteLLM (which omits api_key) is this one."""
        params = existing.get("litellm_params") or {}
        info = existing.get("model_info") or {}
        return (
            existing.get("model_name") == self.model_name
            and params.get("api_base") == self.litellm_params["api_base"]
            and params.get("model") == self.litellm_params["model"]
            and all(info.get(k) == v for k, v in self.model_info.items() if k.startswith("dgxmm_"))
            and all(k in info for k in self.model_info)
        )


def request_timeout(ondemand: OndemandSettings) -> float:
    """A request may wait the whole queue limit for memory, plus the start."""
    return max(1200.0, ondemand.queue_timeout_s + 600.0)


def gateway_extras(ondemand: OndemandSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """The litellm_params and model_info an on-demand entry adds to an always-on one."""
    timeout = request_timeout(ondemand)
    params = {"timeout": timeout, "stream_timeout": timeout, "num_retries": 0}
    return params, {"health_check_params": HEALTH_CHECK_PARAMS}


def params_fingerprint(ondemand: OndemandSettings) -> str:
    params, info = gateway_extras(ondemand)
    text = json.dumps({"litellm_params": params, "model_info": info}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def desired(
    deployments: list[Deployment], key: str | None, internal_url: str, ondemand: OndemandSettings
) -> tuple[list[Entry], set[str]]:
    """The entries dgxmm wants, and the ids of on-demand deployments it cannot register now
    because no key is readable (their existing entries are left alone)."""
    entries: list[Entry] = []
    unkeyed: set[str] = set()
    for dep in deployments:
        if dep.is_on_demand:
            if dep.state is State.FAILED:
                continue
            if key is None:
                unkeyed.add(dep.id)
                continue
            params, info = gateway_extras(ondemand)
            entries.append(Entry(dep.id, dep.served_name, {
                "model": f"openai/{dep.served_name}",
                "api_base": f"{internal_url.rstrip('/')}/ondemand/{dep.id}/v1",
                "api_key": key, **params,
            }, {"dgxmm_id": dep.id, "dgxmm_key_fp": fingerprint(key),
                "dgxmm_params_fp": params_fingerprint(ondemand), **info}))  # fmt: skip
        elif dep.state is State.READY and dep.base_url:
            entries.append(Entry(dep.id, dep.served_name, {
                "model": f"openai/{dep.served_name}", "api_base": f"{dep.base_url}/v1",
                "api_key": "dgxmm-direct",
            }, {"dgxmm_id": dep.id}))  # fmt: skip
    return entries, unkeyed


def wants_sync(change: Change) -> bool:
    """Creation, removal, entering or leaving ready/failed/planned, and a change of mode."""
    dep, old = change.deployment, change.old
    if change.kind in ("created", "removed"):
        return True
    if change.kind == "state":
        return dep.state in TRIGGER_STATES or change.old_state in TRIGGER_STATES
    return old is not None and (
        old.effective_mode != dep.effective_mode or old.pending_mode != dep.pending_mode
    )


@dataclass
class SyncStatus:
    ready: bool = False
    error: str | None = None
    per_deployment: dict[str, dict[str, Any]] = field(default_factory=dict)


class LiteLLMSync:
    def __init__(
        self,
        settings: LiteLLMSettings,
        ondemand: OndemandSettings,
        deployer: Deployer,
        current_key: Callable[[], str | None],
        http: aiohttp.ClientSession,
        on_status: Callable[[str], None] = lambda deployment_id: None,
    ) -> None:
        self.settings = settings
        self._ondemand = ondemand
        self._deployer = deployer
        self._current_key = current_key
        self._http = http
        self._on_status = on_status
        self.state = SyncStatus()
        self.writes = 0  # add and delete calls made, for tests and the host view
        self._wanted = asyncio.Event()
        self._lock = asyncio.Lock()  # syncs never overlap

    @property
    def ready(self) -> bool:
        return self.settings.enabled and self.state.ready

    def status(self, deployment_id: str) -> dict[str, Any]:
        if not self.settings.enabled:
            return {"status": "disabled", "error": None}
        return self.state.per_deployment.get(deployment_id, {"status": "pending", "error": None})

    def trigger(self) -> None:
        self._wanted.set()

    def on_change(self, change: Change) -> None:
        """Deployer listener: sync when a deployment enters or leaves ready, failed or planned,
        is removed, or changes mode."""
        if wants_sync(change):
            self.trigger()

    async def run(self) -> None:
        """Sync on every trigger and every ``sync_interval_s``; one sync at a time."""
        while True:
            try:
                async with asyncio.timeout(self.settings.sync_interval_s):
                    await self._wanted.wait()
            except TimeoutError:
                pass
            self._wanted.clear()
            await self.sync_once()

    async def sync_once(self) -> bool:
        async with self._lock:
            try:
                await self._sync()
            except PartialSync as exc:
                self._fail(str(exc), everyone=False)
                return False
            except SyncError as exc:
                self._fail(str(exc), everyone=True)
                return False
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                self._fail(f"LiteLLM unreachable: {type(exc).__name__}: {exc}", everyone=True)
                return False
            return True

    def _fail(self, message: str, *, everyone: bool) -> None:
        """The sync did not finish: LiteLLM is not ready; retried on the next trigger."""
        if self.state.ready or self.state.error != message:
            log.warning("LiteLLM sync failed: %s", message)
        self.state.ready = False
        self.state.error = message
        if everyone:
            for dep in self._deployer.all():
                self._set(dep.id, "error", "litellm_unavailable")

    def _set(self, deployment_id: str, status: str, error: str | None) -> None:
        new = {"status": status, "error": error}
        if self.state.per_deployment.get(deployment_id) != new:
            self.state.per_deployment[deployment_id] = new
            self._on_status(deployment_id)

    async def _sync(self) -> None:
        master = self._master_key()
        existing = [e for e in await self._entries(master) if (e.get("model_info") or {}).get("dgxmm_id")]
        deployments = self._deployer.all()
        key = self._current_key()
        wanted, unkeyed = desired(deployments, key, self.settings.internal_url, self._ondemand)
        kept: set[int] = set()
        problems: list[str] = []
        for entry in wanted:  # adds first: a name is never missing during a switch
            match = next((i for i, e in enumerate(existing) if i not in kept and entry.matches(e)), None)
            if match is not None:
                kept.add(match)
                self._set(entry.deployment_id, "registered", None)
                continue
            try:
                await self._call("POST", "/model/new", master, entry.body())
                self._set(entry.deployment_id, "registered", None)
            except SyncError as exc:
                problems.append(str(exc))
                self._set(entry.deployment_id, "error", "litellm_rejected")
        for i, old in enumerate(existing):
            if i in kept or old["model_info"]["dgxmm_id"] in unkeyed:
                continue
            try:
                await self._call("POST", "/model/delete", master, {"id": old["model_info"]["id"]})
            except SyncError as exc:
                problems.append(str(exc))
        registered = {e.deployment_id for e in wanted}
        for dep in deployments:
            if dep.id in unkeyed:
                self._set(dep.id, "error", "ondemand_not_configured")
            elif dep.id not in registered:
                self._set(dep.id, "pending", None)
        for gone in set(self.state.per_deployment) - {d.id for d in deployments}:
            del self.state.per_deployment[gone]
        if problems:
            raise PartialSync("; ".join(problems))
        self.state.ready, self.state.error = True, None

    def _master_key(self) -> str:
        path = self.settings.master_key_file
        try:
            key = Path(path).read_text().strip() if path else ""
        except OSError as exc:
            raise SyncError(f"cannot read litellm.master_key_file: {exc.strerror}") from None
        if not key:
            raise SyncError("no LiteLLM master key (litellm.master_key_file)")
        return key

    async def _entries(self, master: str) -> list[dict[str, Any]]:
        try:
            body = await self._call("GET", "/v2/model/info", master)
        except SyncError:
            body = await self._call("GET", "/model/info", master)
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise SyncError("LiteLLM's model list has no 'data' list")
        return [e for e in data if isinstance(e, dict)]

    async def _call(self, method: str, path: str, master: str, body: Any = None) -> Any:
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
