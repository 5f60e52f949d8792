"""The metrics sampler against real sockets: engines whose metrics pages answer when the test says.

A CPU engine busy generating can take seconds to serve its page (a vLLM CPU build on two cores
did, and every read cut off at the interval left the deployment unsampled for minutes). These
tests hold a page open with an event, never with a sleep, and check what the sampler does
meanwhile: no second read of the same engine, the other engines sampled round after round, and
the held read's sample stamped with the time it was sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from conftest import wait_until

from dgxmm.deploy.sampler import MetricsSampler
from dgxmm.records.deployment import Deployment, RuntimeHandle, State

PAGE = "vllm:num_requests_running 1\nvllm:num_requests_waiting 2\n"


@dataclass
class Page:
    """One engine's metrics page: counts its reads; while ``gate`` is clear, reads wait for it."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    reads: int = 0
    answered: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.reads += 1
        await self.gate.wait()
        self.answered += 1
        return web.Response(text=PAGE)


class Engines:
    def __init__(self) -> None:
        self.deps: list[Deployment] = []

    def all(self) -> list[Deployment]:
        return self.deps


@pytest.fixture
async def engines() -> AsyncIterator[tuple[Engines, dict[str, Page]]]:
    pages = {"slow": Page(), "quick": Page()}
    pages["quick"].gate.set()
    app = web.Application()
    for name, page in pages.items():
        app.router.add_get(f"/{name}/metrics", page.handle)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    found = Engines()
    for name in pages:
        handle = RuntimeHandle(ref=name, base_url=f"http://127.0.0.1:{port}/{name}")
        found.deps.append(
            Deployment(
                id=name,
                name=name,
                served_name=name,
                engine="vllm",
                model="/m",
                memory_gib=1,
                state=State.READY,
                runtime_handle=handle,
            )
        )
    yield found, pages
    for page in pages.values():
        page.gate.set()
    await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def test_a_page_slower_than_the_interval_is_read_once_and_holds_back_no_one(engines, http) -> None:
    deps, pages = engines
    sampler = MetricsSampler(deps, http, interval_s=0.01, timeout_s=60)
    runner = asyncio.create_task(sampler.run())
    try:
        await wait_until(lambda: pages["quick"].answered >= 20)  # twenty rounds went by...
        assert pages["slow"].reads == 1  # ...with one read of the held page in flight, not twenty
        assert sampler.latest("slow") is None
        quick = sampler.latest("quick")
        assert quick is not None and (quick.running, quick.waiting) == (1, 2)

        pages["slow"].gate.set()
        await wait_until(lambda: pages["slow"].reads >= 3)  # once answered, it is read every round again
        slow = sampler.latest("slow")
        assert slow is not None and (slow.running, slow.waiting) == (1, 2)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


async def test_a_slow_read_is_stamped_with_the_time_it_was_sent(engines, http) -> None:
    deps, pages = engines
    sampler = MetricsSampler(deps, http, interval_s=60, timeout_s=60)
    round_ = asyncio.create_task(sampler.sample_once())
    await wait_until(lambda: pages["slow"].reads == 1)
    before_release = time.monotonic()
    pages["slow"].gate.set()
    await round_
    slow = sampler.latest("slow")
    assert slow is not None and (slow.running, slow.waiting) == (1, 2)
    assert slow.time < before_release  # the counts may be from any moment after the send


async def test_a_read_past_its_timeout_leaves_no_sample_and_the_next_round_reads_again(engines, http) -> None:
    deps, pages = engines
    # The timeout is long enough for the read to reach the page on a loaded machine (with 0.05 s a
    # busy CI machine timed the read out before it arrived); the page never answers anyway.
    sampler = MetricsSampler(deps, http, interval_s=60, timeout_s=3)
    await sampler.sample_once()  # the held page times out within this round
    assert pages["slow"].reads == 1 and pages["slow"].answered == 0
    assert sampler.latest("slow") is None and sampler.latest("quick") is not None
    await sampler.sample_once()
    assert pages["slow"].reads == 2


async def test_stopping_the_sampler_cancels_its_reads_in_flight(engines, http) -> None:
    deps, pages = engines
    sampler = MetricsSampler(deps, http, interval_s=60, timeout_s=60)
    runner = asyncio.create_task(sampler.run())
    await wait_until(lambda: pages["slow"].reads == 1)
    [read] = [t for t in asyncio.all_tasks() if t.get_name() == "metrics-slow"]
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    await asyncio.gather(read, return_exceptions=True)
    assert read.cancelled()
