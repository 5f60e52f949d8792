"""The gateway built: the key file and the caller keys, the peers allowed in, the checks and the
router, behind the entrance that counts the gateway's share of the server's connections."""

from __future__ import annotations

from dataclasses import dataclass

from dgxmm.deploy.deployer import Deployer
from dgxmm.deploy.runtimes.base import Runtime
from dgxmm.deploy.runtimes.docker import DockerRuntime
from dgxmm.engineclient.pool import UpstreamClients
from dgxmm.events import EventBus
from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits
from dgxmm.controller.controller import Controller
from dgxmm.gateway.callerkeys import CallerKeys
from dgxmm.gateway.dockernetworks import DockerNetworks
from dgxmm.gateway.entrance import Entrance
from dgxmm.gateway.forward import Forwarder
from dgxmm.gateway.gateway import Gateway
from dgxmm.gateway.guard import PeerGuard
from dgxmm.gateway.keys import KeyFile, create_if_missing
from dgxmm.gateway.peers import NetworkSource, NoContainer, PeerPolicy
from dgxmm.gateway.router import Downloads, Router
from dgxmm.status.history import History
from dgxmm.status.live import LiveStatus
from dgxmm.settings import Settings
from dgxmm.store.db import Store
from dgxmm.telemetry.access import Finisher


@dataclass(frozen=True)
class GatewayParts:
    keys: KeyFile
    callers: CallerKeys  # the key file's and the caller keys
    peers: PeerPolicy
    entrance: Entrance  # the gateway's one way in, for every kind of caller


def network_source(runtime: Runtime) -> NetworkSource:
    """Docker's view of our own networks when we can ask Docker; else we are not in a container."""
    return DockerNetworks(runtime.docker) if isinstance(runtime, DockerRuntime) else NoContainer()


def build_gateway(
    settings: Settings,
    store: Store,
    deployer: Deployer,
    controller: Controller,
    upstream: UpstreamClients,
    history: History,
    live: LiveStatus,
    finish: Finisher,
    networks: NetworkSource,
    server: tuple[FrontLimits, ConnectionBudget],
    bus: EventBus,
    models: Downloads | None = None,
) -> GatewayParts:
    """``live``: the live status, whose words a wait's progress lines use; ``server``: the HTTP
    server's limits and its connections, whose gateway share the entrance counts; ``bus``: where a
    caller's load and unload are audited; ``models``: the model store, whose downloads the model
    list shows."""
    o = settings.ondemand
    prefix = f"{settings.server.base_path}/ondemand"
    create_if_missing(o.key_file)
    keys = KeyFile(o.key_file, o.key_check_interval_s, o.previous_key_grace_s)
    callers = CallerKeys(keys, store)
    peers = PeerPolicy(o.allowed_cidrs, o.decider_network, networks, o.peer_refresh_s)
    router = Router(settings.router.path, deployer, controller, models) if settings.router.enabled else None
    gateway = Gateway(
        o,
        prefix,
        deployer,
        controller,
        keys,
        Forwarder(upstream),
        history,
        waits=live,
        finish=finish,
        body_timeout_s=settings.server.body_timeout_s,
        router=router,
        callers=callers,
        audit=bus,
    )
    limits, connections = server
    guard = PeerGuard(gateway, peers, finish=finish)
    entrance = Entrance(prefix, guard, connections, limits.gateway_share, finish)
    return GatewayParts(keys, callers, peers, entrance)
