"""``Metrics``: the one owner of dgxmm's counters and histograms, and the narrow interface the
gateway, the controller, the deployer and the LiteLLM sync record through.

Recording is a method call with what happened (an ``Exchange`` at the end of a gateway request,
"started for requests", "stopped to make room"...), never a metric object in the caller's hands,
so the callers know nothing of Prometheus. Numbers live per deployment (``DeploymentStats``),
created when the deployment is created or first seen and dropped when it is removed, so the
series of a removed deployment disappear with it. A record for a deployment that is not (or no
longer) known is dropped, except a gateway request's, which counts under ``deployment=""``.

Gauges derived from state (in flight, queued, states, memory, backoff, engine samples, LiteLLM
readiness) are not kept here: ``collector.py`` reads them from their owners at scrape time, so
nothing on the hot path updates them.

A component built without a ``Metrics`` (unit tests) gets a fresh one that watches nothing: its
records are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, Protocol

from prometheus_client import CollectorRegistry

from dgxmm.records.deployment import Deployment, State
from dgxmm.telemetry import catalog as c
from dgxmm.gateway.keyrecord import KEY_FILE_NAME
from dgxmm.gateway.exchange import Exchange
from dgxmm.telemetry.looplag import LoopLag
from dgxmm.telemetry.stats import DeploymentStats

if TYPE_CHECKING:
    from dgxmm.records.changes import Change

STATUS_CLASSES = ("0xx", "1xx", "2xx", "3xx", "4xx", "5xx")


class Watched(Protocol):
    def all(self) -> list[Deployment]: ...

    def add_listener(self, listener: Callable[[Change], None]) -> None: ...


@dataclass
class LiteLLMStats:
    syncs: int = 0
    failures: int = 0
    last_success: float = 0.0  # Unix time
    written: dict[str, int] = field(default_factory=lambda: dict.fromkeys(c.LITELLM_OPERATIONS, 0))


class Load(NamedTuple):
    """An engine's load, as its deployment's latest (``Metrics.load_waited_for``)."""

    ready_at: float  # monotonic
    seconds: float  # its launch (after the start-up gate) to ready
    cached_fraction: float | None  # of its model's files in the page cache as its start began


class Metrics:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry(auto_describe=False)  # dgxmm's own, not the global one
        self.clock = clock
        self.litellm = LiteLLMStats()
        self._deps: dict[str, DeploymentStats] = {}
        self._unknown: DeploymentStats | None = None
        self._starting: dict[str, tuple[float, str]] = {}  # id -> (when it began starting, start|wake)
        self._loads: dict[str, Load] = {}  # id -> its engine's latest load (the activity row's)
        self.loop_lag = LoopLag()  # the event loop's own lag (its probe runs as a background task)

    # --- what the collector reads -----------------------------------------------------------

    def stats(self) -> list[DeploymentStats]:
        """Every deployment's numbers, and those of requests tied to none once there was one."""
        found = list(self._deps.values())
        return found + [self._unknown] if self._unknown is not None else found

    def of(self, deployment_id: str) -> DeploymentStats | None:
        return self._deps.get(deployment_id)

    # --- deployments come and go --------------------------------------------------------------

    def watch(self, deployer: Watched) -> None:
        """Follow ``deployer``'s deployments from now on (its existing ones start at zero)."""
        self.follow(deployer.all())
        deployer.add_listener(self.on_change)

    def follow(self, deps: list[Deployment]) -> None:
        """Series for deployments that exist before ``on_change`` is heard (they start at zero)."""
        for dep in deps:
            self._add(dep)

    def _add(self, dep: Deployment) -> None:
        self._deps[dep.id] = DeploymentStats(dep.id, dep.served_name, dep.engine)

    def on_change(self, change: Change) -> None:
        """Deployer listener: series per deployment; start durations; watchdog failures."""
        dep = change.deployment
        if change.kind == "created":
            self._add(dep)
        elif change.kind == "removed":
            self._deps.pop(dep.id, None)
            self._starting.pop(dep.id, None)
            self._loads.pop(dep.id, None)
        elif change.kind == "config":
            stats = self._deps.get(dep.id)
            if stats is None or (stats.base["served_name"], stats.base["engine"]) != (dep.served_name, dep.engine):
                self._add(dep)  # new labels: new series, from zero
        elif change.kind == "state":
            self._on_state(dep, change.old_state)

    def _on_state(self, dep: Deployment, old: State | None) -> None:
        if dep.state is State.STARTING:
            self._starting[dep.id] = (self.clock(), "wake" if old is State.ASLEEP else "start")
        elif old is State.STARTING:
            begun = self._starting.pop(dep.id, None)
            stats = self._deps.get(dep.id)
            if begun is not None and stats is not None and dep.state in (State.READY, State.FAILED):
                outcome = "ready" if dep.state is State.READY else "failed"
                stats.observe(c.START_SECONDS, self.clock() - begun[0], (begun[1], outcome))
        if dep.state is State.FAILED and old in (State.READY, State.ASLEEP):
            stats = self._deps.get(dep.id)
            if stats is not None:
                stats.add(c.WATCHDOG)  # only the watchdog fails a ready or asleep engine

    # --- the gateway --------------------------------------------------------------------------

    def exchange_done(self, ex: Exchange, now: float) -> None:
        """One gateway request ended (answered, refused or hung up) at ``now`` (monotonic)."""
        stats = self._deps.get(ex.deployment_id) if ex.deployment_id is not None else None
        if stats is None:
            stats = self._unknown
            if stats is None:
                stats = self._unknown = DeploymentStats("", "", "", unknown=True)
        status_class = STATUS_CLASSES[ex.status // 100]
        stats.add(c.REQUESTS, (ex.route, status_class))
        caller = ex.caller
        if caller is not None:
            stats.add(c.KEY_REQUESTS, (caller.name, status_class))
        if ex.code is not None:
            stats.add(c.REFUSALS, (c.REASONS.get(ex.code, c.OTHER_REASON),))
        stats.observe(c.DURATION, now - ex.arrival)
        if ex.engine_byte:
            stats.observe(c.FIRST_BYTE, ex.first_byte - ex.arrival)
            stats.add(c.RESPONSE_BYTES, amount=ex.bytes)
            if ex.cold:
                stats.observe(c.COLD_START, ex.engine_byte - ex.arrival)
            usage = ex.usage
            if usage is not None and stats is not self._unknown:
                key = caller.name if caller is not None else KEY_FILE_NAME
                if usage.prompt_tokens:
                    stats.add(c.TOKENS, ("prompt", key), usage.prompt_tokens)
                if usage.completion_tokens:
                    stats.add(c.TOKENS, ("completion", key), usage.completion_tokens)
                    speed = ex.tokens_per_s(now)
                    if speed is not None:
                        stats.observe(c.GENERATION_SPEED, speed)

    # --- the on-demand controller -------------------------------------------------------------

    def waited(self, deployment_id: str, seconds: float, outcome: str) -> None:
        """A request that got no slot at once stopped waiting: granted, refused or gone."""
        if stats := self._deps.get(deployment_id):
            stats.add(c.WAITS_ENDED, (outcome,))
            if outcome == "granted":
                stats.observe(c.QUEUE_WAIT, seconds)

    def queued(self, deployment_id: str) -> None:
        """A request had to queue for memory."""
        if stats := self._deps.get(deployment_id):
            stats.add(c.QUEUED)

    def started_for_requests(self, deployment_id: str, *, woke: bool) -> None:
        if stats := self._deps.get(deployment_id):
            stats.add(c.WAKES if woke else c.STARTS_FOR_REQUESTS)

    def stopped(self, deployment_id: str, reason: str) -> None:
        """An approved on-demand stop, by reason (``catalog.STOP_REASONS``)."""
        if stats := self._deps.get(deployment_id):
            stats.add(c.STOPS, (reason,))

    def start_failed(self, deployment_id: str) -> None:
        """A start or wake made for requests failed."""
        if stats := self._deps.get(deployment_id):
            stats.add(c.START_FAILURES)

    # --- the deployer -------------------------------------------------------------------------

    def launched(self, deployment_id: str, seconds: float, cached_fraction: float | None) -> None:
        """An engine became ready ``seconds`` after its launch (after the start-up gate), with
        ``cached_fraction`` of its model in the page cache as its start began."""
        if stats := self._deps.get(deployment_id):
            stats.observe(c.LAUNCH, seconds)
            self._loads[deployment_id] = Load(self.clock(), seconds, cached_fraction)

    def load_waited_for(self, ex: Exchange) -> Load | None:
        """The engine load a gateway request waited for: its deployment's latest, when that one
        became ready after the request arrived and before it got its slot (the start it waited
        for, or joined); None for a request that waited for none (a slot at once, a wake, a start
        that failed) and for one that left first."""
        load = self._loads.get(ex.deployment_id) if ex.cold and ex.deployment_id is not None else None
        return load if load is not None and ex.arrival <= load.ready_at <= ex.slot_at else None

    # --- the LiteLLM sync ---------------------------------------------------------------------

    def litellm_synced(self, ok: bool) -> None:
        self.litellm.syncs += 1
        if ok:
            self.litellm.last_success = time.time()
        else:
            self.litellm.failures += 1

    def litellm_written(self, operation: str) -> None:
        """LiteLLM accepted one ``add``, ``update`` or ``delete``."""
        self.litellm.written[operation] += 1
