"""The numbers behind the counters and histograms of one deployment, kept as plain Python.

Why not prometheus_client's Counter and Histogram: every ``inc`` and ``observe`` of those takes
a lock (a histogram two) and a histogram scans its buckets linearly; a gateway request records
five to seven values, and its instrumentation must stay a few microseconds. Everything here is
touched only from the event loop, and the scrape (an ``async`` route) reads it from the same
loop, so there is no lock to take. ``collector.py`` renders these numbers in Prometheus' format.

What is kept comes from the catalog alone: one table of series per family ``kept`` there, keyed
by the values of the labels given with each record, so a new counter needs no edit here.
"""

from __future__ import annotations

from bisect import bisect_left

from dgxmm.telemetry import catalog as c
from dgxmm.telemetry.catalog import Family


class Buckets:
    """One histogram series: per-bucket counts (not cumulative; the last is +Inf) and the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bucket "le" counts values <= its bound: the first bound >= value
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)


class DeploymentStats:
    """Counters and histograms of one deployment (``base``: the labels it gives every series).
    Series that rates are taken of start at zero when the deployment is first seen (each
    family's ``zeros``), so the first event after that shows in ``rate()`` and ``increase()``;
    the others appear with their first record. ``unknown``: the numbers of gateway requests tied
    to no deployment, which keep only the families marked ``unknown``."""

    __slots__ = ("base", "counts", "histograms")

    def __init__(self, deployment_id: str, served_name: str, engine: str, *, unknown: bool = False) -> None:
        self.base = {"deployment": deployment_id, "served_name": served_name, "engine": engine}
        families = [f for f in c.KEPT if f.unknown or not unknown]
        self.counts: dict[Family, dict[tuple[str, ...], int]] = {
            f: dict.fromkeys(f.zeros, 0) for f in families if f.kind == "counter"
        }
        self.histograms: dict[Family, dict[tuple[str, ...], Buckets]] = {
            f: {key: Buckets(f.buckets) for key in f.zeros} for f in families if f.kind == "histogram"
        }

    def add(self, family: Family, key: tuple[str, ...] = (), amount: int = 1) -> None:
        """Count ``amount`` in ``family``'s series ``key`` (its record labels' values)."""
        series = self.counts[family]
        series[key] = series.get(key, 0) + amount

    def observe(self, family: Family, value: float, key: tuple[str, ...] = ()) -> None:
        series = self.histograms[family]
        found = series.get(key)
        if found is None:
            found = series[key] = Buckets(family.buckets)
        found.observe(value)

    def count(self, family: Family, key: tuple[str, ...] = ()) -> int:
        """A counter's value, or a histogram's count (0 for a series not seen yet)."""
        if family.kind == "counter":
            return self.counts[family].get(key, 0)
        found = self.histograms[family].get(key)
        return 0 if found is None else found.count

    def labels(self, family: Family) -> list[str]:
        """The values of ``family``'s labels this deployment gives (those before the record's)."""
        return [self.base[label] for label in family.labels if label in self.base]
