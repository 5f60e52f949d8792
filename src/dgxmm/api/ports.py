"""What the admin API calls of the deployer, as Protocols named for their role, and the
dependencies that hand each route the running service's deployer as one of them: a route takes
the interface it needs (``Depends(listing_of)``), never the concrete deployer, so what it may do
is written where it is used and the type checker holds the deployer to it, here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi import Depends

from dgxmm.context import Context, ctx_of
from dgxmm.deploy.budget import Device, Snapshot
from dgxmm.deploy.compilecache import CacheReport
from dgxmm.deploy.sampler import SampledDeployments
from dgxmm.records.deployment import Deployment, DeploymentReader


class Listing(SampledDeployments, DeploymentReader, Protocol):
    """The deployments, read: one by its id (404 when unknown), one that may be gone (``find``),
    and all of them (the sampler's ``SampledDeployments``)."""


class Editor(Protocol):
    """An operator's writes of a deployment's settings: create, edit (while its engine is not
    running), remove."""

    def create(self, dep: Deployment, *, user: str | None, start: bool, actor: str = "api") -> Deployment: ...

    def reconfigure(
        self, deployment_id: str, changes: dict[str, Any], *, user: str | None, actor: str = "api"
    ) -> Deployment: ...

    def reset_after_edit(self, deployment_id: str) -> None: ...

    async def remove(self, deployment_id: str, *, actor: str, user: str | None = None) -> None: ...


class Lifecycle(Protocol):
    """The actions on a deployment's engine: start, wake, stop (the deployer's)."""

    def restart(self, deployment_id: str, *, actor: str, user: str | None = None) -> None: ...

    def wake(self, deployment_id: str, *, actor: str, user: str | None = None) -> None: ...

    async def stop(self, deployment_id: str, *, actor: str, user: str | None = None) -> bool: ...


class Sleeper(Protocol):
    """Sleep, the controller's: it waits for the requests in flight first (vLLM's /sleep aborts them)."""

    async def sleep(self, deployment_id: str, *, actor: str, user: str | None = None) -> None: ...


class EngineLogs(Protocol):
    """An engine's log: its last lines (or those before a position), and the lines as it writes them."""

    async def logs(self, deployment_id: str, tail: int, before: int | None = None) -> list[str]: ...

    def follow_logs(self, deployment_id: str, tail: int) -> AsyncIterator[list[str]]: ...


class CompileCaches(Protocol):
    """A deployment's kept compile work (deploy/compilecache.py): its size, and clearing it."""

    async def compile_cache(self, dep: Deployment) -> CacheReport | None: ...

    async def clear_compile_cache(self, deployment_id: str) -> None: ...


class Devices(Protocol):
    """The budget's devices, and whether the host is one pool of memory."""

    def devices(self) -> tuple[Device, ...]: ...

    @property
    def pooled(self) -> bool: ...


class Memory(Protocol):
    """The host's memory as the budget accounts it now, and its devices."""

    def snapshot(self) -> Snapshot: ...

    @property
    def budget(self) -> Devices: ...


class DeployerLogs:
    """``EngineLogs`` from the deployer (its ``logs``) and its runtime (``follow_logs``)."""

    def __init__(self, ctx: Context) -> None:
        self.logs = ctx.deployer.logs
        self.follow_logs = ctx.deployer.runtime.follow_logs


async def reader_of(ctx: Context = Depends(ctx_of)) -> DeploymentReader:
    return ctx.deployer


async def listing_of(ctx: Context = Depends(ctx_of)) -> Listing:
    return ctx.deployer


async def editor_of(ctx: Context = Depends(ctx_of)) -> Editor:
    return ctx.deployer


async def lifecycle_of(ctx: Context = Depends(ctx_of)) -> Lifecycle:
    return ctx.deployer


async def sleeper_of(ctx: Context = Depends(ctx_of)) -> Sleeper:
    return ctx.ondemand


async def logs_of(ctx: Context = Depends(ctx_of)) -> EngineLogs:
    return DeployerLogs(ctx)


async def compile_caches_of(ctx: Context = Depends(ctx_of)) -> CompileCaches:
    return ctx.deployer.runtime


async def memory_of(ctx: Context = Depends(ctx_of)) -> Memory:
    return ctx.deployer
