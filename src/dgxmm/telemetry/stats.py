"""The numbers behind the counters and histograms of one deployment, kept as plain Python.

Why not prometheus_client's Counter and Histogram: every ``inc`` and ``observe`` of those takes
a lock (a histogram two) and a histogram scans its buckets linearly; a gateway request records
five to seven values, and its instrumentation must stay a few microseconds. Everything here is
touched only from the event loop, and the scrape (an ``async`` route) reads it from the same
loop, so there is no lock to take. ``collector.py`` renders these numbers in Prometheus' format.
"""

from __future__ import annotations

from bisect import bisect_left

from dgxmm.telemetry import catalog as c


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
    """Counters and histograms of one deployment (``labels``: id and served name). Series that
    rates are taken of start at zero when the deployment is first seen, so the first event after
    that shows in ``rate()`` and ``increase()``; only the request counters, keyed by route and
    status class, appear with their first request."""

    __slots__ = ("cold_start", "duration", "engine", "first_byte", "labels", "launch", "queue_wait", "queued",
                 "refusals", "requests", "response_bytes", "start_failures", "start_seconds", "starts", "stops",
                 "wait_ends", "wakes", "watchdog")  # fmt: skip

    def __init__(self, deployment_id: str, served_name: str, engine: str) -> None:
        self.labels = (deployment_id, served_name)
        self.engine = engine
        self.requests: dict[tuple[str, str], int] = {}  # (route, status class) -> count
        self.refusals = dict.fromkeys((*c.REASONS.values(), c.OTHER_REASON), 0)
        self.first_byte = Buckets(c.FIRST_BYTE.buckets)
        self.duration = Buckets(c.DURATION.buckets)
        self.response_bytes = 0
        self.queue_wait = Buckets(c.QUEUE_WAIT.buckets)  # granted waits
        self.wait_ends = dict.fromkeys(c.WAIT_OUTCOMES, 0)
        self.queued = 0
        self.cold_start = Buckets(c.COLD_START.buckets)
        self.starts = 0
        self.wakes = 0
        self.stops = dict.fromkeys(c.STOP_REASONS, 0)
        self.start_failures = 0
        # (kind, outcome) -> histogram; wakes appear with the first one
        self.start_seconds = {("start", outcome): Buckets(c.START_SECONDS.buckets) for outcome in c.START_OUTCOMES}
        self.launch = Buckets(c.LAUNCH.buckets)
        self.watchdog = 0

    def started(self, kind: str, outcome: str) -> Buckets:
        key = (kind, outcome)
        found = self.start_seconds.get(key)
        if found is None:
            found = self.start_seconds[key] = Buckets(c.START_SECONDS.buckets)
        return found
