"""Measured memory in a real browser (issue 29): declared and measured side by side on the card,
the table and the memory bar while the engine runs; after a run, the suggested memory_gib and
its button, which declares it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings, wait_until
from ui.a11y import assert_no_serious_violations
from ui.browser import card, chat, login, page, shot  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_declared_and_measured_side_by_side_and_the_suggestion_applied(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}, deployer={"metrics_interval_s": 0.2}))
    view = await svc.create(
        name="greedy", engine="command", memory_gib=0.2, mode="on_demand", command=engine_command("--hold-mib", "300")
    )
    await login(page, svc.url, svc.ctx.admin_token)
    assert await chat(svc, view) == 200
    await wait_until(lambda: svc.ctx.measured.gib(view["id"]), timeout=10)
    memory = card(page, "greedy").locator('[data-field="memory"]')
    await expect(memory).to_have_text(re.compile(r"^0\.2 GiB, 0\.[3-6]\d* GiB measured$"))
    legend = page.locator("#memory-legend li").filter(has_text="greedy")
    await expect(legend).to_have_text(re.compile(r"greedy: 0\.2 GiB, 0\.[3-6]\d* GiB measured"))
    await page.get_by_label("Table").check()
    row = page.locator("#dep-table tbody tr").filter(has_text="greedy")
    await expect(row).to_contain_text(re.compile(r"0\.2 GiB · 0\.[3-6]\d* GiB measured"))
    await page.get_by_label("Cards").check()
    await shot(page, "memory-measured")

    # After a run: what to declare, and a button that declares it (once the engine is stopped).
    await card(page, "greedy").get_by_role("link", name="greedy").click()
    detail = page.locator("#detail-view")
    suggested = detail.locator("#detail-facts div").filter(has_text="Suggested memory")
    declare = suggested.get_by_role("button")
    await expect(declare).to_be_disabled()
    await expect(suggested).to_contain_text("stop it first")
    await detail.get_by_role("button", name="Stop").click()
    await expect(declare).to_be_enabled()
    text = await declare.text_content()
    assert text is not None and (found := re.fullmatch(r"Declare (0\.[4-7]) GiB", text)), text
    await assert_no_serious_violations(page, "detail-suggested-memory")
    await declare.click()
    await expect(detail.locator("#detail-status")).to_have_text(f"greedy: memory_gib is {found.group(1)} GiB now.")
    await expect(detail.locator("#detail-facts div").filter(has_text="Suggested memory")).to_have_count(0)
    assert (await svc.view(view["id"]))["memory_gib"] == float(found.group(1))


async def test_the_wizard_proposes_the_estimate_of_a_gguf(serve, tmp_path: Path, page) -> None:
    from dgxmm.demo.tiny_gguf import write_random_gguf

    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    model = write_random_gguf(
        tmp_path / "m.gguf", n_embd=512, n_ff=1024, n_layer=8, n_head=8, n_head_kv=2, n_ctx=4096, f16=True
    )
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    await wizard.get_by_label("Engine").select_option("llamacpp")
    await wizard.get_by_label("Model", exact=True).fill(str(model))
    await wizard.get_by_label("Model", exact=True).press("Tab")
    hint = wizard.locator("#d-memory-estimate")
    await expect(hint).to_contain_text("llama-server will hold about")
    await expect(hint).to_contain_text("for a context of 4096 tokens")
    await wizard.get_by_label("Context size").fill("1024")
    await wizard.get_by_label("Context size").press("Tab")
    await expect(hint).to_contain_text("for a context of 1024 tokens")
    use = hint.get_by_role("button")
    proposed = (await use.text_content() or "").removeprefix("Use ").removesuffix(" GiB")
    await use.click()
    await expect(wizard.get_by_label("Memory (GiB)")).to_have_value(proposed)
    await expect(wizard.locator("#d-memory-fit")).to_contain_text("It fits now.")
    await assert_no_serious_violations(page, "wizard-estimate")


async def test_a_model_that_can_never_fit_says_so_and_offers_no_start(serve, tmp_path: Path, page) -> None:
    """Issue 30: not "Cold" with a Start that answers 409, but its own status."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 4}))
    await svc.create(name="huge", engine="command", memory_gib=100, mode="on_demand", command=engine_command())
    await login(page, svc.url, svc.ctx.admin_token)
    huge = card(page, "huge")
    await expect(huge.locator('[data-field="status"] .label')).to_have_text("Too big")
    await expect(huge.locator('[data-field="status_detail"]')).to_contain_text("It cannot fit now")
    await expect(huge.get_by_role("button", name="Start")).to_be_hidden()
    await expect(huge.get_by_role("button", name="Change mode")).to_be_visible()


async def test_why_it_failed_opens_at_the_error_and_scrolls_by_keyboard(serve, tmp_path: Path, page) -> None:
    """Issue 30: the excerpt opened at the top of dozens of health-check lines, the marked error
    out of view, and could not be scrolled by keyboard (axe: serious)."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}, deployer={"start_poll_s": 0.03}))
    broken = await svc.create(
        name="broken",
        engine="command",
        memory_gib=2,
        mode="on_demand",
        command=engine_command("--start-delay", "2", "--fail-start"),
    )
    assert await chat(svc, broken) == 503
    await login(page, svc.url, svc.ctx.admin_token)
    await page.goto(f"{svc.url}/#deployment/{broken['id']}")
    excerpt = page.locator("#detail-failure pre.log-excerpt")
    await expect(excerpt.locator("mark.alarm")).to_have_count(1)
    assert await excerpt.locator(".line").count() >= 15  # the log tail: health checks, then the error
    assert await excerpt.evaluate("(el) => el.scrollHeight > el.clientHeight")  # more than it shows
    await excerpt.scroll_into_view_if_needed()
    await expect(excerpt.locator("mark.alarm").last).to_be_in_viewport()
    assert await excerpt.evaluate("(el) => el.scrollTop") > 0
    await excerpt.focus()
    await expect(excerpt).to_be_focused()
    top = await excerpt.evaluate("(el) => el.scrollTop")
    await page.keyboard.press("Home")

    async def scrolled_up() -> bool:
        return bool(await excerpt.evaluate("(el) => el.scrollTop") < top)

    await wait_until(scrolled_up, timeout=5)  # the keyboard scrolls it (smoothly: it takes a moment)
    await assert_no_serious_violations(page, "detail-failure", "#detail-failure")


async def test_the_wizard_warns_clearly_of_a_model_that_can_never_fit(serve, tmp_path: Path, page) -> None:
    """Issue 30: 100 GiB on a 4 GiB host was accepted with only a hint."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 4}))
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    await wizard.get_by_label("Engine").select_option("command")
    await wizard.get_by_label("Command").fill("\n".join(engine_command()))
    await wizard.get_by_label("Name", exact=True).fill("huge")
    await wizard.get_by_label("On demand").check()
    await wizard.get_by_label("Memory (GiB)").fill("100")
    await expect(wizard.locator("#d-memory-fit")).to_contain_text("⚠ It can never fit")
    await expect(wizard.locator("#d-memory-fit")).to_have_class(re.compile(r"\bwarning\b"))
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard.locator("#d-memory-error")).to_contain_text("press Deploy again to deploy it anyway")
    await expect(wizard.get_by_label("Memory (GiB)")).to_be_focused()
    assert (await svc.client.get("/api/deployments")).json() == []
    await wizard.get_by_role("button", name="Deploy").click()  # deployed, as the user insists
    await expect(wizard).to_be_hidden()
    await expect(card(page, "huge").locator('[data-field="status"] .label')).to_have_text("Too big")
    # Issue 41: the message agrees with the card (it said "its first request starts it").
    await expect(page.locator("#action-status")).to_have_text(
        "huge deployed, but it is too big to ever fit here: its requests are refused (does_not_fit)."
    )


async def test_the_last_hour_counts_failed_starts_and_the_counts_now(serve, tmp_path: Path, page) -> None:
    """Issue 30: "no cold starts" beside two failed starts; "Queued 1 now" was the minute's peak."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}, ondemand={"backoff_initial_s": 0}))
    broken = await svc.create(
        name="broken", engine="command", memory_gib=2, mode="on_demand", command=engine_command("--fail-start")
    )
    assert await chat(svc, broken) == 503
    assert await chat(svc, broken) == 503  # failed twice: no request is waiting or in flight now
    await login(page, svc.url, svc.ctx.admin_token)
    await page.goto(f"{svc.url}/#deployment/{broken['id']}")
    charts = page.locator("#detail-charts")
    starts = charts.locator("figure").filter(has_text="Cold starts and wakes")
    await expect(starts.locator(".spark-value")).to_contain_text("2 (2 failed)")
    queued = charts.locator("figure").filter(has_text="Queued")
    await expect(queued.locator(".spark-value")).to_contain_text("0 now · peak 1")
