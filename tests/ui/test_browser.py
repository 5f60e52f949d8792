"""The web UI in a real browser (headless chromium through Playwright) against the real service:
log in, deploy an on-demand model with the wizard, follow its status live while requests go
through the gateway, switch its mode, see form and API errors next to their fields, survive a
dropped event stream, remove with confirmation, and fit a 375 px wide screen."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from conftest import KEY, caller, engine_command, gateway_settings, make_settings, wait_until
from ui.browser import assert_fits, card, litellm, login, page, shot, status, status_detail, status_time  # noqa: F401 (fixtures: litellm, page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)
REPLY = "one two three four five six seven eight nine ten"


async def stream_chat(svc: Any, dep_id: str) -> str:
    """A streaming chat request through the gateway, as LiteLLM would send it."""
    body = {"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with caller(svc, timeout=60) as gw, gw.stream("POST", f"/{dep_id}/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        return "".join([line async for line in resp.aiter_lines()])


async def test_deploy_on_demand_and_follow_its_phases_live(serve, tmp_path: Path, page, litellm) -> None:
    svc = await serve(
        gateway_settings(
            tmp_path,
            memory={"capacity_gib": 24},
            litellm=litellm,
            ondemand={
                "idle_timeout_min_s": 1,
                "idle_timeout_s": 3,
                "reaper_interval_s": 0.5,
                "counters_publish_s": 0.2,
            },
        )
    )
    await wait_until(lambda: svc.ctx.litellm.ready, timeout=10)
    embed = await svc.create(name="embed", engine="command", memory_gib=6, command=engine_command())
    await svc.create(name="guard", engine="command", memory_gib=2, role="system", command=engine_command())
    await svc.wait_state(embed["id"], "ready")

    # A wrong token is refused next to the field; the right one opens the deployments page.
    await page.goto(f"{svc.url}/")
    await page.get_by_label("Admin or viewer token").fill("not-the-token")
    await page.get_by_role("button", name="Log in").click()
    await expect(page.locator("#login-token-error")).to_have_text("This token was refused.")
    await expect(page.get_by_label("Admin or viewer token")).to_have_attribute("aria-invalid", "true")
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(status(page, "embed")).to_have_text("Ready")
    await expect(page.locator("#instance")).to_have_text(f"Instance {svc.ctx.instance_id}")

    # The wizard proposes on demand because LiteLLM is ready; the API's error lands at its field.
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    await expect(wizard.get_by_label("On demand")).to_be_checked()
    await expect(wizard.locator("#d-mode-hint")).to_contain_text("LiteLLM is ready")
    await wizard.get_by_label("Engine").select_option("command")
    flags = ("--start-delay", "2", "--chunk-delay", "0.4", "--reply", REPLY)
    await wizard.get_by_label("Command").fill("\n".join(engine_command(*flags)))
    await wizard.get_by_label("Name", exact=True).fill("tiny model")
    await wizard.get_by_label("Memory (GiB)").fill("4")
    await expect(wizard.locator("#d-memory-fit")).to_contain_text("Free now: 16 GiB of 24 GiB usable")
    await expect(wizard.locator("#d-memory-fit")).to_contain_text("It fits now.")
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard.locator("#d-name-error")).to_contain_text("“tiny model” is not allowed: use 1 to 64 letters")
    await expect(wizard.get_by_label("Name", exact=True)).to_have_attribute("aria-invalid", "true")
    await expect(wizard.get_by_label("Name", exact=True)).to_be_focused()
    await shot(page, "wizard-api-error")
    await wizard.get_by_label("Name", exact=True).fill("tiny")
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard).to_be_hidden()
    await expect(page.locator("#action-status")).to_have_text("tiny deployed: its first request starts it.")

    tiny = card(page, "tiny")
    await expect(status(page, "tiny")).to_have_text("Cold")
    await expect(status_detail(page, "tiny")).to_have_text("The next request starts it.")
    await expect(tiny.locator('[data-field="mode"]')).to_have_text("On demand, default idle timeout")
    await expect(tiny.locator('[data-field="last_request"]')).to_have_text("none since dgxmm started")
    await expect(tiny.locator('[data-field="litellm"]')).to_have_text("Registered", timeout=10_000)
    dep_id = await tiny.get_attribute("data-id")
    await shot(page, "deployed")

    # Two requests through the gateway: loading for them (both waiting), serving both, idle.
    requests = [asyncio.create_task(stream_chat(svc, dep_id)) for _ in range(2)]
    await expect(status(page, "tiny")).to_have_text("Loading")
    await expect(tiny.locator(".badge")).to_have_attribute("data-status", "loading")
    await expect(status_time(page, "tiny")).to_contain_text("for ")
    await expect(status_detail(page, "tiny")).to_contain_text("2 requests waiting.")
    await shot(page, "loading")
    await expect(status(page, "tiny")).to_have_text("Serving 2")
    await expect(tiny.locator('[data-field="last_request"] time')).to_be_visible()
    # The memory bar: the always-on and system deployments and the serving on-demand one.
    legend = page.locator("#memory-legend")
    await expect(legend).to_contain_text("guard: 2 GiB, system, Ready")
    await expect(legend).to_contain_text("embed: 6 GiB, always on, Ready")
    await expect(legend).to_contain_text("tiny: 4 GiB, on demand, Serving")
    await expect(legend).to_contain_text("Free: 12 GiB")
    await expect(page.locator("#memory-bar .seg-always")).to_have_count(1)
    await expect(page.locator("#memory-bar .seg-system")).to_have_count(1)
    await shot(page, "serving")
    await shot(page, "deployments", full_page=True)
    answers = await asyncio.wait_for(asyncio.gather(*requests), 30)
    assert all("ten" in answer for answer in answers)
    await expect(status(page, "tiny")).to_have_text("Idle")
    await expect(status_time(page, "tiny")).to_contain_text("stops in 0:0")

    # After the (shrunken) idle timeout the reaper stops it: cold again, and its memory is free.
    await expect(status(page, "tiny")).to_have_text("Cold", timeout=20_000)
    await expect(legend).to_contain_text("Free: 16 GiB")
    await expect(page.locator("#memory-history figcaption")).to_contain_text("now 8 GiB held of 24 GiB")
    await shot(page, "cold-again")

    # Events and audit: the controller's events arrived live, its audit rows are listed.
    await page.get_by_role("link", name="Events and audit").click()
    events = page.locator("#events-rows")
    await expect(events.locator("tr").filter(has_text="ondemand").filter(has_text="tiny").first).to_be_visible()
    audit = page.locator("#audit-rows")
    await expect(audit).to_contain_text("ondemand_start")
    await expect(audit).to_contain_text("ondemand_sleep")
    await shot(page, "events-and-audit", full_page=True)

    # The token is kept for this tab's session only, and the on-demand key never reaches the page.
    storage = await page.evaluate("() => [sessionStorage.length, localStorage.length, document.cookie]")
    assert storage == [1, 0, ""]
    assert KEY not in await page.content()


async def test_mode_switch_shows_pending_mode_and_idle_timeout_errors(serve, tmp_path: Path, page) -> None:
    svc = await serve(make_settings(tmp_path, ondemand={"idle_timeout_max_s": 3600}))
    tiny = await svc.create(
        name="tiny", engine="command", memory_gib=2, mode="on_demand", command=engine_command("--start-delay", "2")
    )
    await svc.create(name="big", engine="vllm", model="org/big", memory_gib=25, mode="on_demand")
    await login(page, svc.url, svc.ctx.admin_token)
    # A vLLM deployment's card shows the memory limit its engine is launched with.
    await expect(card(page, "big").locator('[data-field="memory"]')).to_have_text(
        "25 GiB (--gpu-memory-utilization 0.25)"
    )
    await expect(card(page, "tiny").locator('[data-field="memory"]')).to_have_text("2 GiB")

    # Without LiteLLM the wizard proposes always on.
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    await expect(wizard.get_by_label("Always on")).to_be_checked()
    await expect(wizard.locator("#d-mode-hint")).to_contain_text("LiteLLM is not ready")
    await page.keyboard.press("Escape")
    await expect(wizard).to_be_hidden()

    # Switch to always on: it starts first, showing the pending mode until it is ready.
    await card(page, "tiny").get_by_role("button", name="Change mode").click()
    dialog = page.get_by_role("dialog", name="Mode of tiny")
    await expect(dialog.get_by_label("On demand")).to_be_checked()  # it opens on the mode it has
    await dialog.get_by_label("Always on").check()
    await dialog.get_by_role("button", name="Save mode").click()
    await expect(dialog).to_be_hidden()
    await expect(status(page, "tiny")).to_have_text("Switching to always on")
    await expect(status_time(page, "tiny")).to_contain_text("for ")
    await expect(page.locator("#action-status")).to_contain_text("tiny: start requested; it becomes always on")
    await shot(page, "pending-mode")
    await expect(status(page, "tiny")).to_have_text("Ready", timeout=20_000)
    await expect(page.locator("#action-status")).to_contain_text("tiny: ready after")
    await expect(card(page, "tiny").locator('[data-field="mode"]')).to_have_text("Always on")
    assert (await svc.view(tiny["id"]))["mode"] == "always_on"

    # Back to on demand: the form refuses 30 s and 2 h itself, by the bounds the server has (its
    # maximum here is 1 h, GET /api/host says so); 10 min is accepted.
    await card(page, "tiny").get_by_role("button", name="Change mode").click()
    await expect(dialog.get_by_label("Always on")).to_be_checked()
    await dialog.get_by_label("On demand").check()
    idle = dialog.get_by_label("Idle timeout", exact=False).first
    await idle.fill("30")
    await dialog.get_by_label("Idle timeout unit").select_option("seconds")
    await dialog.get_by_role("button", name="Save mode").click()
    await expect(dialog.locator("#m-idle-error")).to_have_text("The idle timeout must be between 60 s and 1 h.")
    await expect(idle).to_be_focused()
    await expect(dialog.locator("#m-idle-help")).to_contain_text("60 s to 1 h")
    await idle.fill("2")
    await dialog.get_by_label("Idle timeout unit").select_option("hours")
    await dialog.get_by_role("button", name="Save mode").click()
    await expect(dialog.locator("#m-idle-error")).to_have_text("The idle timeout must be between 60 s and 1 h.")
    await expect(idle).to_have_attribute("aria-invalid", "true")
    await shot(page, "mode-api-error")
    await idle.fill("10")
    await dialog.get_by_label("Idle timeout unit").select_option("minutes")
    await dialog.get_by_role("button", name="Save mode").click()
    await expect(dialog).to_be_hidden()
    await expect(card(page, "tiny").locator('[data-field="mode"]')).to_have_text("On demand, idle timeout 10 min")
    await expect(status(page, "tiny")).to_have_text("Idle")
    await expect(status_time(page, "tiny")).to_contain_text("stops in 9:5")
    view = await svc.view(tiny["id"])
    assert (view["mode"], view["idle_timeout_s"]) == ("on_demand", 600)


async def test_the_idle_timeout_is_edited_alone_within_the_servers_bounds(serve, tmp_path: Path, page) -> None:
    """The mode dialog opens on the mode the deployment has, so it edits the idle timeout alone;
    the form's bounds are the server's (``idle_timeout_min_s = 20`` here), not a range of its own."""
    svc = await serve(make_settings(tmp_path, ondemand={"idle_timeout_min_s": 20}))
    dep = await svc.create(
        name="quick", engine="command", memory_gib=1, mode="on_demand", idle_timeout_s=30, command=engine_command()
    )
    await login(page, svc.url, svc.ctx.admin_token)
    await card(page, "quick").get_by_role("button", name="Change mode").click()
    dialog = page.get_by_role("dialog", name="Mode of quick")
    await expect(dialog.get_by_label("On demand")).to_be_checked()
    await expect(dialog.locator("#m-idle-help")).to_contain_text("20 s to ")
    idle = dialog.get_by_label("Idle timeout", exact=False).first
    await idle.fill("10")
    await dialog.get_by_label("Idle timeout unit").select_option("seconds")
    await dialog.get_by_role("button", name="Save mode").click()
    await expect(dialog.locator("#m-idle-error")).to_contain_text("between 20 s and")
    await idle.fill("25")
    await dialog.get_by_role("button", name="Save mode").click()
    await expect(dialog).to_be_hidden()
    await expect(card(page, "quick").locator('[data-field="mode"]')).to_have_text("On demand, idle timeout 25 s")
    view = await svc.view(dep["id"])
    assert (view["mode"], view["idle_timeout_s"]) == ("on_demand", 25)


async def test_reconnects_removes_with_confirmation_and_fits_a_narrow_screen(serve, tmp_path: Path, page) -> None:
    svc = await serve()
    keep = await svc.create(name="keep", engine="command", memory_gib=2, command=engine_command())
    gone = await svc.create(name="gone", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    await svc.wait_state(keep["id"], "ready")
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(page.locator("#cards > li")).to_have_count(2)

    # The stream drops; while it is down one deployment is removed and another created. The UI
    # reconnects by itself and shows both changes without a reload.
    svc.ctx.bus.close()
    await expect(page.locator("#conn")).to_have_text("Disconnected")
    await expect(page.locator("#conn-banner")).to_contain_text("Reconnecting")
    resp = await svc.client.delete(f"/api/deployments/{gone['id']}")
    assert resp.status_code == 200
    await svc.create(name="late", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    await expect(page.locator("#conn")).to_have_text("Live", timeout=10_000)
    await expect(page.locator("#conn-notice")).to_have_text("Reconnected.")
    await expect(card(page, "late")).to_be_visible()
    await expect(card(page, "gone")).to_have_count(0)
    # ...and live updates flow again.
    await svc.client.post(f"/api/deployments/{keep['id']}/stop")
    await expect(status(page, "keep")).to_have_text("Stopped")

    # Remove asks first: Escape keeps the deployment, Remove deletes it.
    await card(page, "late").get_by_role("button", name="Remove").click()
    confirm = page.get_by_role("dialog", name="Remove late?")
    await expect(confirm).to_be_visible()
    await expect(confirm.get_by_role("button", name="Cancel")).to_be_focused()
    await page.keyboard.press("Escape")
    await expect(confirm).to_be_hidden()
    await expect(card(page, "late")).to_be_visible()
    await card(page, "late").get_by_role("button", name="Remove").click()
    await confirm.get_by_role("button", name="Remove").click()
    await expect(card(page, "late")).to_have_count(0)
    assert [v["name"] for v in (await svc.client.get("/api/deployments")).json()] == ["keep"]

    # A 375 px wide screen: nothing overflows sideways; the wizard fits too.
    await page.set_viewport_size({"width": 375, "height": 812})
    await svc.client.post(f"/api/deployments/{keep['id']}/start")
    await expect(status(page, "keep")).to_have_text("Ready", timeout=20_000)
    await assert_fits(page)
    await shot(page, "narrow", full_page=True)
    await page.get_by_role("button", name="Deploy a model").click()
    await expect(page.get_by_role("dialog", name="Deploy a model")).to_be_visible()
    await assert_fits(page)
    await shot(page, "narrow-wizard")
    await page.keyboard.press("Escape")
    await page.get_by_label("Table").check()
    await assert_fits(page)
    await page.get_by_label("Cards").check()
    await card(page, "keep").get_by_role("link", name="keep").click()
    await expect(page.locator("#detail-log")).to_contain_text("GET /health")
    await expect(page.locator("#detail-charts figure")).to_have_count(5)
    await assert_fits(page)
    await shot(page, "narrow-detail", full_page=True)
    await page.get_by_role("link", name="Events and audit").click()
    await expect(page.locator("#events-rows tr").first).to_be_visible()
    await assert_fits(page)
    await shot(page, "narrow-events", full_page=True)

    # Log out forgets the token.
    await page.get_by_role("button", name="Log out").click()
    await expect(page.get_by_label("Admin or viewer token")).to_be_visible()
    assert await page.evaluate("() => sessionStorage.length") == 0
