"""The console's layout at the sizes operators use (issue 30): at 1920 px the memory panel keeps
to one short band (the chart beside the bar), a card is as tall as its content (the tallest one
does not stretch its row) and the detail view's engine log takes the whole width; on a phone the
first deployment shows on the first screen."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.browser import card, chat, login, page, shot, status  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(120)


def box(locator_js: str) -> str:
    return f"() => {{ const r = document.querySelector({locator_js!r}).getBoundingClientRect(); return [r.top, r.height, r.width]; }}"


async def test_wide_and_phone_screens(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    views = [
        await svc.create(
            name=f"m{i:02d}",
            engine="command",
            memory_gib=1,
            mode="on_demand",
            command=engine_command(*(("--fail-start",) if i == 0 else ())),
        )
        for i in range(12)
    ]
    assert await chat(svc, views[0]) == 503  # m00 failed: its card carries the reason, the tallest
    assert await chat(svc, views[1]) == 200
    await page.set_viewport_size({"width": 1920, "height": 1080})
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(status(page, "m00")).to_have_text("Failed")
    await expect(page.locator("#memory-history svg")).to_be_visible()
    await shot(page, "layout-1920")
    _, panel_height, _ = await page.evaluate(box(".memory-panel"))
    assert panel_height < 330, panel_height  # it took 440 px, the chart under the bar
    heights = await page.locator("#cards > li").evaluate_all(
        "els => els.slice(0, 4).map(e => e.getBoundingClientRect().height)"
    )
    assert heights[0] > max(heights[1:]) + 20, heights  # m00's reason makes it taller, alone
    shown = await page.locator("#cards > li").evaluate_all(
        "els => els.filter(e => e.getBoundingClientRect().top < innerHeight - 200).length"
    )
    assert shown >= 6, shown  # a first row of six, well within the first screen

    await card(page, "m01").get_by_role("link", name="m01").click()
    await expect(page.locator("#detail-log")).to_contain_text("listening")
    _, _, log_width = await page.evaluate(box("#detail-log"))
    assert log_width > 1500, log_width  # it was 610 px, a third of the grid

    await page.goto(f"{svc.url}/#deployments")
    await page.set_viewport_size({"width": 375, "height": 812})
    await page.reload()
    await expect(page.locator("#cards > li")).to_have_count(12)
    await expect(page.locator("#memory-history-box")).not_to_have_attribute("open", "")
    await shot(page, "layout-phone")
    first_top, _, _ = await page.evaluate(box("#cards > li"))
    assert first_top < 812 - 100, first_top  # the first deployment starts on the first screen
