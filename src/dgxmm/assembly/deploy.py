"""The deploy subsystem built: the memory budget and what engines really hold, the runtime, the
deployer with the model store it asks, the metrics sampler and the prefetcher."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


from dgxmm.deploy.budget import MemoryBudget
from dgxmm.deploy.deployer import Deployer
from dgxmm.deploy.limits import EngineLimits
from dgxmm.deploy.liveness import Liveness
from dgxmm.deploy.measured import MeasuredMemory, over_declared
from dgxmm.deploy.prefetch import Prefetcher
from dgxmm.deploy.runtimes.base import Runtime
from dgxmm.deploy.runtimes.docker import DockerRuntime
from dgxmm.deploy.runtimes.dockerself import in_container
from dgxmm.deploy.runtimes.process import ProcessRuntime
from dgxmm.deploy.sampler import MetricsSampler
from dgxmm.events import EventBus
from dgxmm.modelstore.layout import models_dir
from dgxmm.modelstore.names import users_of
from dgxmm.modelstore.source import DEFAULT_HUB_URL, HubSource
from dgxmm.modelstore.store import ModelStore
from dgxmm.records.deployment import Deployment
from dgxmm.settings import Settings
from dgxmm.store.db import Store
from dgxmm.assembly.core import Core

Publish = Callable[[str], None]  # a deployment's id: something of its view goes out


@dataclass(frozen=True)
class DeployParts:
    budget: MemoryBudget
    measured: MeasuredMemory  # what each running engine really holds
    deployer: Deployer
    sampler: MetricsSampler
    models: ModelStore  # models pulled from a hub (modelstore/)
    prefetcher: Prefetcher | None  # None: [memory] prefetch = false


def make_runtime(settings: Settings, bus: EventBus, instance: str) -> Runtime:
    if settings.runtime.kind == "docker":

        def notify(deployment_id: str, text: str) -> None:
            bus.event("deployer", deployment_id, text)

        models = models_dir(settings.models, settings.server.data_dir)
        return DockerRuntime(settings.runtime, settings.engines, notify, in_container, instance, models)
    return ProcessRuntime(
        settings.server.data_dir,
        settings.engines,
        settings.deployer.stop_grace_s,
        outlive=settings.runtime.engines_outlive_dgxmm,
    )


def warn_over_declared(bus: EventBus, dep: Deployment, gib: float) -> None:
    """An engine holds more than its deployment declares (once per start): an event and an audit
    row with both numbers and what to declare."""
    text = over_declared(dep, gib)
    bus.event("deployer", dep.id, text)
    bus.audit(
        "memory_over_declared",
        actor="deployer",
        user=None,
        deployment_id=dep.id,
        new={"declared_gib": dep.memory_gib, "measured_gib": round(gib, 3)},
        text=text,
    )


def build_models(
    settings: Settings, store: Store, bus: EventBus, budget: MemoryBudget, deployments: Callable[[], list[Deployment]]
) -> ModelStore:
    """The model store: its pulled files leave the page cache where the policy says so; a model
    a deployment uses (``deployments``, the deployer's records) is not deleted."""
    m = settings.models
    source = HubSource(m.hub_url or DEFAULT_HUB_URL, m.hub_token_file, m.stall_timeout_s, m.redirect_hosts)
    return ModelStore(
        m,
        settings.server.data_dir,
        store,
        bus,
        source,
        users=lambda record: users_of(record, deployments()),
        release=budget.page_cache.release_files,
    )


def build_deploy(
    settings: Settings, store: Store, core: Core, *, publish_memory: Publish, publish_prefetch: Publish
) -> DeployParts:
    """The deploy subsystem. A new memory reading reaches open pages as a memory event
    (``publish_memory``, at most one per engine per sampling round: a whole view would carry the
    counts too, out of turn with the counters' publisher); a prefetch's progress as it goes
    (``publish_prefetch``, at most once a second). An engine's signs of life besides its health
    check: the bytes of its answers (the core's ``upstream``) and its metrics pages."""
    bus, http = core.bus, core.http
    warn = lambda dep, gib: warn_over_declared(bus, dep, gib)  # noqa: E731
    measured = MeasuredMemory(store, warn=warn, on_moved=publish_memory)
    budget = MemoryBudget(settings.memory, held=measured.held_gib, seen_on=measured.seen_on, asleep=measured.asleep_gib)
    budget.check_source()
    runtime = make_runtime(settings, bus, core.instance)
    limits = EngineLimits(budget.device_total, settings.engines, spans=budget.count_of)
    liveness = Liveness()
    models = build_models(settings, store, bus, budget, lambda: deployer.all())
    deployer = Deployer(
        settings.deployer,
        store,
        bus,
        budget,
        runtime,
        http,
        limits,
        supervisor=core.supervisor,
        report=core.metrics,
        liveness=liveness,
        models=models,  # a hub model's files (deploy/preparation.py)
    )
    deployer.add_listener(measured.on_change)  # the deployer's own bookkeeping: heard before anyone decides
    d = settings.deployer
    measure = lambda dep_id: runtime.usage(dep_id)  # noqa: E731
    sampler = MetricsSampler(deployer, http, d.metrics_interval_s, d.metrics_timeout_s, measure, measured=measured)
    liveness.add_source(core.upstream.received)
    liveness.add_source(sampler.answered)
    memory = settings.memory
    unified = memory.source == "meminfo"
    prefetcher = Prefetcher(unified=unified, on_progress=publish_prefetch) if memory.prefetch else None
    return DeployParts(budget, measured, deployer, sampler, models, prefetcher)
