"""The detail view in a real browser: identity with working copy buttons, the LiteLLM name and
status, the command line, the live engine log (following, paused, followed again), the last hour
and the starts, events and audit; a failed start's reason with the engine's lines marked; editing
a stopped deployment and duplicating one through the wizard."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings, wait_until
from ui.browser import card, chat, litellm, login, page, shot  # noqa: F401 (fixtures: litellm, page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_detail_view_follows_the_engine_log_and_edits(serve, tmp_path: Path, page, litellm) -> None:
    svc = await serve(
        gateway_settings(
            tmp_path,
            memory={"capacity_gib": 24},
            litellm=litellm,
            deployer={"metrics_interval_s": 30, "health_interval_s": 30},
        )
    )  # quiet log
    chatty = await svc.create(
        name="chatty",
        engine="command",
        memory_gib=2,
        mode="on_demand",
        served_name="chatty-7b",
        command=engine_command(),
        request_overrides={"temperature": 0.2},
        strip_params=["seed"],
        capabilities=["completion", "tools"],
    )
    await wait_until(lambda: svc.ctx.litellm.ready, timeout=10)
    assert await chat(svc, chatty) == 200
    await login(page, svc.url, svc.ctx.admin_token)
    await card(page, "chatty").get_by_role("link", name="chatty").click()
    detail = page.locator("#detail-view")
    await expect(detail.get_by_role("heading", name="chatty", level=1)).to_be_visible()
    await expect(detail.locator('[data-field="status"] .label')).to_have_text("Idle")

    # Identity: the id and the gateway URL, each with a copy button that really copies.
    facts = detail.locator("#detail-facts")
    await expect(facts).to_contain_text(chatty["id"])
    gateway = f"{svc.url}/ondemand/{chatty['id']}/v1"
    await expect(facts).to_contain_text(gateway)
    await expect(facts).to_contain_text(f"http://dgxmm:8090/dgxmm/ondemand/{chatty['id']}/v1")
    await expect(facts.locator("div").filter(has_text="LiteLLM name")).to_contain_text("chatty-7b")
    await expect(facts.locator("div").filter(has_text="LiteLLM status")).to_contain_text("Registered")
    await expect(facts.locator("div").filter(has_text="Request parameters")).to_contain_text(
        "always temperature = 0.2; removed: seed"
    )
    await expect(facts.locator("div").filter(has_text="Capabilities")).to_contain_text("completion, tools")
    await detail.get_by_role("button", name="Copy the ID").click()
    await expect(detail.locator("#detail-status")).to_have_text("Copied the ID.")
    assert await page.evaluate("() => navigator.clipboard.readText()") == chatty["id"]
    await detail.get_by_role("button", name="Copy the gateway URL").click()
    assert await page.evaluate("() => navigator.clipboard.readText()") == gateway
    await expect(detail.locator("#detail-cmdline")).to_contain_text("--served-name chatty-7b")

    # The engine log: the request so far, then new lines as the engine writes them.
    log = detail.locator("#detail-log")
    await expect(log).to_contain_text("POST /v1/chat/completions")
    await expect(detail.locator("#log-state")).to_have_text("Following the engine's output as it is written.")
    lines = await log.locator(".line").count()
    assert await chat(svc, chatty) == 200
    await expect(log.locator(".line")).to_have_count(lines + 1)
    await expect(log.locator(".line").last).to_have_text("POST /v1/chat/completions")
    # Paused: new lines are counted, not shown; Follow shows them.
    await detail.get_by_role("button", name="Pause").click()
    assert await chat(svc, chatty) == 200
    await expect(detail.locator("#log-state")).to_have_text("Paused. 1 new line since.")
    await expect(log.locator(".line")).to_have_count(lines + 1)
    await shot(page, "detail-log-paused")
    await detail.get_by_role("button", name="Follow").click()
    await expect(log.locator(".line")).to_have_count(lines + 2)

    # The last hour: three requests (whatever minutes they fell in), one cold start, its events.
    requests = detail.locator("figure").filter(has_text="Requests per minute")
    await requests.locator("summary").click()
    await expect(requests.locator("svg")).to_have_attribute("aria-label", re.compile(r"^Requests per minute: \d now"))

    async def counted() -> bool:
        cells = await requests.locator("tbody td:nth-child(2)").all_text_contents()
        return sum(int(c) for c in cells) == 3

    await wait_until(counted, timeout=20)  # the sparklines are reloaded when the counts move
    await expect(detail.locator("#detail-starts tr")).to_have_count(1)
    await expect(detail.locator("#detail-starts")).to_contain_text("Cold start")
    await expect(detail.locator("#detail-events")).to_contain_text("Started for a request")
    await expect(detail.locator("#detail-audit")).to_contain_text("ondemand_start")
    await shot(page, "detail", full_page=True)

    # Edit, once stopped: the wizard shows the settings; a bad path is refused at its field.
    await detail.get_by_role("button", name="Stop").click()
    await expect(detail.locator('[data-field="status"] .label')).to_have_text("Cold")
    await detail.get_by_role("button", name="Edit").click()
    wizard = page.get_by_role("dialog", name="Edit chatty")
    await expect(wizard.get_by_label("Served name")).to_have_value("chatty-7b")
    await expect(wizard.locator("[data-not-when-editing]")).to_be_hidden()
    await wizard.get_by_label("Memory (GiB)").fill("3")
    await wizard.get_by_text("Sleep mode, probes and environment").click()
    await wizard.get_by_label("Environment").fill("A=1\nB=two")
    await wizard.get_by_label("Health path").fill("ready")
    await wizard.get_by_role("button", name="Save changes").click()
    await expect(wizard.get_by_label("Health path")).to_be_focused()
    await expect(wizard.locator("#d-health-error")).to_have_text("Start the path with “/”.")
    await wizard.get_by_label("Health path").fill("")
    await wizard.get_by_role("button", name="Save changes").click()
    await expect(wizard).to_be_hidden()
    await expect(detail.locator("#detail-status")).to_have_text("chatty: settings saved.")
    await expect(facts).to_contain_text("A=1 B=two")
    await expect(facts.locator("div").filter(has_text="Memory")).to_contain_text("3 GiB")
    await expect(detail.locator("#detail-audit")).to_contain_text("update")
    view = await svc.view(chatty["id"])
    assert (view["memory_gib"], view["env"]) == (3, {"A": "1", "B": "two"})

    # Duplicate: the wizard starts from a copy, named "<name>-copy".
    await detail.get_by_role("button", name="Duplicate").click()
    copy = page.get_by_role("dialog", name="Duplicate chatty")
    await expect(copy.get_by_label("Name", exact=True)).to_have_value("chatty-copy")
    await expect(copy.get_by_label("Name", exact=True)).to_be_focused()
    await copy.get_by_label("Served name").fill("")
    await copy.get_by_role("button", name="Deploy").click()
    await expect(copy).to_be_hidden()
    await expect(detail.locator("#detail-status")).to_have_text("chatty-copy deployed: its first request starts it.")
    twin = next(v for v in (await svc.client.get("/api/deployments")).json() if v["name"] == "chatty-copy")
    assert (twin["memory_gib"], twin["env"], twin["command"]) == (3, {"A": "1", "B": "two"}, view["command"])


async def test_a_failed_start_explains_itself(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    broken = await svc.create(
        name="broken", engine="command", memory_gib=2, mode="on_demand", command=engine_command("--fail-start")
    )
    assert await chat(svc, broken) == 503
    await login(page, svc.url, svc.ctx.admin_token)
    await page.goto(f"{svc.url}/#deployment/{broken['id']}")
    detail = page.locator("#detail-view")
    await expect(detail.locator('[data-field="status"] .label')).to_have_text("Failed")
    failure = detail.locator("#detail-failure")
    await expect(failure.get_by_role("heading", name="Why it failed")).to_be_visible()
    # The cause comes first; the engine's lines follow, the alarming one marked with a sign too.
    await expect(failure.locator(".cause")).to_have_text("Cause: engine exited during start-up (exit code 1)")
    await expect(failure.locator("mark.alarm")).to_have_text("▸ simulated start failure: --fail-start was given")
    await expect(detail.locator("#detail-starts")).to_contain_text("Failed")
    await expect(detail.locator("#detail-log")).to_contain_text("simulated start failure")
    await shot(page, "detail-failed", full_page=True)


async def test_a_deployment_removed_while_its_detail_view_is_open_says_so(serve, tmp_path: Path, page) -> None:
    """Issue 58: a deployment deleted while its detail view was open kept its badge ("Idle") as if
    it were still there."""
    svc = await serve(gateway_settings(tmp_path))
    gone = await svc.create(name="gone", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    assert await chat(svc, gone) == 200
    await login(page, svc.url, svc.ctx.admin_token)
    await page.goto(f"{svc.url}/#deployment/{gone['id']}")
    badge = page.locator('#detail-view [data-field="status"] .badge')
    await expect(badge.locator(".label")).to_have_text("Idle")
    assert (await svc.client.delete(f"/api/deployments/{gone['id']}")).status_code == 200
    await expect(page.locator("#detail-missing")).to_have_text("gone was removed.")
    await expect(badge).to_have_count(0)
    await expect(page.locator('#detail-view [data-field="status_detail"]')).to_be_hidden()
    await expect(page.locator("#detail-actions")).to_be_hidden()
    await expect(page).to_have_title("gone (removed) · dgxmm")
    # The status ticker repaints every second: once it has run (it fills in a probe's "… ago"),
    # the badge is still not painted back.
    await page.evaluate(TICK_PROBE)
    await expect(page.locator("#tick-probe")).to_have_text(re.compile(r"s ago$"))
    await expect(badge).to_have_count(0)


TICK_PROBE = """() => {
  const probe = document.createElement("time");
  probe.id = "tick-probe";
  probe.dataset.ago = String(Date.now() / 1000 - 30);
  document.body.append(probe);
}"""
