"""A start that does not fit, in a real browser (issue 30): the card names the idle models holding
the memory and offers to stop just enough of them (least recently used first) and then start, or
every idle one; the chosen offer stops those models, and only those, and starts the model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import card, chat, login, page, shot, status  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_a_start_that_does_not_fit_offers_to_stop_idle_models(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 10}, ondemand={"idle_timeout_s": 3600}))
    older = await svc.create(name="older", engine="command", memory_gib=4, mode="on_demand", command=engine_command())
    newer = await svc.create(name="newer", engine="command", memory_gib=4, mode="on_demand", command=engine_command())
    big = await svc.create(name="big", engine="command", memory_gib=6, mode="on_demand", command=engine_command())
    await login(page, svc.url, svc.ctx.admin_token)
    assert await chat(svc, older) == 200
    assert await chat(svc, newer) == 200  # both idle, 8 GiB held: 2 GiB free for a 6 GiB model
    await expect(status(page, "newer")).to_have_text("Idle")

    await card(page, "big").get_by_role("button", name="Start").click()
    refused = card(page, "big")
    await expect(refused.locator('[data-field="error"]')).to_contain_text("big needs 6 GiB, 2.0 GiB free")
    offer = refused.locator('[data-field="offer"]')
    await expect(offer).to_contain_text("Idle models hold 8.0 GiB: older (4 GiB), newer (4 GiB).")
    await expect(offer.get_by_role("button", name="Stop all idle (2), then start")).to_be_visible()
    await assert_no_serious_violations(page, "start-offers-room")
    await shot(page, "start-offers-room")

    await offer.get_by_role("button", name="Stop older, then start").click()
    await expect(status(page, "big")).to_have_text("Idle", timeout=20_000)
    await expect(status(page, "older")).to_have_text("Cold")
    await expect(status(page, "newer")).to_have_text("Idle")
    await expect(offer).to_be_hidden()
    await expect(page.locator("#action-status")).to_contain_text("big: ready after")
    assert [(await svc.view(d["id"]))["state"] for d in (older, newer, big)] == ["stopped", "ready", "ready"]


async def test_the_offer_stops_the_fewest_models_that_free_enough(serve, tmp_path: Path, page) -> None:
    """Issue 41: it offered the two least recently used where the larger of them alone frees
    enough; the fewest that free enough, least recently used first among sets as small."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 12}, ondemand={"idle_timeout_s": 3600}))
    small = await svc.create(name="small", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    large = await svc.create(name="large", engine="command", memory_gib=6, mode="on_demand", command=engine_command())
    other = await svc.create(name="other", engine="command", memory_gib=3, mode="on_demand", command=engine_command())
    await svc.create(name="big", engine="command", memory_gib=6, mode="on_demand", command=engine_command())
    await login(page, svc.url, svc.ctx.admin_token)
    for view in (small, large, other):  # used in this order: small least recently
        assert await chat(svc, view) == 200
    await expect(status(page, "other")).to_have_text("Idle")
    await card(page, "big").get_by_role("button", name="Start").click()  # 1 GiB free: 5 GiB short
    offer = card(page, "big").locator('[data-field="offer"]')
    await expect(offer.get_by_role("button", name="Stop large, then start")).to_be_visible()
    await assert_no_serious_violations(page, "start-offers-fewest")


async def test_the_memory_chart_has_a_time_axis_and_a_colour_for_each_model(serve, tmp_path: Path, page) -> None:
    """Issue 30: the chart had no time axis and told three shades apart, so a fourth model
    looked like the first. Now each band has its own colour, named in a legend under it."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}, ondemand={"idle_timeout_s": 3600}))
    views = [
        await svc.create(name=f"m{i}", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
        for i in range(4)
    ]
    await login(page, svc.url, svc.ctx.admin_token)
    for view in views:
        assert await chat(svc, view) == 200
    chart = page.locator("#memory-history")
    await expect(chart.locator("figcaption")).to_contain_text("now 8 GiB held of 24 GiB")
    legend = chart.locator(".chart-legend li")
    await expect(legend).to_have_text(["m0", "m1", "m2", "m3"])
    swatches = await legend.locator(".swatch").evaluate_all("els => els.map(e => getComputedStyle(e).backgroundColor)")
    bands = await chart.locator("svg .band").evaluate_all("els => els.map(e => getComputedStyle(e).fill)")
    assert len(set(swatches)) == 4 and sorted(bands) == sorted(swatches), (swatches, bands)
    axis = chart.locator(".time-axis span")
    await expect(axis).to_have_count(5)
    await expect(axis.last).to_have_text("now")
    await expect(axis.first).to_have_text(re.compile(r"^\d\d:\d\d"))
    await shot(page, "memory-chart-colours")


async def test_always_on_when_memory_is_short_offers_room_as_start_does(serve, tmp_path: Path, page) -> None:
    """Issue 41 item 10: the mode switch showed the raw refusal in its dialog, without the offer."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 10}, ondemand={"idle_timeout_s": 3600}))
    older = await svc.create(name="older", engine="command", memory_gib=4, mode="on_demand", command=engine_command())
    newer = await svc.create(name="newer", engine="command", memory_gib=4, mode="on_demand", command=engine_command())
    big = await svc.create(name="big", engine="command", memory_gib=6, mode="on_demand", command=engine_command())
    await login(page, svc.url, svc.ctx.admin_token)
    assert await chat(svc, older) == 200
    assert await chat(svc, newer) == 200
    await expect(status(page, "newer")).to_have_text("Idle")

    await card(page, "big").get_by_role("button", name="Change mode").click()
    dialog = page.get_by_role("dialog", name="Mode of big")
    await dialog.get_by_label("Always on").check()
    await dialog.get_by_role("button", name="Save").click()
    await expect(dialog).to_be_hidden()
    refused = card(page, "big")
    await expect(refused.locator('[data-field="error"]')).to_contain_text("big needs 6 GiB, 2.0 GiB free")
    await expect(refused.locator('[data-field="error"]')).not_to_contain_text("insufficient_memory")
    offer = refused.locator('[data-field="offer"]')
    some = offer.get_by_role("button", name="Stop older, then switch to always on")
    await expect(some).to_be_focused()
    await expect(offer.get_by_role("button", name="Stop all idle (2), then switch to always on")).to_be_visible()
    await assert_no_serious_violations(page, "mode-offers-room")
    await some.click()
    await svc.wait_state(big["id"], "ready")
    view = await svc.view(big["id"])
    assert view["mode"] == "always_on" and view["pending_mode"] is None
    assert (await svc.view(older["id"]))["state"] == "stopped"
    assert (await svc.view(newer["id"]))["state"] == "ready"
    await expect(offer).to_be_hidden()
