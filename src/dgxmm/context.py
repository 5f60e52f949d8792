"""The running service's parts, built once at start-up (dgxmm.assembly) and shared by the API and
the gateway: a frozen record, so what a route reads is what the builders made."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from starlette.requests import Request

from dgxmm.records.changes import Change
from dgxmm.deploy.deployer import Deployer
from dgxmm.records.deployment import Deployment, State
from dgxmm.deploy.sampler import MetricsSampler
from dgxmm.events import EventBus
from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits
from dgxmm.status.history import History
from dgxmm.litellm.sync import LiteLLMSync
from dgxmm.deploy.measured import MeasuredMemory
from dgxmm.telemetry.access import Finisher
from dgxmm.telemetry.activity import Activity
from dgxmm.telemetry.serverlog import RecentLines
from dgxmm.status.live import LiveStatus
from dgxmm.status.view import Views
from dgxmm.controller.controller import Controller
from dgxmm.deploy.prefetch import Prefetcher
from dgxmm.gateway.callerkeys import CallerKeys
from dgxmm.gateway.entrance import Entrance
from dgxmm.gateway.keys import KeyFile
from dgxmm.modelstore.store import ModelStore
from dgxmm.gateway.peers import PeerPolicy
from dgxmm.engineclient.pool import UpstreamClients
from dgxmm.settings import Settings
from dgxmm.store.db import Store
from dgxmm.supervisor import Supervisor
from dgxmm.telemetry.endpoint import ScrapeAccess
from dgxmm.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Publisher:
    """What the console's event stream hears of deployments: a deployment's view, its memory
    reading, its prefetch's progress; and the listener that sends every change as the new view."""

    bus: EventBus
    find: Callable[[str], Deployment | None]
    views: Views  # a deployment as the API shows it
    live: LiveStatus
    upstream: UpstreamClients
    activity: Activity

    def _publish(self, data: dict[str, Any]) -> None:
        self.bus.publish("deployment", data)
        self.live.published(data["id"], data["status"])

    def view(self, deployment_id: str) -> None:
        """Send a deployment's view (``status.view.Views``) to event-stream subscribers."""
        dep = self.find(deployment_id)
        if dep is not None:
            self._publish(self.views.of(dep))

    def memory(self, deployment_id: str) -> None:
        """Send a deployment's new memory reading (``memory`` event: its id and the view's
        memory fields) to event-stream subscribers."""
        dep = self.find(deployment_id)
        if dep is not None:
            self.bus.publish("memory", {"id": dep.id, **self.views.memory_of(dep)})

    def prefetch(self, deployment_id: str) -> None:
        """Send how far the prefetch of a deployment's model has read (``prefetch`` event: its id
        and the view's ``prefetch`` field; the prefetcher tells it at most once a second)."""
        dep = self.find(deployment_id)
        if dep is not None:
            self.bus.publish("prefetch", {"id": dep.id, **self.views.prefetch_of(dep)})

    def on_change(self, change: Change) -> None:
        """Deployer listener: every change reaches event-stream subscribers as the new view. An
        engine that failed while it served (dead or hung) has its requests ended at once."""
        dep = change.deployment
        if change.kind == "state" and dep.state is State.FAILED and change.old_state in (State.READY, State.ASLEEP):
            self.upstream.abort(dep.id, f"{dep.name} failed: {dep.state_reason.split(chr(10))[0]}")
        if change.kind == "removed":
            self.upstream.forget(dep.id)
            self.live.forget(dep.id)
            self.activity.forget(dep.id)
            self.bus.publish("deployment", {**self.views.of(dep), "removed": True})
        else:
            self._publish(self.views.of(dep))


@dataclass(frozen=True)
class Context:
    settings: Settings
    store: Store
    bus: EventBus
    deployer: Deployer
    sampler: MetricsSampler
    http: aiohttp.ClientSession
    admin_token: str
    supervisor: Supervisor
    metrics: Metrics
    instance_id: str  # this dgxmm's name in a fleet (app.instance_id)
    ondemand: Controller
    prefetcher: Prefetcher | None  # None: [memory] prefetch = false
    keys: KeyFile
    callers: CallerKeys  # the key file's and the caller keys (gateway.callerkeys)
    peers: PeerPolicy
    upstream: UpstreamClients
    entrance: Entrance  # the gateway's one way in, for every kind of caller
    history: History
    measured: MeasuredMemory  # what each running engine really holds
    activity: Activity  # the activity log of gateway requests
    activity_feed: EventBus  # its records, live, for the console
    finish: Finisher  # a gateway request's end; refused ones summarised
    server_log: RecentLines  # dgxmm's own latest log lines
    live: LiveStatus
    views: Views  # a deployment as the API shows it
    publisher: Publisher  # the console's event stream of deployments
    models: ModelStore  # models pulled from a hub (modelstore/)
    scrape: ScrapeAccess
    litellm: LiteLLMSync | None
    limits: FrontLimits  # the HTTP server's, and its open connections
    connections: ConnectionBudget
    # The declared deployments' files and the error of their latest reading (dgxmm.declared),
    # for GET /api/host's ``config``.
    config_status: Callable[[], dict[str, Any]]
    started_at: float = field(default_factory=time.time)  # this process's start, for the UI
    stopping: asyncio.Event = field(default_factory=asyncio.Event)  # set by begin_shutdown

    def begin_shutdown(self) -> None:
        """SIGTERM: every waiting request is answered 503 now and nothing starts any more;
        requests holding a slot run on until the server's grace ends."""
        if not self.stopping.is_set():
            self.stopping.set()
            log.info("shutting down: waiting requests answered 503, no new starts")
            self.deployer.begin_shutdown()
            self.ondemand.shutdown()


async def ctx_of(request: Request) -> Context:
    """The running service's parts, for a route: the dependency every admin route takes."""
    ctx: Context = request.app.state.ctx
    return ctx
