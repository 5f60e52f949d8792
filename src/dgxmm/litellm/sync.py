"""LiteLLMSync: keeps LiteLLM's model list in step with dgxmm's deployments.

Always-on deployments are registered pointing at their engine while it is ready; on-demand ones
in every state but failed, pointing at the gateway with the on-demand key, so the model name stays
callable while the engine is stopped. Each sync reads LiteLLM's entries, computes the entries it
should have (``desired``, a pure function), then adds before it deletes, so a name never goes
missing during a switch.

Several dgxmm hosts may share one LiteLLM (docs/fleet.md). Every entry carries this instance's id
in ``model_info.dgxmm_instance``, and a sync only ever touches its own entries (``owned``): those
with its instance id, and entries from before instance ids whose ``dgxmm_id`` is one of its own
deployments (they are adopted: replaced once by marked ones). Entries made by hand or by other
instances are never touched.

With ``warm_first`` an on-demand entry carries a LiteLLM ``order``: 1 while its engine is starting
or ready, 2 while it is cold. LiteLLM routes to the lowest order among the entries of a name that
are not cooling down, so a fleet sends traffic to a host that already has the model. A change of
order is one in-place update (``PATCH /model/{id}/update``), which keeps the entry and its id.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from dgxmm.records.changes import Change
from dgxmm.records.deployment import Deployment, State
from dgxmm.litellm.api import LiteLLMAdmin, SyncError
from dgxmm.gateway.keys import fingerprint
from dgxmm.settings import LiteLLMSettings, OndemandSettings
from dgxmm.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

HEALTH_CHECK_PARAMS = {"extra_headers": {"x-dgxmm-health-check": "1"}}
TRIGGER_STATES = frozenset({State.READY, State.FAILED, State.PLANNED})
# Warm: the engine is loaded or loading. A request sent there waits at most for a start already
# under way, never starts a second copy elsewhere.
WARM_STATES = frozenset({State.STARTING, State.READY})
ORDER_WARM, ORDER_COLD = 1, 2


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
        return {"model_name": self.model_name, "litellm_params": self.litellm_params, "model_info": self.model_info}

    @property
    def order(self) -> int | None:
        order: int | None = self.litellm_params.get("order")
        return order

    def matches(self, existing: dict[str, Any], *, but_order: bool = False) -> bool:
        """Whether an entry read back from LiteLLM (which omits api_key) is this one, or with
        ``but_order`` this one apart from its LiteLLM ``order``."""
        params = existing.get("litellm_params") or {}
        info = existing.get("model_info") or {}
        return (
            existing.get("model_name") == self.model_name
            and params.get("api_base") == self.litellm_params["api_base"]
            and params.get("model") == self.litellm_params["model"]
            and (but_order or params.get("order") == self.order)
            and all(info.get(k) == v for k, v in self.model_info.items() if k.startswith("dgxmm_"))
            and all(k in info for k in self.model_info)
        )


def owned(existing: dict[str, Any], instance: str, deployment_ids: set[str]) -> bool:
    """Whether a sync of ``instance`` may replace or delete this LiteLLM entry: it carries this
    instance's id, or (written before instance ids) no instance and one of our deployment ids."""
    info = existing.get("model_info") or {}
    if not info.get("dgxmm_id"):
        return False
    mark = info.get("dgxmm_instance")
    return mark == instance if mark is not None else info["dgxmm_id"] in deployment_ids


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


@dataclass(frozen=True)
class Target:
    """Where and how entries are written: this instance, how LiteLLM reaches the gateway, and
    whether warm entries go first."""

    instance: str
    internal_url: str
    ondemand: OndemandSettings
    warm_first: bool = False


def desired(deployments: list[Deployment], key: str | None, target: Target) -> tuple[list[Entry], set[str]]:
    """The entries dgxmm wants, and the ids of on-demand deployments it cannot register now
    because no key is readable (their existing entries are left alone)."""
    entries: list[Entry] = []
    unkeyed: set[str] = set()
    mark = {"dgxmm_instance": target.instance}
    for dep in deployments:
        if dep.is_on_demand:
            if dep.state is State.FAILED:
                continue
            if key is None:
                unkeyed.add(dep.id)
                continue
            params, info = gateway_extras(target.ondemand)
            if target.warm_first:
                params["order"] = ORDER_WARM if dep.state in WARM_STATES else ORDER_COLD
            entries.append(
                Entry(
                    dep.id,
                    dep.served_name,
                    {
                        "model": f"openai/{dep.served_name}",
                        "api_base": f"{target.internal_url.rstrip('/')}/ondemand/{dep.id}/v1",
                        "api_key": key,
                        **params,
                    },
                    {
                        "dgxmm_id": dep.id,
                        **mark,
                        "dgxmm_key_fp": fingerprint(key),
                        "dgxmm_params_fp": params_fingerprint(target.ondemand),
                        **info,
                    },
                )
            )
        elif dep.state is State.READY and dep.base_url:
            order = {"order": ORDER_WARM} if target.warm_first else {}
            # The key this run of the engine demands; its fingerprint rewrites the entry when a new
            # run has a new key at the same address (a container can get its old address back).
            engine_key = (dep.runtime_handle.api_key if dep.runtime_handle else None) or "dgxmm-direct"
            entries.append(
                Entry(
                    dep.id,
                    dep.served_name,
                    {
                        "model": f"openai/{dep.served_name}",
                        "api_base": f"{dep.base_url}/v1",
                        "api_key": engine_key,
                        **order,
                    },
                    {"dgxmm_id": dep.id, **mark, "dgxmm_key_fp": fingerprint(engine_key)},
                )
            )
    return entries, unkeyed


def wants_sync(change: Change, warm_first: bool = False) -> bool:
    """Creation, removal, entering or leaving ready/failed/planned, a change of mode, a new
    served name (the name LiteLLM lists), and with ``warm_first`` an on-demand deployment
    turning warm or cold."""
    dep, old = change.deployment, change.old
    if change.kind in ("created", "removed"):
        return True
    if change.kind == "state":
        if dep.state in TRIGGER_STATES or change.old_state in TRIGGER_STATES:
            return True
        return warm_first and dep.is_on_demand and (dep.state in WARM_STATES) != (change.old_state in WARM_STATES)
    return old is not None and (
        old.effective_mode != dep.effective_mode
        or old.pending_mode != dep.pending_mode
        or old.served_name != dep.served_name
    )


@dataclass
class SyncStatus:
    ready: bool = False
    error: str | None = None
    per_deployment: dict[str, dict[str, Any]] = field(default_factory=dict)


class DeploymentCopies(Protocol):
    """The deployer, as the sync reads it: copies of every record."""

    def all(self) -> list[Deployment]: ...


class LiteLLMSync:
    def __init__(
        self,
        settings: LiteLLMSettings,
        ondemand: OndemandSettings,
        deployer: DeploymentCopies,
        current_key: Callable[[], str | None],
        http: aiohttp.ClientSession,
        on_status: Callable[[str], None] = lambda deployment_id: None,
        *,
        instance: str,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self._metrics = metrics if metrics is not None else Metrics()
        self.instance = instance
        self.admin = LiteLLMAdmin(settings, http)
        self._ondemand = ondemand
        self._deployer = deployer
        self._current_key = current_key
        self._on_status = on_status
        self.state = SyncStatus()
        self._wanted = asyncio.Event()
        self._lock = asyncio.Lock()  # syncs never overlap

    @property
    def ready(self) -> bool:
        return self.settings.enabled and self.state.ready

    @property
    def writes(self) -> int:
        """Add, update and delete calls made so far."""
        return self.admin.writes

    def status(self, deployment_id: str) -> dict[str, Any]:
        if not self.settings.enabled:
            return {"status": "disabled", "error": None}
        return self.state.per_deployment.get(deployment_id, {"status": "pending", "error": None})

    def trigger(self) -> None:
        self._wanted.set()

    def on_change(self, change: Change) -> None:
        """Deployer listener: sync when a deployment enters or leaves ready, failed or planned,
        is removed, changes mode, or (warm first) turns warm or cold."""
        if wants_sync(change, self.settings.warm_first):
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
            self._metrics.litellm_synced(ok=True)
            return True

    def _fail(self, message: str, *, everyone: bool) -> None:
        """The sync did not finish: LiteLLM is not ready; retried on the next trigger."""
        self._metrics.litellm_synced(ok=False)
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
        master = self.admin.master_key()
        deployments = self._deployer.all()
        ids = {dep.id for dep in deployments}
        mine = [e for e in await self.admin.entries(master) if owned(e, self.instance, ids)]
        target = Target(self.instance, self.settings.internal_url, self._ondemand, self.settings.warm_first)
        wanted, unkeyed = desired(deployments, self._current_key(), target)
        kept: set[int] = set()
        missing: list[Entry] = []
        for entry in wanted:
            match = next((i for i, e in enumerate(mine) if i not in kept and entry.matches(e)), None)
            if match is None:
                missing.append(entry)
            else:
                kept.add(match)
                self._set(entry.deployment_id, "registered", None)
        problems: list[str] = []
        for entry in missing:  # updates and adds first: a name is never missing during a switch
            try:
                if not await self._reorder(master, entry, mine, kept):
                    await self.admin.add(master, entry.body())
                    self._metrics.litellm_written("add")
                self._set(entry.deployment_id, "registered", None)
            except SyncError as exc:
                problems.append(str(exc))
                self._set(entry.deployment_id, "error", "litellm_rejected")
        for i, old in enumerate(mine):
            if i in kept or old["model_info"]["dgxmm_id"] in unkeyed:
                continue
            try:
                await self.admin.delete(master, old["model_info"]["id"])
                self._metrics.litellm_written("delete")
            except SyncError as exc:
                problems.append(str(exc))
        registered = {e.deployment_id for e in wanted}
        for dep in deployments:
            if dep.id in unkeyed:
                self._set(dep.id, "error", "ondemand_not_configured")
            elif dep.id not in registered:
                self._set(dep.id, "pending", None)
        for gone in set(self.state.per_deployment) - ids:
            del self.state.per_deployment[gone]
        if problems:
            raise PartialSync("; ".join(problems))
        self.state.ready, self.state.error = True, None

    async def _reorder(self, master: str, entry: Entry, mine: list[dict[str, Any]], kept: set[int]) -> bool:
        """Give an existing entry that differs from ``entry`` only in its order the new order, in
        place: one write, and the entry (with its id) never leaves LiteLLM's router. False when
        there is none, or LiteLLM refused the update (the caller then adds a new entry, and the
        old one is deleted after it)."""
        if entry.order is None:  # an order cannot be removed in place
            return False
        match = next((i for i, e in enumerate(mine) if i not in kept and entry.matches(e, but_order=True)), None)
        if match is None:
            return False
        entry_id = mine[match]["model_info"]["id"]
        try:
            await self.admin.update(master, entry_id, {"litellm_params": {"order": entry.order}})
        except SyncError as exc:
            log.info("LiteLLM refused an in-place order update, replacing the entry: %s", exc)
            return False
        self._metrics.litellm_written("update")
        kept.add(match)
        return True
