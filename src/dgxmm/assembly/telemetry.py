"""The telemetry subsystem built: the activity log and its live feed, a gateway request's end,
dgxmm's own latest log lines, and who may read the metrics."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from dgxmm.events import EventBus
from dgxmm.gateway.peers import NetworkSource, PeerPolicy
from dgxmm.settings import Settings
from dgxmm.store.db import Store
from dgxmm.telemetry.access import Finisher
from dgxmm.telemetry.activity import Activity
from dgxmm.telemetry.endpoint import ScrapeAccess
from dgxmm.telemetry.metrics import Metrics
from dgxmm.telemetry.serverlog import RecentLines


@dataclass(frozen=True)
class TelemetryParts:
    activity: Activity  # the activity log of gateway requests
    activity_feed: EventBus  # its records, live, for the console
    finish: Finisher  # a gateway request's end: metrics, activity, access line; a refused one's summary
    server_log: RecentLines  # dgxmm's own latest lines, for the console


def build_telemetry(
    settings: Settings, store: Store, metrics: Metrics, log_position: Callable[[str], int | None]
) -> TelemetryParts:
    """``log_position``: where a deployment's engine log is when a request ends (the runtime's)."""
    server_log = RecentLines()
    logging.getLogger().addHandler(server_log)  # removed at the shutdown (assembly.lifetime)
    a = settings.activity
    feed = EventBus(store)  # the activity's own live feed: not every console page's
    activity = Activity(
        a.keep,
        settings.server.data_dir / "activity.jsonl" if a.file else None,
        a.file_max_bytes,
        a.file_count,
        publish=lambda record: feed.publish("activity", record),
        log_position=log_position,
    )
    return TelemetryParts(activity, feed, Finisher(metrics, activity), server_log)


def build_scrape(
    settings: Settings, token: str, networks: NetworkSource, viewer: Callable[[str], bool]
) -> ScrapeAccess:
    """The admin token or a viewer's reads the metrics; with ``[metrics] public``, so does an
    allowed peer without one."""
    o = settings.ondemand
    scrapers = (
        PeerPolicy(
            settings.metrics.allowed_cidrs,
            o.decider_network,
            networks,
            o.peer_refresh_s,
            serves="unauthenticated /metrics",
        )
        if settings.metrics.public
        else None
    )
    return ScrapeAccess(token, scrapers, viewer)
