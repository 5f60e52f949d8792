"""The ASGI application: admin API under ``{base}/api``, web UI under ``{base}/``, and the
on-demand gateway under ``{base}/ondemand``.

Everything with a lifetime (HTTP client, deployer, background tasks) is created in the lifespan,
inside the running event loop, and torn down in reverse order, engines included. The lifespan
holds the data directory's lock from before the database is opened until after the last engine
is stopped (``dgxmm serve`` takes it earlier still and hands it over). Long-lived background
tasks run under the supervisor (``ctx.supervisor``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from prometheus_client import ProcessCollector

from dgxmm import __version__
from dgxmm.api import errors
from dgxmm.api.auth import load_or_create_token
from dgxmm.api.deployments import router as deployments_router
from dgxmm.api.guard import AdminGuard
from dgxmm.api.head import HeadAsGet
from dgxmm.api.activity import router as activity_router
from dgxmm.api.serverlog import router as server_log_router
from dgxmm.api.estimate import router as estimate_router
from dgxmm.api.host import router as host_router
from dgxmm.api.models import router as models_router
from dgxmm.api.playground import router as playground_router
from dgxmm.api.waiting import router as waiting_router
from dgxmm.context import Context
from dgxmm.datadir import DataDirLock, warn_if_readable
from dgxmm.declared.apply import Applier
from dgxmm.declared.endpoint import router as declared_router
from dgxmm.declared.parse import Sources as DeclaredFiles
from dgxmm.declared.watch import Declared
from dgxmm.api.keys import router as keys_router
from dgxmm.api.tokens import ViewerTokens
from dgxmm.api.tokens import router as tokens_router
from dgxmm.errors import StoreUnavailable
from dgxmm.deploy.budget import MemoryBudget
from dgxmm.deploy.prefetch import Prefetcher
from dgxmm.records.deployment import Deployment, Mode
from dgxmm.deploy.deployer import Deployer
from dgxmm.deploy.devicewatch import watch_devices
from dgxmm.deploy.reconcile import reconcile
from dgxmm.deploy.limits import EngineLimits
from dgxmm.deploy.liveness import Liveness
from dgxmm.deploy.measured import MeasuredMemory, over_declared
from dgxmm.deploy.sampler import MetricsSampler
from dgxmm.deploy.runtimes.base import Runtime
from dgxmm.deploy.runtimes.docker import DockerRuntime
from dgxmm.deploy.runtimes.dockerself import in_container
from dgxmm.deploy.runtimes.process import ProcessRuntime
from dgxmm.events import EventBus
from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits, front_limits
from dgxmm.status.history import History
from dgxmm.litellm.sync import LiteLLMSync
from dgxmm.status.live import LiveStatus
from dgxmm.status.view import Views
from dgxmm.controller.controller import Controller
from dgxmm.controller.effects import DeployerEffects
from dgxmm.gateway.dockernetworks import DockerNetworks
from dgxmm.gateway.forward import Forwarder
from dgxmm.gateway.gateway import Gateway
from dgxmm.gateway.router import Router
from dgxmm.gateway.entrance import Entrance
from dgxmm.gateway.guard import PeerGuard
from dgxmm.gateway.callerkeys import CallerKeys
from dgxmm.gateway.keys import KeyFile, create_if_missing
from dgxmm.asgi import OndemandFront
from dgxmm.gateway.peers import NetworkSource, NoContainer, PeerPolicy
from dgxmm.gateway.ratelimit import FailureLimiter
from dgxmm.modelstore.names import users_of
from dgxmm.modelstore.source import DEFAULT_HUB_URL, HubSource
from dgxmm.modelstore.layout import models_dir
from dgxmm.modelstore.store import ModelStore
from dgxmm.engineclient.pool import UpstreamClients
from dgxmm.settings import Settings
from dgxmm.store.db import STORE_RETRY_S, Store
from dgxmm.supervisor import Supervisor
from dgxmm.telemetry import endpoint
from dgxmm.telemetry.access import Finisher
from dgxmm.telemetry.activity import Activity
from dgxmm.telemetry.serverlog import RecentLines
from dgxmm.telemetry.collector import Collector, Sources
from dgxmm.telemetry.endpoint import ScrapeAccess
from dgxmm.telemetry.metrics import Metrics
from dgxmm.web import WebUI

log = logging.getLogger(__name__)


def token_path(settings: Settings) -> Path:
    return settings.server.admin_token_file or settings.server.data_dir / "admin-token"


def instance_id(settings: Settings, store: Store) -> str:
    """``[server] instance_id`` when set, else the id this database drew once (docs/fleet.md)."""
    return settings.server.instance_id or store.instance_id()


def make_runtime(settings: Settings, bus: EventBus, instance: str) -> Runtime:
    if settings.runtime.kind == "docker":

        def notify(deployment_id: str, text: str) -> None:
            bus.event("deployer", deployment_id, text)

        models = models_dir(settings.models, settings.server.data_dir)
        return DockerRuntime(settings.runtime, settings.engines, notify, in_container, instance, models)
    return ProcessRuntime(settings.server.data_dir, settings.engines, settings.deployer.stop_grace_s)


def network_source(runtime: Runtime) -> NetworkSource:
    """Docker's view of our own networks when we can ask Docker; else we are not in a container."""
    return DockerNetworks(runtime.docker) if isinstance(runtime, DockerRuntime) else NoContainer()


def warn_about_readable_secrets(settings: Settings) -> None:
    warn_if_readable(token_path(settings), "admin token file")
    warn_if_readable(settings.ondemand.key_file, "on-demand key file")
    warn_if_readable(settings.litellm.master_key_file, "LiteLLM master key file")
    warn_if_readable(settings.models.hub_token_file, "hub token file")


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


async def build_context(
    settings: Settings, store: Store, server_limits: FrontLimits, connections: ConnectionBudget
) -> Context:
    """The running service's parts; ``server_limits`` and ``connections`` are the HTTP server's (its
    connections hold the gateway's share, counted by the entrance)."""
    bus = EventBus(store)
    measured = MeasuredMemory(store, warn=lambda dep, gib: warn_over_declared(bus, dep, gib))
    budget = MemoryBudget(settings.memory, held=measured.held_gib, seen_on=measured.seen_on)
    budget.check_source()
    supervisor = Supervisor(bus)
    # Probes and metrics: no keep-alive, so dgxmm holds no idle connections to engines.
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    runtime = make_runtime(settings, bus, instance_id(settings, store))
    limits = EngineLimits(budget.device_total, settings.engines, spans=budget.count_of)
    metrics = Metrics()
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
        supervisor=supervisor,
        report=metrics,
        liveness=liveness,
        models=models,  # a hub model's files (deploy/preparation.py)
    )
    deployer.add_listener(measured.on_change)
    sampler = MetricsSampler(
        deployer,
        http,
        settings.deployer.metrics_interval_s,
        settings.deployer.metrics_timeout_s,
        measure=lambda dep_id: deployer.runtime.usage(dep_id),
        measured=measured,
    )
    token = load_or_create_token(token_path(settings))
    warn_about_readable_secrets(settings)
    ctx = Context(settings, store, bus, deployer, sampler, http, token, supervisor, metrics)
    ctx.measured = measured
    ctx.instance_id = instance_id(settings, store)
    # The controller listens first: views published for a change already carry its new status.
    memory = settings.memory
    ctx.prefetcher = Prefetcher(unified=memory.source == "meminfo") if memory.prefetch else None
    ctx.ondemand = Controller(
        settings.ondemand, DeployerEffects(deployer, sampler, bus, ctx.prefetcher), ctx.publish_view, report=metrics
    )
    # The history next, so a published view already counts the start that just ended.
    ctx.history = History()
    deployer.add_listener(ctx.history.on_change)
    ctx.live = LiveStatus(
        deployer, ctx.ondemand, ctx.history, ctx.ondemand.status_changed, publish_now=ctx.publish_view
    )  # a change of phase is not folded
    deployer.add_listener(ctx.on_change)
    metrics.watch(deployer)
    o = settings.ondemand
    prefix = f"{settings.server.base_path}/ondemand"
    create_if_missing(o.key_file)
    ctx.keys = KeyFile(o.key_file, o.key_check_interval_s, o.previous_key_grace_s)
    ctx.callers = CallerKeys(ctx.keys, store)
    networks = network_source(runtime)
    ctx.peers = PeerPolicy(o.allowed_cidrs, o.decider_network, networks, o.peer_refresh_s)
    ctx.upstream = UpstreamClients(o)
    # An engine's signs of life besides its health check: bytes of its answers, its metrics pages.
    liveness.add_source(ctx.upstream.received)
    liveness.add_source(sampler.answered)
    ctx.server_log = RecentLines()  # dgxmm's own latest lines, for the console
    logging.getLogger().addHandler(ctx.server_log)
    a = settings.activity
    ctx.activity_feed = EventBus(store)  # the activity's own live feed: not every console page's
    ctx.activity = Activity(
        a.keep,
        settings.server.data_dir / "activity.jsonl" if a.file else None,
        a.file_max_bytes,
        a.file_count,
        publish=lambda record: ctx.activity_feed.publish("activity", record),
        log_position=lambda dep_id: deployer.runtime.log_position(dep_id),
    )
    # A gateway request's end: metrics, activity, access line; a refused one's summary.
    finished = ctx.finish = Finisher(metrics, ctx.activity)
    router = Router(settings.router.path, deployer, ctx.ondemand) if settings.router.enabled else None
    gateway = Gateway(
        o,
        prefix,
        deployer,
        ctx.ondemand,
        ctx.keys,
        Forwarder(ctx.upstream),
        ctx.history,
        finish=finished,
        body_timeout_s=settings.server.body_timeout_s,
        router=router,
        callers=ctx.callers,
    )
    ctx.limits, ctx.connections = server_limits, connections
    guard = PeerGuard(gateway, ctx.peers, finish=finished)
    ctx.entrance = Entrance(prefix, guard, connections, server_limits.gateway_share, finished)
    if settings.litellm.enabled:
        sync = LiteLLMSync(
            settings.litellm,
            o,
            deployer,
            ctx.keys.current,
            http,
            ctx.publish_view,
            instance=ctx.instance_id,
            metrics=metrics,
        )
        deployer.add_listener(sync.on_change)
        ctx.keys.on_rotate(lambda key: sync.trigger())
        ctx.litellm = sync
    ctx.views = Views(settings, ctx.ondemand, ctx.live, ctx.litellm, measured, ctx.activity, ctx.prefetcher)
    ctx.models = models
    # A new reading reaches open pages as a memory event (at most one per engine per sampling
    # round): a whole view would carry the counts too, out of turn with the counters' publisher.
    measured.on_moved = ctx.publish_memory
    if ctx.prefetcher is not None:  # a read's progress, as it goes (at most once a second)
        ctx.prefetcher.on_progress = ctx.publish_prefetch
    public = settings.metrics.public
    scrapers = (
        PeerPolicy(
            settings.metrics.allowed_cidrs,
            o.decider_network,
            networks,
            o.peer_refresh_s,
            serves="unauthenticated /metrics",
        )
        if public
        else None
    )
    ctx.scrape = ScrapeAccess(token, scrapers)
    metrics.registry.register(
        Collector(
            metrics,
            Sources(
                deployer, ctx.ondemand, sampler, ctx.litellm, __version__, ctx.instance_id, measured, ctx.prefetcher
            ),
        )
    )
    ProcessCollector(registry=metrics.registry)  # dgxmm's own CPU, memory, open files, start time
    return ctx


def make_declared(ctx: Context) -> Declared:
    """The declared deployments (dgxmm.declared), applied through the deployer; busy is what
    the controller counts in flight or waiting, or a request the gateway forwards to the engine
    (an always-on one's has no slot): a busy model is never stopped."""

    def busy(deployment_id: str) -> bool:
        status = ctx.ondemand.status(deployment_id)
        return bool(status["inflight"] or status["queued"] or ctx.upstream.in_flight(deployment_id))

    async def set_mode(deployment_id: str, mode: Mode, idle_timeout_s: float | None) -> None:
        await ctx.ondemand.set_mode(deployment_id, mode, idle_timeout_s, user=None)

    applier = Applier(ctx.deployer, busy=busy, set_mode=set_mode, preload=ctx.ondemand.preload)
    declared = Declared(DeclaredFiles.of(ctx.settings), applier, ctx.settings.server.deployments_poll_s)
    ctx.config_status = declared.status
    declared.on_status = lambda status: ctx.bus.publish("config", status)  # the console's banner, live
    return declared


async def recheck_key(keys: KeyFile, interval_s: float) -> None:
    """Look at the key file on a clock too, not only when a request asks: a rotation reaches the
    LiteLLM sync, and a vanished key the log, without waiting for traffic."""
    while True:
        keys.current()
        await asyncio.sleep(max(interval_s, 1.0))


USAGE_FLUSH_S = 5.0  # how often the caller keys' usage is written (a request never waits for it)


def flush_usage(callers: CallerKeys) -> None:
    """Write the caller keys' usage; a database that cannot be written keeps it for the next try
    (the store logged why)."""
    try:
        callers.flush()
    except StoreUnavailable:
        pass


async def write_usage(callers: CallerKeys, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        flush_usage(callers)


def start_background_tasks(ctx: Context, declared: Declared) -> None:
    sup = ctx.supervisor
    if declared.watched:
        sup.start("declared-deployments", declared.run)
    sup.start("peer-refresh", ctx.peers.run)
    if ctx.scrape.public is not None:
        sup.start("scrape-peer-refresh", ctx.scrape.public.run)
    if ctx.settings.ondemand.key_file is not None:
        sup.start("key-recheck", lambda: recheck_key(ctx.keys, ctx.settings.ondemand.key_check_interval_s))
    if ctx.litellm is not None:
        ctx.keys.current()  # read the key before the first sync
        ctx.litellm.trigger()
        sup.start("litellm-sync", ctx.litellm.run)
    sup.start("metrics-sampler", ctx.sampler.run)
    if ctx.settings.memory.source == "nvml":
        interval = ctx.settings.deployer.metrics_interval_s
        sup.start("device-watch", lambda: watch_devices(ctx.deployer, interval))
    sup.start("ondemand-reaper", ctx.ondemand.run)
    sup.start("live-status", ctx.live.run)
    sup.start("store-retry", lambda: ctx.store.retry(STORE_RETRY_S))
    ctx.models.resume()  # the pulls a stop or a crash interrupted go on where they stopped
    sup.start("key-usage", lambda: write_usage(ctx.callers, USAGE_FLUSH_S))


async def shutdown(ctx: Context) -> None:
    """The end of the lifespan (requests have ended or been cancelled): background tasks, then
    engines (stopped with their grace and recorded, or left to the runtime), then clients."""
    ctx.begin_shutdown()
    ctx.ondemand.close()
    if ctx.prefetcher is not None:
        await ctx.prefetcher.close()  # (a read stops within one chunk)
    await ctx.supervisor.close()
    await ctx.models.close()  # transfers stop; their records stay downloading, resumed at the next start
    flush_usage(ctx.callers)
    for what in ctx.callers.unwritten():
        log.error("%s was never written (the database cannot be written): the next start undoes it", what)
    await ctx.deployer.close()
    await ctx.upstream.close()
    ctx.bus.close()
    ctx.activity_feed.close()
    ctx.activity.close()
    ctx.finish.refusals.close()
    await ctx.http.close()
    logging.getLogger().removeHandler(ctx.server_log)


def create_app(settings: Settings, store: Store | None = None, lock: DataDirLock | None = None) -> OndemandFront:
    """The application. Without ``store`` the lifespan locks the data directory and opens the
    database itself; with it, ``lock`` is the data directory's lock its caller holds."""
    base = settings.server.base_path
    limits = front_limits(settings.server)
    budget = ConnectionBudget(limits.max_connections, limits.max_head_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        held = lock or DataDirLock.acquire(settings.server.data_dir)
        try:
            db = store or Store(settings.server.data_dir / "dgxmm.db")
            try:
                ctx = await build_context(settings, db, limits, budget)
                app.state.ctx = ctx
                app.state.viewers = viewers = ViewerTokens(db)
                ctx.scrape.viewer = lambda given: viewers.check(given) is not None
                front.serving(ctx.entrance)
                try:
                    await reconcile(ctx.deployer, ctx.http, ctx.bus)
                    declared = app.state.declared = make_declared(ctx)
                    await declared.reload()  # the files as they are now; a bad one changes nothing
                    ctx.ondemand.preload()  # after the always-on ones: a preload takes only what is free
                    await ctx.peers.refresh()
                    if ctx.scrape.public is not None:
                        await ctx.scrape.public.refresh()
                    start_background_tasks(ctx, declared)
                    yield
                finally:
                    front.serving(None)
                    await shutdown(ctx)
            finally:
                db.close()
        finally:
            held.release()

    app = FastAPI(
        title="dgxmm",
        lifespan=lifespan,
        openapi_url=f"{base}/api/openapi.json",
        docs_url=None,  # FastAPI's page loads its scripts from a CDN: dgxmm serves its own (web/api.html)
        redoc_url=None,
    )
    errors.install(app)

    @app.get(f"{base}/api/docs", include_in_schema=False)
    async def api_docs() -> RedirectResponse:
        """The API's reference page, served by dgxmm's UI (no script from elsewhere)."""
        return RedirectResponse(f"{base}/api.html")

    endpoint.install(app, base)  # GET {base}/metrics, before the web UI's mount at {base}
    app.include_router(playground_router, prefix=f"{base}/api")  # before POST /deployments/{id}/{action}
    app.include_router(waiting_router, prefix=f"{base}/api")
    app.include_router(deployments_router, prefix=f"{base}/api")
    app.include_router(host_router, prefix=f"{base}/api")
    app.include_router(models_router, prefix=f"{base}/api")
    app.include_router(estimate_router, prefix=f"{base}/api")
    app.include_router(activity_router, prefix=f"{base}/api")
    app.include_router(keys_router, prefix=f"{base}/api")
    app.include_router(tokens_router, prefix=f"{base}/api")
    app.include_router(server_log_router, prefix=f"{base}/api")
    app.include_router(declared_router, prefix=f"{base}/api")
    # The web UI at {base}/, after the API routers so they win; GET {base} redirects to {base}/.
    app.mount(base, WebUI(), name="web")
    open_paths = frozenset({f"{base}/api/openapi.json", f"{base}/api/docs"})
    failures = FailureLimiter(settings.server.admin_token_failures, settings.server.admin_token_window_s)
    admin = AdminGuard(
        HeadAsGet(app),
        f"{base}/api",
        open_paths,
        settings.server.max_admin_body_bytes,
        lambda: str(app.state.ctx.admin_token),
        failures,
        settings.server.body_timeout_s,
        viewer=lambda given: app.state.viewers.check(given) is not None,
    )
    front = OndemandFront(
        app, f"{base}/ondemand", admin, limits, budget, settings.router.path if settings.router.enabled else None
    )
    return front
