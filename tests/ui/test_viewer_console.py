"""A viewer token in the console (issue 37 item 4): it reads every view and is offered nothing that
changes state, which the API would refuse with 403 (no Deploy, no Stop all idle, no actions on a
card, a table row or the detail view, no playground, no pull), and the header says "Read-only";
the admin token sees all of it on the same page after logging in again. axe finds nothing serious."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import card, login, page  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_a_viewer_is_offered_no_change(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path))
    body = {"name": "chat", "engine": "command", "command": engine_command(), "memory_gib": 1, "mode": "on_demand"}
    assert (await svc.client.post("/api/deployments", json=body)).status_code == 201
    made = await svc.client.post("/api/tokens", json={"name": "watcher", "role": "viewer"})
    await login(page, svc.url, made.json()["token"])
    await expect(card(page, "chat")).to_be_visible()
    await expect(page.get_by_text("Read-only", exact=True)).to_be_visible()
    await expect(page.get_by_role("button", name="Deploy a model")).to_be_hidden()
    await expect(page.get_by_role("button", name="Stop all idle")).to_be_hidden()
    await expect(card(page, "chat").get_by_role("button")).to_have_count(0)
    await assert_no_serious_violations(page, "viewer-deployments")

    await page.get_by_role("radio", name="Table").check()
    row = page.locator("#dep-rows tr").filter(has_text="chat")
    await expect(row).to_be_visible()
    await expect(row.get_by_role("button")).to_have_count(0)
    await expect(page.get_by_role("columnheader", name="Actions")).to_be_hidden()
    await page.get_by_role("radio", name="Cards").check()

    await card(page, "chat").get_by_role("link", name="chat").click()
    await expect(page.locator("#detail-title")).to_have_text("chat")
    await expect(page.locator("#detail-actions")).to_be_hidden()
    await expect(page.locator("#playground-form")).to_be_hidden()
    await assert_no_serious_violations(page, "viewer-detail")

    await page.get_by_role("link", name="Models").click()
    await expect(page.get_by_role("heading", name="Pulled models")).to_be_visible()
    await expect(page.get_by_role("heading", name="Pull a model")).to_be_hidden()

    # The admin token on the same page: everything is offered again.
    await page.get_by_role("button", name="Log out").click()
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(page.get_by_role("button", name="Deploy a model")).to_be_visible()
    await expect(page.get_by_text("Read-only", exact=True)).to_be_hidden()
    await expect(card(page, "chat").get_by_role("button", name="Start")).to_be_visible()
