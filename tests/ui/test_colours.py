"""A deployment keeps one colour (issue 41 item 4): the same in the memory bar, its legend and the
chart, and the same after another deployment is added (the colour follows the deployment's id,
not its place in a sorted list)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import chat, login, page, shot  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def colour_in(page: Any, where: str, name: str) -> str:
    """The `c-N` class of `name`'s swatch in a legend, or of its segment in the bar."""
    items = page.locator(f"{where} li").filter(has_text=re.compile(rf"^{name}\b")).locator(".swatch")
    if where == "#memory-bar":
        items = page.locator("#memory-bar .seg").filter(has_text=re.compile(rf"^{name}$"))
    await expect(items).to_have_count(1)
    found = re.search(r"\bc-\d\b", await items.get_attribute("class") or "")
    assert found, where
    return found.group(0)


async def colours_of(page: Any, name: str) -> set[str]:
    return {await colour_in(page, where, name) for where in ("#memory-bar", "#memory-legend", ".chart-legend")}


async def test_a_deployment_keeps_its_colour_everywhere_and_when_others_come(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}, ondemand={"idle_timeout_s": 3600}))
    made = {
        name: await svc.create(name=name, engine="command", memory_gib=4, mode="on_demand", command=engine_command())
        for name in ("mid", "zed")
    }
    await login(page, svc.url, svc.ctx.admin_token)
    for view in made.values():
        assert await chat(svc, view) == 200
    await expect(page.locator("#memory-history figcaption")).to_contain_text("now 8 GiB held")
    await expect(page.locator(".chart-legend li")).to_have_count(2)
    before = {name: await colours_of(page, name) for name in made}
    assert all(len(found) == 1 for found in before.values()), before  # one colour in bar, legend and chart
    assert before["mid"] != before["zed"]

    # A deployment whose name sorts first (and a fixed one, which the chart draws first) comes.
    first = await svc.create(name="aaa", engine="command", memory_gib=4, mode="always_on", command=engine_command())
    await svc.wait_state(first["id"], "ready")
    await expect(page.locator("#memory-history figcaption")).to_contain_text("now 12 GiB held")
    await expect(page.locator(".chart-legend li")).to_have_count(3)
    after = {name: await colours_of(page, name) for name in made}
    assert after == before, (before, after)
    new = await colours_of(page, "aaa")
    assert len(new) == 1 and new.isdisjoint(before["mid"] | before["zed"])
    await shot(page, "colours-stable")
    await assert_no_serious_violations(page, "colours-stable")
