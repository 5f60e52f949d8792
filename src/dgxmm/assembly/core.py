"""What every subsystem is built on: the event bus, the metrics, the supervisor, the HTTP client
of the engines, the gateway's pools, the admin token and this dgxmm's name in a fleet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import aiohttp

from dgxmm.api.auth import load_or_create_token
from dgxmm.datadir import warn_if_readable
from dgxmm.engineclient.pool import UpstreamClients
from dgxmm.events import EventBus
from dgxmm.settings import Settings
from dgxmm.store.db import Store
from dgxmm.supervisor import Supervisor
from dgxmm.telemetry.metrics import Metrics


def token_path(settings: Settings) -> Path:
    return settings.server.admin_token_file or settings.server.data_dir / "admin-token"


def instance_id(settings: Settings, store: Store) -> str:
    """``[server] instance_id`` when set, else the id this database drew once (docs/fleet.md)."""
    return settings.server.instance_id or store.instance_id()


def warn_about_readable_secrets(settings: Settings) -> None:
    warn_if_readable(token_path(settings), "admin token file")
    warn_if_readable(settings.ondemand.key_file, "on-demand key file")
    warn_if_readable(settings.litellm.master_key_file, "LiteLLM master key file")
    warn_if_readable(settings.models.hub_token_file, "hub token file")


@dataclass(frozen=True)
class Core:
    """What every subsystem is built on."""

    bus: EventBus
    metrics: Metrics
    supervisor: Supervisor  # the long-lived background tasks
    http: aiohttp.ClientSession  # probes and metrics: no keep-alive, no idle connection to an engine
    upstream: UpstreamClients  # the gateway's kept-alive connections to the engines
    admin_token: str
    instance: str  # this dgxmm's name in a fleet


def build_core(settings: Settings, store: Store) -> Core:
    bus = EventBus(store)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
    token = load_or_create_token(token_path(settings))
    warn_about_readable_secrets(settings)
    upstream = UpstreamClients(settings.ondemand)
    return Core(bus, Metrics(), Supervisor(bus), http, upstream, token, instance_id(settings, store))
