"""Many models in a real browser: 30 deployments at 1920 px, the cards using the whole width, the
table view sorted and filtered by status, mode and name, relative times, and the choice of view,
filters and sort remembered after a reload."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.browser import chat, login, page, shot, status  # noqa: F401 (fixtures: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_table_view_with_30_deployments(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 100}))
    deps = {}
    for i in range(1, 31):
        name = f"m{i:02d}"
        deps[name] = await svc.create(
            name=name,
            engine="command",
            memory_gib=31 - i,
            mode="on_demand",
            command=engine_command(*(("--fail-start",) if i == 30 else ())),
        )
    assert await chat(svc, deps["m03"]) == 200
    assert await chat(svc, deps["m07"]) == 200
    assert await chat(svc, deps["m30"]) == 503
    await page.set_viewport_size({"width": 1920, "height": 1080})
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(page.locator("#cards > li")).to_have_count(30)
    await expect(status(page, "m30")).to_have_text("Failed")

    # At 1920 px the cards fill the width: at least five side by side, reaching the right edge.
    # Waited for, not read once: the cards settle as the history and status arrive after the list.
    await page.wait_for_function(
        """() => {
            const boxes = [...document.querySelectorAll('#cards > li')].map(c => c.getBoundingClientRect());
            const row = boxes.filter(b => Math.abs(b.top - boxes[0].top) < 2);
            return row.length >= 5 && Math.max(...row.map(b => b.right)) > 1800;
        }""",
        timeout=15_000,
    )
    await shot(page, "cards-1920")

    # The table: one row each, sortable; the sort is shown on its column.
    await page.get_by_label("Table").check()
    table = page.locator("#dep-table")
    rows = table.locator("tbody tr")
    await expect(rows).to_have_count(30)
    # Problems first by default (issue 58): the failed one, then the others by name.
    await expect(rows.first.locator('td[data-col="Name"]')).to_have_text("m30")
    await expect(rows.nth(1).locator('td[data-col="Name"]')).to_have_text("m01")
    memory = table.get_by_role("button", name="Memory")
    await memory.click()
    await expect(table.locator('th[data-sort="memory"]')).to_have_attribute("aria-sort", "ascending")
    await expect(rows.first.locator('td[data-col="Name"]')).to_have_text("m30")  # 1 GiB
    await memory.click()
    await expect(table.locator('th[data-sort="memory"]')).to_have_attribute("aria-sort", "descending")
    await expect(rows.first.locator('td[data-col="Name"]')).to_have_text("m01")  # 30 GiB
    await table.get_by_role("button", name="Status").click()
    await expect(rows.first.locator('td[data-col="Name"]')).to_have_text("m30")  # failed first
    await expect(rows.first.locator(".badge .label")).to_have_text("Failed")
    row = rows.filter(has=page.get_by_role("link", name="m03", exact=True))
    await expect(row.locator(".badge .label")).to_have_text("Idle")
    await expect(row.locator('td[data-col="Last request"]')).to_have_text(re.compile(r"^(just now|\d+ s ago)$"))
    await expect(row.locator('td[data-col="Changed"]')).to_have_text(re.compile(r"ago$|^just now$"))
    await shot(page, "table-30", full_page=True)

    # Filters: by name, by status, by mode; the count says how many are shown.
    await page.get_by_label("Filter by name").fill("m1")
    await expect(table.locator("tbody tr:visible")).to_have_count(10)
    await expect(page.locator("#filter-count")).to_have_text("Showing 10 of 30.")
    await page.get_by_label("Filter by name").fill("")
    await page.get_by_label("Filter by status").select_option("idle")
    await expect(table.locator("tbody tr:visible")).to_have_count(2)
    await page.get_by_label("Filter by status").select_option("failed")
    await expect(table.locator("tbody tr:visible")).to_have_count(1)
    await page.get_by_label("Filter by status").select_option("")
    await page.get_by_label("Filter by mode").select_option("always_on")
    await expect(table.locator("tbody tr:visible")).to_have_count(0)
    await expect(page.locator("#filter-count")).to_have_text("Showing 0 of 30.")
    await page.get_by_label("Filter by mode").select_option("on_demand")
    await expect(table.locator("tbody tr:visible")).to_have_count(30)

    # Remembered: after a reload the table is back, with its sort and filters.
    await page.get_by_label("Filter by name").fill("m2")
    await page.reload()
    await expect(page.locator("#conn")).to_have_text("Live")
    await expect(page.get_by_label("Table")).to_be_checked()
    await expect(page.get_by_label("Filter by name")).to_have_value("m2")
    await expect(table.locator("tbody tr:visible")).to_have_count(10)
    await expect(table.locator('th[data-sort="status"]')).to_have_attribute("aria-sort", "ascending")
    await expect(page.locator("#cards")).to_be_hidden()


async def test_the_table_is_compact_at_1280_px(serve, tmp_path: Path, page) -> None:
    """Issue 58: at 1280 px a row's actions wrapped, making rows about 110 px high (8 of 40
    deployments a screen). Each row's actions now stay on one line, and rows stay low."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 100}))
    names = [f"qwen2.5-coder-{n}b-instruct" for n in range(1, 9)] + ["llama-3.1-8b-always", "embed-always"]
    for name in names:
        always = name.endswith("always")
        await svc.create(
            name=name, engine="command", memory_gib=4, mode="always_on" if always else "on_demand",
            served_name=f"org/{name}-awq", command=engine_command(),
        )  # fmt: skip
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_label("Table").check()
    rows = page.locator("#dep-rows tr")
    await expect(rows).to_have_count(10)
    await expect(rows.filter(has_text="Ready")).to_have_count(2, timeout=30_000)
    sizes = await page.evaluate(
        """() => [...document.querySelectorAll('#dep-rows tr')].map((tr) => {
          const buttons = [...tr.querySelectorAll('.row-actions button:not([hidden])')].map((b) => b.getBoundingClientRect().top);
          return [tr.getBoundingClientRect().height, Math.max(...buttons) - Math.min(...buttons)];
        })"""
    )
    await shot(page, "table-1280")
    assert all(spread < 2 for _, spread in sizes), sizes  # each row's actions on one line
    assert max(height for height, _ in sizes) <= 60, sizes
    wrap = await page.locator("#table-wrap").evaluate("(el) => [el.scrollWidth, el.clientWidth]")
    assert wrap[0] <= wrap[1], f"the table scrolls sideways: {wrap}"
