"""The scrape: every metric of ``catalog`` rendered from its owner, at the moment of the scrape.

Counters and histograms come from ``Metrics``; gauges are read from the parts that own the state
(deployer and memory budget, controller, metrics sampler, LiteLLM sync), so the hot path never
updates a gauge and a gauge is never stale. ``collect`` runs in the event loop (``/metrics`` is an
``async`` route), like every writer of that state, so it reads a consistent picture.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector as BaseCollector
from prometheus_client.utils import floatToGoString

from dgxmm.deploy.budget import GIB, Snapshot
from dgxmm.deploy.sampler import Sample
from dgxmm.records.deployment import Deployment, State
from dgxmm.telemetry import catalog as c
from dgxmm.telemetry.catalog import Family
from dgxmm.telemetry.looplag import LoopLag
from dgxmm.telemetry.metrics import Metrics
from dgxmm.telemetry.stats import Buckets

SAMPLED = (State.READY, State.ASLEEP)  # engines whose last sample means something


class DeploymentsAndBudget(Protocol):
    """The deployer, as the collector reads it: copies of every record, and a snapshot of the memory budget."""

    def all(self) -> list[Deployment]: ...

    def snapshot(self, exclude: str | None = None) -> Snapshot: ...


class Counts(Protocol):
    """The controller's track of one deployment, as far as the gauges read it (read only)."""

    @property
    def inflight(self) -> int: ...

    @property
    def waiting(self) -> int: ...

    @property
    def refused_until(self) -> float: ...


class ControllerTracks(Protocol):
    """The on-demand controller, as the gauges read it: each deployment's track, and its clock
    (the backoff's remaining time)."""

    @property
    def clock(self) -> Callable[[], float]: ...

    def tracked(self, deployment_id: str) -> Counts | None: ...


class LatestSamples(Protocol):
    """The metrics sampler, as the engine gauges read it: each engine's latest sample."""

    def latest(self, deployment_id: str) -> Sample | None: ...


class MeasuredGib(Protocol):
    """What each engine holds, measured (the memory gauge)."""

    def gib(self, deployment_id: str) -> float | None: ...


class PrefetchedBytes(Protocol):
    """The prefetcher, as its counter reads it: the bytes it read ahead."""

    @property
    def read_bytes(self) -> int: ...


class LitellmReadiness(Protocol):
    """The LiteLLM sync, as its gauge reads it: whether its last sync succeeded."""

    @property
    def ready(self) -> bool: ...


@dataclass
class Sources:
    deployer: DeploymentsAndBudget
    controller: ControllerTracks
    sampler: LatestSamples
    litellm: LitellmReadiness | None
    version: str
    instance: str
    measured: MeasuredGib | None = None
    prefetcher: PrefetchedBytes | None = None  # None: [memory] prefetch = false, no series


def register(registry: CollectorRegistry, metrics: Metrics, sources: Sources) -> None:
    """Every collector of the scrape: the catalog's families (the loop's apart), dgxmm's own process."""
    registry.register(Collector(metrics, sources))
    registry.register(LoopCollector(metrics.loop_lag))
    ProcessCollector(registry=registry)  # dgxmm's own CPU, memory, open files, start time


def counter(family: Family) -> CounterMetricFamily:
    return CounterMetricFamily(family.name, family.help, labels=family.labels)


def gauge(family: Family) -> GaugeMetricFamily:
    return GaugeMetricFamily(family.name, family.help, labels=family.labels)


class HistogramFamily:
    """A histogram family whose series are ``Buckets``; ``le`` strings are made once."""

    def __init__(self, family: Family) -> None:
        self.metric = HistogramMetricFamily(family.name, family.help, labels=family.labels)
        # prometheus_client's own formatting of a bound (its ``le``), which it leaves unannotated
        self._les = [floatToGoString(bound) for bound in family.buckets] + ["+Inf"]  # type: ignore[no-untyped-call]

    def add(self, labels: Iterable[str], series: Buckets) -> None:
        cumulative, total = [], 0
        for le, count in zip(self._les, series.counts, strict=True):
            total += count
            cumulative.append((le, total))
        self.metric.add_metric(list(labels), cumulative, series.sum)


class LoopCollector(BaseCollector):
    """The event loop's lag histograms (``looplag.py``), apart from the catalog's other
    families: a scrape of these alone reads nothing that grows with the deployments."""

    def __init__(self, probe: LoopLag) -> None:
        self._probe = probe

    def describe(self) -> Iterator[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        for family, series in ((c.LOOP_LAG, self._probe.lag), (c.LOOP_LAG_CPU, self._probe.lag_cpu)):
            histogram = HistogramFamily(family)
            histogram.add([], series)
            yield histogram.metric


class Collector(BaseCollector):
    def __init__(self, metrics: Metrics, sources: Sources) -> None:
        self._metrics = metrics
        self._sources = sources

    def describe(self) -> Iterator[Metric]:
        """The families ``collect`` renders, by name only: a scrape restricted to others
        (``?name[]=``, ``endpoint.py``) does not collect these."""
        for family in (*c.ALL, c.PREFETCHED):
            if family in c.LOOP:
                continue
            if family.kind == "histogram":
                yield HistogramFamily(family).metric
            else:
                yield counter(family) if family.kind == "counter" else gauge(family)

    def collect(self) -> Iterator[Metric]:
        yield from self._counted()
        deployments = self._sources.deployer.all()
        yield from self._deployments(deployments)
        yield from self._ondemand(deployments)
        yield from self._engines(deployments)
        yield from self._memory()
        yield from self._litellm()
        if self._sources.prefetcher is not None:
            prefetched = counter(c.PREFETCHED)
            prefetched.add_metric([], self._sources.prefetcher.read_bytes)
            yield prefetched
        build = gauge(c.BUILD)
        build.add_metric([self._sources.version, self._sources.instance], 1)
        yield build

    def _counted(self) -> Iterator[Metric]:
        """Every family ``Metrics`` keeps, from the catalog's declaration alone."""
        every = self._metrics.stats()
        for family in c.KEPT:
            if family.kind == "histogram":
                histogram = HistogramFamily(family)
                for stats in every:
                    if family in stats.histograms:
                        labels = stats.labels(family)
                        for key, series in stats.histograms[family].items():
                            histogram.add([*labels, *key], series)
                yield histogram.metric
            else:
                metric = counter(family)
                for stats in every:
                    if family in stats.counts:
                        labels = stats.labels(family)
                        for key, count in stats.counts[family].items():
                            metric.add_metric([*labels, *key], count)
                yield metric

    def _deployments(self, deployments: list[Deployment]) -> Iterator[Metric]:
        info, state, held = gauge(c.INFO), gauge(c.STATE), gauge(c.MEMORY_HELD_BY)
        measured_now = gauge(c.MEMORY_MEASURED)
        measured = self._sources.measured
        for dep in deployments:
            labels = [dep.id, dep.served_name]
            info.add_metric([*labels, dep.name, dep.engine, dep.effective_mode.value], 1)
            for each in State:
                state.add_metric([*labels, each.value], 1 if dep.state is each else 0)
            held.add_metric(labels, dep.memory_gib * GIB if dep.holds_memory else 0)
            gib = measured.gib(dep.id) if measured is not None else None
            if gib is not None:
                measured_now.add_metric(labels, gib * GIB)
        yield from (info, state, held, measured_now)

    def _ondemand(self, deployments: list[Deployment]) -> Iterator[Metric]:
        inflight, waiting, backoff = gauge(c.INFLIGHT), gauge(c.WAITING), gauge(c.BACKOFF)
        controller = self._sources.controller
        now = controller.clock()
        for dep in deployments:
            labels = [dep.id, dep.served_name]
            track = controller.tracked(dep.id)
            inflight.add_metric(labels, track.inflight if track else 0)
            waiting.add_metric(labels, track.waiting if track else 0)
            backoff.add_metric(labels, max(0.0, track.refused_until - now) if track else 0.0)
        yield from (inflight, waiting, backoff)

    def _engines(self, deployments: list[Deployment]) -> Iterator[Metric]:
        running, waiting, age = gauge(c.ENGINE_RUNNING), gauge(c.ENGINE_WAITING), gauge(c.ENGINE_SAMPLE_AGE)
        for dep in deployments:
            sample = self._sources.sampler.latest(dep.id) if dep.state in SAMPLED else None
            if sample is None:
                continue
            labels = [dep.id, dep.served_name]
            running.add_metric(labels, sample.running)
            waiting.add_metric(labels, sample.waiting)
            age.add_metric(labels, sample.age())
        yield from (running, waiting, age)

    def _memory(self) -> Iterator[Metric]:
        snap = self._sources.deployer.snapshot()
        for family, gib in (
            (c.MEMORY_USABLE, snap.usable),
            (c.MEMORY_CAPACITY, snap.capacity),
            (c.MEMORY_HELD, snap.held),
            (c.MEMORY_FREE, snap.free),
        ):
            one = gauge(family)
            one.add_metric([], gib * GIB)
            yield one
        devices = gauge(c.DEVICE_MEMORY)
        for account in snap.devices:
            for kind, gib in (("total", account.total), ("held", account.held), ("free", account.free)):
                devices.add_metric([str(account.index), kind], gib * GIB)
        yield devices

    def _litellm(self) -> Iterator[Metric]:
        sync = self._sources.litellm
        if sync is None:
            return  # LiteLLM is not enabled: no series at all
        stats = self._metrics.litellm
        last, ready = gauge(c.LITELLM_LAST_SUCCESS), gauge(c.LITELLM_READY)
        last.add_metric([], stats.last_success)
        ready.add_metric([], 1 if sync.ready else 0)
        syncs, failures, written = counter(c.LITELLM_SYNCS), counter(c.LITELLM_FAILURES), counter(c.LITELLM_WRITES)
        syncs.add_metric([], stats.syncs)
        failures.add_metric([], stats.failures)
        for operation, count in stats.written.items():
            written.add_metric([operation], count)
        yield from (last, ready, syncs, failures, written)
