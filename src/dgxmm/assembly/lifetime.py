"""The running service's lifetime after assembly: its background tasks started in order, and its
shutdown, which ends them, then the engines, then the clients."""

from __future__ import annotations

import asyncio
import logging

from dgxmm.context import Context
from dgxmm.declared.watch import Declared
from dgxmm.deploy.devicewatch import watch_devices
from dgxmm.errors import StoreUnavailable
from dgxmm.gateway.callerkeys import CallerKeys
from dgxmm.gateway.keys import KeyFile
from dgxmm.store.db import STORE_RETRY_S
from dgxmm.stoprequest import stop_engines_asked

log = logging.getLogger(__name__)

USAGE_FLUSH_S = 5.0  # how often the caller keys' usage is written (a request never waits for it)


async def recheck_key(keys: KeyFile, interval_s: float) -> None:
    """Look at the key file on a clock too, not only when a request asks: a rotation reaches the
    LiteLLM sync, and a vanished key the log, without waiting for traffic."""
    while True:
        keys.current()
        await asyncio.sleep(max(interval_s, 1.0))


def flush_usage(callers: CallerKeys) -> None:
    """Write the caller keys' usage; a database that cannot be written keeps it for the next try
    (the store logged why)."""
    try:
        callers.flush()
    except StoreUnavailable:
        pass


async def write_usage(callers: CallerKeys, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        flush_usage(callers)


def start_background_tasks(ctx: Context, declared: Declared) -> None:
    sup = ctx.supervisor
    if declared.watched:
        sup.start("declared-deployments", declared.run)
    sup.start("peer-refresh", ctx.peers.run)
    if ctx.scrape.public is not None:
        sup.start("scrape-peer-refresh", ctx.scrape.public.run)
    if ctx.settings.ondemand.key_file is not None:
        sup.start("key-recheck", lambda: recheck_key(ctx.keys, ctx.settings.ondemand.key_check_interval_s))
    if ctx.litellm is not None:
        ctx.keys.current()  # read the key before the first sync
        ctx.litellm.trigger()
        sup.start("litellm-sync", ctx.litellm.run)
    sup.start("metrics-sampler", ctx.sampler.run)
    sup.start("loop-lag", ctx.metrics.loop_lag.run)
    if ctx.settings.memory.source == "nvml":
        interval = ctx.settings.deployer.metrics_interval_s
        sup.start("device-watch", lambda: watch_devices(ctx.deployer, interval))
    sup.start("ondemand-reaper", ctx.ondemand.run)
    sup.start("live-status", ctx.live.run)
    sup.start("store-retry", lambda: ctx.store.retry(STORE_RETRY_S))
    ctx.models.resume()  # the pulls a stop or a crash interrupted go on where they stopped
    sup.start("key-usage", lambda: write_usage(ctx.callers, USAGE_FLUSH_S))


async def shutdown(ctx: Context) -> None:
    """The end of the lifespan (requests have ended or been cancelled): background tasks, then
    engines (stopped with their grace and recorded, or left to the runtime), then clients."""
    ctx.begin_shutdown()
    ctx.ondemand.close()
    if ctx.prefetcher is not None:
        await ctx.prefetcher.close()  # (a read stops within one chunk)
    await ctx.supervisor.close()
    await ctx.models.close()  # transfers stop; their records stay downloading, resumed at the next start
    flush_usage(ctx.callers)
    for what in ctx.callers.unwritten():
        log.error("%s was never written (the database cannot be written): the next start undoes it", what)
    await ctx.deployer.close(stop_engines=stop_engines_asked(ctx.settings.server.data_dir))
    await ctx.upstream.close()
    ctx.bus.close()
    ctx.activity_feed.close()
    ctx.activity.close()
    ctx.finish.refusals.close()
    await ctx.http.close()
    logging.getLogger().removeHandler(ctx.server_log)
