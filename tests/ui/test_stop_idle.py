"""What operators reach for on a full host (issue 41 item 13): "Stop all idle" stops the idle
on-demand models and nothing else, and the table view has each row's actions."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import chat, login, page, shot, status  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_stop_all_idle_and_the_rows_actions(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}, ondemand={"idle_timeout_s": 3600}))
    idle = [
        await svc.create(name=f"idle{i}", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
        for i in range(2)
    ]
    cold = await svc.create(name="cold", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    fixed = await svc.create(name="fixed", engine="command", memory_gib=2, mode="always_on", command=engine_command())
    await svc.wait_state(fixed["id"], "ready")
    await login(page, svc.url, svc.ctx.admin_token)
    for view in idle:
        assert await chat(svc, view) == 200
    await expect(status(page, "idle1")).to_have_text("Idle")
    button = page.get_by_role("button", name="Stop all idle (2)")
    await expect(button).to_be_enabled()
    await assert_no_serious_violations(page, "stop-all-idle")
    await button.click()
    await expect(page.locator("#action-status")).to_have_text("Stopped 2 idle: idle0, idle1.")
    for view in idle:
        assert (await svc.view(view["id"]))["state"] == "stopped"
    assert (await svc.view(fixed["id"]))["state"] == "ready"
    await expect(page.get_by_role("button", name="Stop all idle", exact=True)).to_be_disabled()

    # The table: each row has the card's actions, named by its row.
    await page.get_by_label("Table").check()
    row = page.locator(f'#dep-rows tr[data-id="{cold["id"]}"]')
    await expect(row.get_by_role("button", name="Stop")).to_have_count(0)
    start = row.get_by_role("button", name="Start")
    await expect(start).to_have_accessible_description("cold")
    await start.click()
    await svc.wait_state(cold["id"], "ready")
    await expect(row.get_by_role("button", name="Stop")).to_be_visible()
    await expect(row.get_by_role("button", name="Start")).to_be_hidden()
    await shot(page, "table-row-actions")
    await assert_no_serious_violations(page, "table-row-actions")
    await row.get_by_role("button", name="Stop").click()
    await svc.wait_state(cold["id"], "stopped")
    await expect(page.locator("#action-status")).to_have_text("cold stopped.")
