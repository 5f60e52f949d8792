"""The running service assembled: each subsystem's builder called in start-up order, the
listeners registered in theirs, and the parts handed to a frozen ``Context``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dgxmm import __version__
from dgxmm.assembly.core import Core, build_core
from dgxmm.assembly.deploy import DeployParts, build_deploy
from dgxmm.assembly.declared import build_declared
from dgxmm.assembly.gateway import GatewayParts, build_gateway, network_source
from dgxmm.assembly.listeners import deployment_listeners, listen
from dgxmm.assembly.litellm import build_litellm
from dgxmm.assembly.ondemand import OndemandParts, build_ondemand
from dgxmm.assembly.telemetry import TelemetryParts, build_scrape, build_telemetry
from dgxmm.context import Context, Publisher
from dgxmm.declared.watch import Declared
from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits
from dgxmm.litellm.sync import LiteLLMSync
from dgxmm.settings import Settings
from dgxmm.status.view import Views
from dgxmm.store.db import Store
from dgxmm.telemetry.collector import Sources, register
from dgxmm.telemetry.endpoint import ScrapeAccess


@dataclass(frozen=True)
class Assembled:
    context: Context
    declared: Declared  # the deployments declared in files, started by the lifespan


def build_context(
    settings: Settings,
    store: Store,
    server: tuple[FrontLimits, ConnectionBudget],
    viewer: Callable[[str], bool],
) -> Assembled:
    """The running service's parts; ``server`` is the HTTP server's limits and connections (they
    hold the gateway's share, counted by the entrance), ``viewer`` whether a token is a viewer's.

    The publisher sends views, and the views need the parts that ask it to (the controller, the
    live status, the measured memory, the prefetcher, the LiteLLM sync): they are given these
    three functions, which call it once it is built, below, before anything runs."""

    def publish_view(deployment_id: str) -> None:
        publisher.view(deployment_id)

    def publish_memory(deployment_id: str) -> None:
        publisher.memory(deployment_id)

    def publish_prefetch(deployment_id: str) -> None:
        publisher.prefetch(deployment_id)

    core = build_core(settings, store)
    bus, metrics, http, upstream, instance = core.bus, core.metrics, core.http, core.upstream, core.instance
    deploy = build_deploy(settings, store, core, publish_memory=publish_memory, publish_prefetch=publish_prefetch)
    deployer = deploy.deployer
    ondemand = build_ondemand(settings, deploy, bus, metrics, publish_view)
    telemetry = build_telemetry(settings, store, metrics, lambda dep_id: deployer.runtime.log_position(dep_id))
    networks = network_source(deployer.runtime)
    gateway = build_gateway(
        settings,
        store,
        deployer,
        ondemand.controller,
        upstream,
        ondemand.history,
        ondemand.live,
        telemetry.finish,
        networks,
        server,
        bus,
        deploy.models,
    )
    litellm = build_litellm(settings, deployer, gateway.keys, http, publish_view, instance=instance, metrics=metrics)
    measured, prefetcher = deploy.measured, deploy.prefetcher
    views = Views(settings, ondemand.controller, ondemand.live, litellm, measured, telemetry.activity, prefetcher)
    publisher = Publisher(bus, deployer.find, views, ondemand.live, upstream, telemetry.activity)
    listen(deployer, deployment_listeners(ondemand, publisher, metrics, litellm), metrics)
    sources = Sources(
        deployer, ondemand.controller, deploy.sampler, litellm, __version__, instance, measured, prefetcher
    )
    register(metrics.registry, metrics, sources)
    declared = build_declared(settings, deployer, ondemand.controller, upstream, bus)
    scrape = build_scrape(settings, core.admin_token, networks, viewer)
    parts = Parts(deploy, ondemand, telemetry, gateway, litellm, views, publisher, scrape)
    return Assembled(context_of(settings, store, core, parts, server, declared), declared)


@dataclass(frozen=True)
class Parts:
    """The subsystems built, for the context."""

    deploy: DeployParts
    ondemand: OndemandParts
    telemetry: TelemetryParts
    gateway: GatewayParts
    litellm: LiteLLMSync | None
    views: Views
    publisher: Publisher
    scrape: ScrapeAccess


def context_of(
    settings: Settings,
    store: Store,
    core: Core,
    parts: Parts,
    server: tuple[FrontLimits, ConnectionBudget],
    declared: Declared,
) -> Context:
    deploy, ondemand, telemetry, gateway = parts.deploy, parts.ondemand, parts.telemetry, parts.gateway
    limits, connections = server
    return Context(
        settings=settings,
        store=store,
        bus=core.bus,
        deployer=deploy.deployer,
        sampler=deploy.sampler,
        http=core.http,
        admin_token=core.admin_token,
        supervisor=core.supervisor,
        metrics=core.metrics,
        instance_id=core.instance,
        ondemand=ondemand.controller,
        prefetcher=deploy.prefetcher,
        keys=gateway.keys,
        callers=gateway.callers,
        peers=gateway.peers,
        upstream=core.upstream,
        entrance=gateway.entrance,
        history=ondemand.history,
        measured=deploy.measured,
        activity=telemetry.activity,
        activity_feed=telemetry.activity_feed,
        finish=telemetry.finish,
        server_log=telemetry.server_log,
        live=ondemand.live,
        views=parts.views,
        publisher=parts.publisher,
        models=deploy.models,
        scrape=parts.scrape,
        litellm=parts.litellm,
        limits=limits,
        connections=connections,
        config_status=declared.status,
    )
