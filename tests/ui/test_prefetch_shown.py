"""A swap as the console shows it (issue 40 item 4), in a real browser: while a model waits for
room its card and its detail view say how far the prefetch of its model has read ("Prefetching 16
of 64 MiB"), gone once its start begins; afterwards the requests view says what the request
waited for: the engine's load and how much of the model was in the page cache as it began.

The prefetch reads a real 64 MiB file; its free-memory reading is a gate that holds the reading
thread before its third chunk (16 MiB read), so the console is looked at mid-read, not raced."""

from __future__ import annotations

import asyncio
import os
import re
import threading
from pathlib import Path

import pytest
from conftest import caller, engine_command, gateway_settings, wait_until
from ui.a11y import assert_no_serious_violations
from ui.browser import card, login, page, shot, status_detail  # noqa: F401 (fixture: page)
from unit.test_pagecache import on_disk  # noqa: F401 (fixture: a directory off tmpfs)

from dgxmm.deploy.pagecache import drop

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)
MIB = 1024**2
PREFETCHING = re.compile(r"Prefetching (8|16) of 64 MiB of its model into the page cache\.")


class Gate:
    """A free-memory reading (plenty) that holds the reading thread at its third call."""

    def __init__(self) -> None:
        self.calls = 0
        self.reached, self.go = threading.Event(), threading.Event()

    def __call__(self) -> int:
        self.calls += 1
        if self.calls == 3:
            self.reached.set()
            self.go.wait(60)
        return 64 * 1024**3


async def test_a_queued_model_shows_its_prefetch_and_its_request_the_load(
    serve,
    tmp_path: Path,
    on_disk: Path,
    page,
) -> None:
    model = on_disk / "b.gguf"
    with model.open("wb") as out:
        out.write(b"\x01" * 64 * MIB)
        out.flush()
        os.fsync(out.fileno())  # (written back: the kernel drops clean pages only)
    drop([model])
    svc = await serve(
        gateway_settings(
            tmp_path,
            memory={"capacity_gib": 4},
            ondemand={"evict_idle_s": 0, "stop_settle_s": 0},
            deployer={"metrics_interval_s": 0.2},
        )
    )
    gate = Gate()
    assert svc.ctx.prefetcher is not None
    svc.ctx.prefetcher._free = gate  # (the one reading it makes of free memory)
    slow = engine_command("--chunk-delay", "0.2", "--reply", " ".join(["w"] * 300))  # a minute's stream
    a = await svc.create(name="a", engine="command", memory_gib=4, mode="on_demand", command=slow)
    b = await svc.create(
        name="b", engine="command", model=str(model), memory_gib=4, mode="on_demand", command=engine_command()
    )
    body = {"stream": True, "messages": [{"role": "user", "content": "hi"}]}
    try:
        async with caller(svc, timeout=120) as gw:
            streaming = asyncio.Event()

            async def hold_a() -> None:  # a serves a stream until the test hangs up
                async with gw.stream("POST", f"/{a['id']}/v1/chat/completions", json=body) as resp:
                    async for _ in resp.aiter_bytes():
                        streaming.set()

            holding = asyncio.create_task(hold_a())
            await asyncio.wait_for(streaming.wait(), 60)
            asking = asyncio.create_task(gw.post(f"/{b['id']}/v1/chat/completions", json={**body, "stream": False}))
            await asyncio.to_thread(gate.reached.wait, 30)  # b waits for a; 16 MiB of its file read

            await login(page, svc.url, svc.ctx.admin_token)
            await expect(status_detail(page, "b")).to_contain_text(PREFETCHING)
            await card(page, "b").get_by_role("link", name="b").click()
            detail = page.locator("#detail-view [data-field='status_detail']")
            await expect(detail).to_contain_text(PREFETCHING)
            await expect(detail).to_contain_text("Needs 4 GiB")
            await shot(page, "prefetching")
            await assert_no_serious_violations(page, "detail-prefetching", "#detail-view")

            holding.cancel()  # a's caller hangs up: a idles, stops for b, and b's start ends the prefetch
            answered = await asyncio.wait_for(asking, 60)
            assert answered.status_code == 200, answered.text
            await expect(detail).not_to_contain_text("Prefetching")
    finally:
        gate.go.set()
    await wait_until(lambda: svc.ctx.prefetcher is not None and svc.ctx.prefetcher.progress(b["id"]) is None)

    row = (await svc.client.get("/api/activity?deployment=b")).json()[0]
    assert row["cold_start"] and row["load_s"] is not None and 0 < row["cached_fraction"] < 1, row
    await page.get_by_role("link", name="Requests").click()
    rows = page.locator("#requests-rows tr:not(.request-detail)")
    queued = rows.filter(has=page.locator('td[data-label="Model"]', has_text=re.compile(r"^b$"))).first
    percent = round(row["cached_fraction"] * 100)
    await expect(queued.locator('td[data-label="Queued"]')).to_have_text(
        re.compile(rf"^[\d.]+ s \(cold start: load [\d.]+ s, {percent} % cached\)$")
    )
    await queued.get_by_role("button").click()
    sheet = page.locator("#requests-rows .request-detail")
    await expect(sheet.locator('[data-key="load_s"]')).to_have_text(re.compile(r"^Engine load[\d.]+ s$"))
    await expect(sheet.locator('[data-key="cached_fraction"]')).to_have_text(
        f"In the page cache as the start began{percent} % of the model's files"
    )
    await shot(page, "requests-load")
    await assert_no_serious_violations(page, "requests-load", "#requests-view")
