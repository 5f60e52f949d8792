"""The on-demand controller built over the deployer, with the status layer that shows it: the
last hour's history and the live status."""

from __future__ import annotations

from dataclasses import dataclass

from dgxmm.assembly.deploy import DeployParts, Publish
from dgxmm.controller.controller import Controller
from dgxmm.controller.effects import DeployerEffects, PrefetchPort, RecordPort, SamplerPort, DeployerPort
from dgxmm.events import EventBus
from dgxmm.records.changes import Listener
from dgxmm.settings import Settings
from dgxmm.status.history import History
from dgxmm.status.live import LiveStatus
from dgxmm.telemetry.metrics import Metrics


class HeardInTurn(DeployerEffects):
    """The controller's effects, but for the listener it hands over as it is built: kept
    (``heard``), not registered with the deployer, so that it takes its place in the listeners'
    tuple (``assembly.listeners``) like every other."""

    def __init__(
        self, deployer: DeployerPort, sampler: SamplerPort, bus: RecordPort, prefetcher: PrefetchPort | None
    ) -> None:
        super().__init__(deployer, sampler, bus, prefetcher)
        self.heard: list[Listener] = []
        self.add_listener = self._keep  # (DeployerEffects binds the deployer's in its construction)

    def _keep(self, listener: Listener) -> None:
        self.heard.append(listener)


@dataclass(frozen=True)
class OndemandParts:
    controller: Controller
    heard: Listener  # the controller's listener of deployment changes
    history: History
    live: LiveStatus


def build_ondemand(
    settings: Settings, deploy: DeployParts, bus: EventBus, metrics: Metrics, publish_view: Publish
) -> OndemandParts:
    """The controller acts on deployments through its effects and publishes a view when its
    counts change (``publish_view``); the live status folds its phases, but for a change of
    phase, which it publishes at once."""
    effects = HeardInTurn(deploy.deployer, deploy.sampler, bus, deploy.prefetcher)
    controller = Controller(settings.ondemand, effects, publish_view, report=metrics)
    (heard,) = effects.heard
    history = History()
    live = LiveStatus(deploy.deployer, controller, history, controller.status_changed, publish_now=publish_view)
    return OndemandParts(controller, heard, history, live)
