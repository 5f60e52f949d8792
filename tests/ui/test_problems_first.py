"""Problems first, in a real browser (issue 58 item 3): a failed, a waiting and a refusing
deployment come first on the overview by default (cards and table), counted in the header and the
page's title; an order the user picks is kept (and remembered); a failed model's detail view says
why first; Start pressed in the detail view of a model short of memory offers the room, as its card
does, and never says a start that is only queued failed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import card, chat, login, page, shot, status  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)

# The cards' names, top to bottom, as the page shows them.
CARD_NAMES = "() => [...document.querySelectorAll('#cards > li h2, #cards > li h3')].map((h) => h.textContent.trim())"


async def card_names(page) -> list[str]:
    return [name for name in await page.evaluate(CARD_NAMES) if name]


async def test_failed_and_refusing_deployments_come_first_and_are_counted(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    for name in ("alpha", "beta", "gamma"):
        await svc.create(name=name, engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    broken = await svc.create(
        name="zeta-broken", engine="command", memory_gib=2, mode="on_demand", command=engine_command("--fail-start")
    )
    await svc.create(name="omega-huge", engine="command", memory_gib=40, mode="on_demand", command=engine_command())
    assert await chat(svc, broken) == 503
    await svc.wait_state(broken["id"], "failed")

    await login(page, svc.url, svc.ctx.admin_token)
    await expect(status(page, "zeta-broken")).to_have_text("Failed")
    await expect(page.locator("#problems")).to_have_text("1 failed · 1 refusing")
    await expect(page).to_have_title("1 failed · 1 refusing — dgxmm")
    await expect(page.get_by_label("Order")).to_have_value("problems")
    await page.wait_for_function(f"() => ({CARD_NAMES})()[0] === 'zeta-broken'")
    assert await card_names(page) == ["zeta-broken", "omega-huge", "alpha", "beta", "gamma"]
    await assert_no_serious_violations(page, "problems-first")
    await shot(page, "problems-first")

    # The table too, by default.
    await page.get_by_label("Table").check()
    rows = page.locator("#dep-rows tr")
    await expect(rows.first.locator('td[data-col="Name"] a')).to_have_text("zeta-broken")
    await expect(rows.nth(1).locator('td[data-col="Name"] a')).to_have_text("omega-huge")

    # An order the user picks is kept, for both, and remembered after a reload.
    await page.get_by_label("Order").select_option("name")
    await expect(rows.first.locator('td[data-col="Name"] a')).to_have_text("alpha")
    await page.get_by_label("Cards").check()
    assert await card_names(page) == ["alpha", "beta", "gamma", "omega-huge", "zeta-broken"]
    await page.reload()
    await expect(page.locator("#conn")).to_have_text("Live")
    await expect(page.get_by_label("Order")).to_have_value("name")
    await expect(status(page, "zeta-broken")).to_have_text("Failed")
    assert await card_names(page) == ["alpha", "beta", "gamma", "omega-huge", "zeta-broken"]
    # A column of the table picks an order as well, and the toolbar says which.
    await page.get_by_label("Table").check()
    await page.locator("#dep-table").get_by_role("button", name="Status").click()
    await expect(page.get_by_label("Order")).to_have_value("status")
    await expect(rows.first.locator('td[data-col="Name"] a')).to_have_text("zeta-broken")

    # The failed model's detail view says why first; its title keeps the counts before its name.
    await page.get_by_role("link", name="zeta-broken", exact=True).click()
    failure = page.locator("#detail-failure")
    await expect(failure.get_by_role("heading", name="Why it failed")).to_be_visible()
    first = await page.evaluate(
        "() => [...document.querySelectorAll('#detail-view .detail-grid > section')].find((s) => !s.hidden).id"
    )
    assert first == "detail-failure"
    await expect(page).to_have_title("1 failed · 1 refusing — zeta-broken · dgxmm")
    await shot(page, "detail-failed-reason-first")

    # Once nothing needs anyone, the header and the title say nothing of problems.
    assert (await svc.client.delete(f"/api/deployments/{broken['id']}")).status_code == 200
    await page.get_by_role("link", name="All deployments").click()
    await expect(page.locator("#problems")).to_have_text("1 refusing")
    await expect(page).to_have_title("1 refusing — dgxmm")


async def test_start_in_the_detail_view_offers_room_as_the_card_does(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 10}, ondemand={"idle_timeout_s": 3600}))
    older = await svc.create(name="older", engine="command", memory_gib=4, mode="on_demand", command=engine_command())
    newer = await svc.create(name="newer", engine="command", memory_gib=4, mode="on_demand", command=engine_command())
    big = await svc.create(name="big", engine="command", memory_gib=6, mode="on_demand", command=engine_command())
    await login(page, svc.url, svc.ctx.admin_token)
    assert await chat(svc, older) == 200
    assert await chat(svc, newer) == 200  # both idle, 8 GiB held: 2 GiB free for a 6 GiB model
    await expect(status(page, "newer")).to_have_text("Idle")

    await page.goto(f"{svc.url}/#deployment/{big['id']}")
    await page.locator("#detail-actions").get_by_role("button", name="Start").click()
    offer = page.locator("#detail-offer")
    await expect(offer).to_contain_text("Idle models hold 8.0 GiB: older (4 GiB), newer (4 GiB).")
    some = offer.get_by_role("button", name="Stop older, then start")
    await expect(some).to_be_focused()
    await expect(page.locator("#detail-status")).to_have_text("big: not started now: memory is short.")
    await assert_no_serious_violations(page, "detail-offers-room")
    await shot(page, "detail-offers-room")

    await some.click()
    await expect(page.locator('#detail-view [data-field="status"] .label')).to_have_text("Idle", timeout=20_000)
    await expect(offer).to_be_hidden()
    await expect(page.locator("#detail-status")).to_contain_text("big: ready after")
    assert [(await svc.view(d["id"]))["state"] for d in (older, newer, big)] == ["stopped", "ready", "ready"]


async def test_start_of_a_model_queued_for_memory_is_not_called_failed(serve, tmp_path: Path, page) -> None:
    """The issue's case: Start in the detail view of a model whose request waits for memory showed
    a red refusal and "start failed." while the request was answered later. Its start only waits:
    the page says so, and the title counts it as waiting."""
    svc = await serve(
        gateway_settings(
            tmp_path, memory={"capacity_gib": 10}, ondemand={"idle_timeout_min_s": 1, "idle_timeout_s": 600}
        )
    )
    a = await svc.create(
        name="a", engine="command", memory_gib=6, mode="on_demand", idle_timeout_s=8,
        command=engine_command("--start-delay", "3"),
    )  # fmt: skip
    b = await svc.create(name="b", engine="command", memory_gib=6, mode="on_demand", command=engine_command())
    await login(page, svc.url, svc.ctx.admin_token)
    await page.goto(f"{svc.url}/#deployment/{b['id']}")
    first = asyncio.create_task(chat(svc, a))
    await svc.wait_state(a["id"], "starting")
    waiting = asyncio.create_task(chat(svc, b))
    badge = page.locator('#detail-view [data-field="status"] .label')
    await expect(badge).to_have_text("Queued 1")
    await expect(page).to_have_title("1 waiting — b · dgxmm")

    await page.locator("#detail-actions").get_by_role("button", name="Start").click()
    said = page.locator("#detail-status")
    await expect(said).to_have_text(
        "b: not started now: memory is short; it starts for its waiting requests once there is room."
    )
    await expect(said).not_to_contain_text("failed")
    assert await asyncio.wait_for(first, 30) == 200
    assert await asyncio.wait_for(waiting, 60) == 200  # a idles out, b starts: nothing failed
    await expect(badge).to_have_text("Idle")
    await expect(page).to_have_title("b · dgxmm")
