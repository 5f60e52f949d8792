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
from dgxmm.telemetry.metrics import Metrics
from dgxmm.telemetry.stats import Buckets

SAMPLED = (State.READY, State.ASLEEP)  # engines whose last sample means something


class Deployments(Protocol):
    def all(self) -> list[Deployment]: ...

    def snapshot(self, exclude: str | None = None) -> Snapshot: ...


class Counts(Protocol):
    """The controller's track of one deployment, as far as the gauges read it."""

    inflight: int
    waiting: int
    refused_until: float


class Load(Protocol):
    @property
    def clock(self) -> Callable[[], float]: ...

    def tracked(self, deployment_id: str) -> Counts | None: ...


class Samples(Protocol):
    def latest(self, deployment_id: str) -> Sample | None: ...


class Measured(Protocol):
    def gib(self, deployment_id: str) -> float | None: ...


class Prefetched(Protocol):
    @property
    def read_bytes(self) -> int: ...


class Sync(Protocol):
    @property
    def ready(self) -> bool: ...


@dataclass
class Sources:
    deployer: Deployments
    controller: Load
    sampler: Samples
    litellm: Sync | None
    version: str
    instance: str
    measured: Measured | None = None
    prefetcher: Prefetched | None = None  # None: [memory] prefetch = false, no series


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


class Collector(BaseCollector):
    def __init__(self, metrics: Metrics, sources: Sources) -> None:
        self._metrics = metrics
        self._sources = sources

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
