"""Requests waiting now, in a real browser (issue 41 item 12): the detail view lists the requests
waiting for a model (since when, for what) with a Cancel each, whose caller gets 503
``ondemand_cancelled``; Stop on a model with requests in flight asks first and says how many it
ends. The wizard has the deployment's ``max_concurrent`` (issue 37 item 2)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import caller, engine_command, gateway_settings, one_slot_taken, wait_until
from ui.a11y import assert_no_serious_violations
from ui.browser import card, login, page, shot, status  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_waiting_requests_are_listed_and_cancelled_and_stop_asks_first(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view, held = await one_slot_taken(svc)  # one request in flight: the others wait their turn
    await login(page, svc.url, svc.ctx.admin_token)
    await page.goto(f"{svc.url}/#deployment/{view['id']}")
    async with caller(svc) as g:
        path = f"/{view['id']}/v1/chat/completions"
        waiting = []
        for n in (1, 2):  # one after the other: arrival order is the list's order
            waiting.append(asyncio.create_task(g.post(path, json=CHAT, headers={"x-request-id": f"wait-{n}"})))
            await wait_until(lambda n=n: svc.ctx.ondemand.total_waiting == n)
        panel = page.locator("#detail-waiting-panel")
        await expect(panel.get_by_role("heading", name="Waiting now (2)")).to_be_visible(timeout=15_000)
        rows = panel.locator("tbody tr")
        await expect(rows).to_have_count(2)
        await expect(rows.nth(0)).to_contain_text("wait-1")
        await expect(rows.nth(0)).to_contain_text("its turn (1 at once)")
        await expect(rows.nth(0).locator('td[data-label="Priority"]')).to_have_text("0")  # the key file's
        await expect(page.locator('#detail-view [data-field="status"]')).to_contain_text("Serving 1, 2 waiting")
        await assert_no_serious_violations(page, "waiting-requests")
        await shot(page, "waiting-requests")

        await panel.get_by_role("button", name="Cancel request wait-1").click()
        await expect(page.locator("#detail-waiting-status")).to_have_text(
            "Cancelled request wait-1: its caller got 503 ondemand_cancelled."
        )
        first = await waiting[0]
        assert first.status_code == 503 and first.json()["error"]["code"] == "ondemand_cancelled"
        await expect(rows).to_have_count(1)
        await expect(panel.get_by_role("button", name="Cancel request wait-2")).to_be_focused()
        await panel.get_by_role("button", name="Cancel request wait-2").click()
        assert (await waiting[1]).status_code == 503
        await expect(panel).to_be_hidden()

    # Stop on a model serving a request asks first, and says how many requests it ends.
    actions = page.locator("#detail-actions")
    await actions.get_by_role("button", name="Stop").click()
    confirm = page.get_by_role("dialog", name="Stop m?")
    await expect(confirm).to_be_visible()
    await expect(confirm).to_contain_text("It ends 1 request in flight.")
    await expect(confirm.get_by_role("button", name="Cancel")).to_be_focused()
    await assert_no_serious_violations(page, "stop-asks-first")
    await shot(page, "stop-asks-first")
    await confirm.get_by_role("button", name="Cancel").click()
    await expect(confirm).to_be_hidden()
    assert (await svc.view(view["id"]))["state"] == "ready", "nothing stopped"
    await actions.get_by_role("button", name="Stop").click()
    await confirm.get_by_role("button", name="Stop").click()
    await expect(page.locator("#action-status")).to_have_text("m stopped; it ended 1 request in flight.")
    assert (await svc.view(view["id"]))["state"] == "stopped"
    held.release()


async def test_the_wizard_sets_and_edits_requests_at_once(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("button", name="Deploy a model").click()
    dialog = page.get_by_role("dialog", name="Deploy a model")
    await dialog.get_by_label("Engine").select_option("command")
    await dialog.get_by_label("Command").fill("\n".join(engine_command()))
    await dialog.get_by_label("Name", exact=True).fill("lim")
    await dialog.get_by_label("Memory (GiB)").fill("1")
    await dialog.get_by_label("Always on").check()
    limit = dialog.get_by_label("Requests at once")
    await limit.fill("0")
    await dialog.get_by_role("button", name="Deploy").click()
    error = dialog.locator("#d-max-concurrent-error")
    await expect(error).to_have_text(
        "0 is not allowed: enter a whole number of requests from 1 to 4096, or leave it empty for no limit."
    )
    await assert_no_serious_violations(page, "wizard-requests-at-once-error")
    await limit.fill("3")
    await dialog.get_by_role("button", name="Deploy").click()
    await expect(dialog).to_be_hidden()
    [made] = (await svc.client.get("/api/deployments")).json()
    assert made["max_concurrent"] == 3
    await svc.wait_state(made["id"], "ready")
    await svc.client.post(f"/api/deployments/{made['id']}/stop")
    await expect(status(page, "lim")).to_have_text("Stopped")
    await card(page, "lim").get_by_role("button", name="Edit").click()
    edit = page.get_by_role("dialog", name="Edit lim")
    await expect(edit.get_by_label("Requests at once")).to_have_value("3")
    await edit.get_by_label("Requests at once").fill("")
    await edit.get_by_role("button", name="Save changes").click()
    await expect(edit).to_be_hidden()
    assert (await svc.view(made["id"]))["max_concurrent"] is None


async def test_a_viewer_sees_the_waiting_requests_and_no_cancel(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view, held = await one_slot_taken(svc)
    token = (await svc.client.post("/api/tokens", json={"name": "watch", "role": "viewer"})).json()["token"]
    await login(page, svc.url, token)
    await page.goto(f"{svc.url}/#deployment/{view['id']}")
    async with caller(svc) as g:
        path = f"/{view['id']}/v1/chat/completions"
        waiting = asyncio.create_task(g.post(path, json=CHAT, headers={"x-request-id": "v-1"}))
        panel = page.locator("#detail-waiting-panel")
        await expect(panel.locator("tbody tr")).to_contain_text("v-1", timeout=15_000)
        await expect(panel.get_by_role("button")).to_have_count(0)  # the API would refuse it: 403
        await assert_no_serious_violations(page, "viewer-waiting-requests")
        held.release()
        assert (await waiting).status_code == 200
    await expect(panel).to_be_hidden()
