"""The declared deployments (dgxmm.declared) built, applied through the deployer."""

from __future__ import annotations

from dgxmm.controller.controller import Controller
from dgxmm.declared.apply import Applier
from dgxmm.declared.parse import Sources
from dgxmm.declared.watch import Declared
from dgxmm.deploy.deployer import Deployer
from dgxmm.engineclient.pool import UpstreamClients
from dgxmm.events import EventBus
from dgxmm.records.deployment import Mode
from dgxmm.settings import Settings


def build_declared(
    settings: Settings, deployer: Deployer, controller: Controller, upstream: UpstreamClients, bus: EventBus
) -> Declared:
    """Busy is what the controller counts in flight or waiting, or a request the gateway forwards
    to the engine (an always-on one's has no slot): a busy model is never stopped. A reading's
    error, as it comes and goes, reaches the console's banner live (a ``config`` event)."""

    def busy(deployment_id: str) -> bool:
        status = controller.status(deployment_id)
        return bool(status["inflight"] or status["queued"] or upstream.in_flight(deployment_id))

    async def set_mode(deployment_id: str, mode: Mode, idle_timeout_s: float | None) -> None:
        await controller.set_mode(deployment_id, mode, idle_timeout_s, user=None)

    applier = Applier(deployer, busy=busy, set_mode=set_mode, preload=controller.preload)
    poll_s = settings.server.deployments_poll_s
    return Declared(Sources.of(settings), applier, poll_s, on_status=lambda status: bus.publish("config", status))
