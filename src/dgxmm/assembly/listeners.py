"""Who hears a deployment's change, in order: one tuple, so that the order is code.

The deployer tells its listeners synchronously, one after the other. Before these, only the
deployer's own bookkeeping has heard it (``MeasuredMemory``, registered by ``assembly.deploy``:
a start begins a new run before anyone decides on it). Then the controller decides; the live
status marks the deployment to look at; the history counts a start that just ended before a view
is published; the published view carries the controller's new status and the history's count;
the metrics count; the LiteLLM registration follows what the console was told."""

from __future__ import annotations

from dgxmm.assembly.ondemand import OndemandParts
from dgxmm.context import Publisher
from dgxmm.deploy.deployer import Deployer
from dgxmm.litellm.sync import LiteLLMSync
from dgxmm.records.changes import Listener
from dgxmm.telemetry.metrics import Metrics


def deployment_listeners(
    ondemand: OndemandParts, publisher: Publisher, metrics: Metrics, litellm: LiteLLMSync | None
) -> tuple[Listener, ...]:
    """The listeners of deployment changes, in the order they hear one."""
    first: tuple[Listener, ...] = (
        ondemand.heard,
        ondemand.live.on_change,
        ondemand.history.on_change,
        publisher.on_change,
        metrics.on_change,
    )
    return first if litellm is None else (*first, litellm.on_change)


def listen(deployer: Deployer, listeners: tuple[Listener, ...], metrics: Metrics) -> None:
    """Register ``listeners`` in their order; the metrics first follow the deployments that exist."""
    metrics.follow(deployer.all())
    for listener in listeners:
        deployer.add_listener(listener)
