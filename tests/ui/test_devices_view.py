"""Several GPUs in the console (issue 35), with a served dgxmm on declared devices [80, 80] and
on a pooled host: a memory bar per device (each deployment in its chart colour), a deployment's
devices on its card and row, the wizard sending gpus and gpu_ids after its own checks (a model
too big for any device warned at the field), the never-fits text per device; axe clean; the
1920 px and phone layouts hold. On a pooled host nothing of this shows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from conftest import Service, engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import assert_fits, card, chat, login, page, shot, status, status_detail  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(240)

ON_DEMAND = {"engine": "command", "mode": "on_demand", "command": engine_command()}


async def devices_service(serve, tmp_path: Path) -> Service:
    svc: Service = await serve(
        gateway_settings(
            tmp_path, memory={"capacity_gib": None, "devices_gib": [80, 80]}, ondemand={"idle_timeout_s": 3600}
        )
    )
    return svc


def bar(page: Any, index: int) -> Any:
    return page.locator("#memory-devices .devbar").nth(index)


async def swatch_colour(page: Any, legend: str, name: str) -> str:
    """The `c-N` class of `name`'s swatch in a legend (`#memory-legend`, `.chart-legend`)."""
    classes = (
        await page.locator(f"{legend} li")
        .filter(has_text=re.compile(rf"^{name}\b"))
        .locator(".swatch")
        .get_attribute("class")
    )
    found = re.search(r"\bc-\d\b", classes or "")
    assert found, classes
    return found.group(0)


async def test_a_bar_per_device_the_devices_on_cards_and_the_wizard_sends_them(serve, tmp_path: Path, page) -> None:
    svc = await devices_service(serve, tmp_path)
    a = await svc.create(name="a", memory_gib=60, **ON_DEMAND)
    b = await svc.create(name="b", memory_gib=60, **ON_DEMAND)
    await svc.create(name="big", memory_gib=90, **ON_DEMAND)  # 90 GiB on one device: never
    assert await chat(svc, a) == 200
    assert await chat(svc, b) == 200  # a on GPU 0, b on GPU 1 (best fit), 20 GiB free on each
    await page.set_viewport_size({"width": 1920, "height": 1080})
    await login(page, svc.url, svc.ctx.admin_token)

    # The memory: one bar per device, what each deployment holds there, its free memory.
    await expect(page.locator("#memory-bar")).to_be_hidden()
    await expect(page.locator("#memory-devices .devbar")).to_have_count(2)
    await expect(bar(page, 0).locator(".devbar-label")).to_have_text("GPU 0 60 GiB of 80 GiB held, 20 GiB free")
    await expect(bar(page, 1).locator(".devbar-label")).to_have_text("GPU 1 60 GiB of 80 GiB held, 20 GiB free")
    await expect(bar(page, 0).locator(".membar")).to_have_attribute(
        "aria-label", "GPU 0: 60 GiB of 80 GiB held, 20 GiB free (a 60 GiB)"
    )
    await expect(bar(page, 1).locator(".seg-dev")).to_have_attribute(
        "title", re.compile(r"^b: 60 GiB on GPU 1, on demand, Idle")
    )
    await expect(page.locator("#memory-summary")).to_have_text(
        re.compile(r"^Usable memory 160 GiB on 2 GPUs \(declared\): 120 GiB held, 40 GiB free")
    )
    await expect(page.locator("#memory-legend .legend-free")).to_have_text("Free: 20 GiB on GPU 0, 20 GiB on GPU 1")
    await expect(bar(page, 0).locator(".seg-free")).to_have_text("free")
    # The chart: one per device, each deployment in the colour its bar segments have.
    charts = page.locator("#memory-history .devchart")
    await expect(charts).to_have_count(2)
    await expect(charts.nth(0).locator("svg")).to_have_attribute(
        "aria-label", re.compile(r"^GPU 0: now a 60 GiB held of 80 GiB")
    )
    await expect(charts.nth(1).locator("svg")).to_have_attribute(
        "aria-label", re.compile(r"^GPU 1: now b 60 GiB held of 80 GiB")
    )
    for name in ("a", "b"):
        colour = await swatch_colour(page, "#memory-legend", name)
        assert colour == await swatch_colour(page, "#memory-history .chart-legend", name)
        where = bar(page, 0 if name == "a" else 1).locator(".seg-dev")
        await expect(where).to_have_class(re.compile(rf"\b{colour}\b"))
    assert await swatch_colour(page, "#memory-legend", "a") != await swatch_colour(page, "#memory-legend", "b")

    # Cards and the table: each deployment's devices.
    gpus = lambda name: card(page, name).locator('[data-field="gpus"]')  # noqa: E731
    await expect(gpus("a")).to_have_text("GPU 0")
    await expect(gpus("b")).to_have_text("GPU 1")
    await expect(gpus("big")).to_have_text("Any GPU")
    # A model bigger than any device: the per-device never-fits sentence.
    await expect(status(page, "big")).to_have_text("Too big")
    await expect(status_detail(page, "big")).to_have_text(
        "It cannot fit now: it needs 90 GiB on one device, and on-demand models can get at most 80 GiB on a device it may use. "
        "It would need a device of 90 GiB or more, so its requests are refused (does_not_fit)."
    )
    await assert_no_serious_violations(page, "devices-deployments")
    await shot(page, "devices-deployments")
    _, panel_height = await page.evaluate(
        "() => { const r = document.querySelector('.memory-panel').getBoundingClientRect(); return [r.top, r.height]; }"
    )
    assert panel_height < 420, panel_height
    shown = await page.locator("#cards > li").evaluate_all(
        "els => els.filter(e => e.getBoundingClientRect().top < innerHeight - 200).length"
    )
    assert shown == 3, shown

    # The wizard: GPUs 1..2 and a pin per device; a model too big for one device warned clearly.
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    await wizard.get_by_label("Engine").select_option("command")
    await wizard.get_by_label("Command").fill("\n".join(engine_command()))
    await wizard.get_by_label("Name", exact=True).fill("wide")
    await wizard.get_by_label("On demand").check()
    assert await wizard.get_by_label("GPUs", exact=True).locator("option").all_text_contents() == ["1", "2"]
    await wizard.get_by_label("Memory (GiB)").fill("90")
    fit = wizard.locator("#d-memory-fit")
    await expect(fit).to_contain_text(
        "⚠ It can never fit: it needs 90 GiB on one device; the largest device gives 80 GiB"
    )
    await expect(fit).to_contain_text("Free now: GPU 0 20 GiB of 80 GiB, GPU 1 20 GiB of 80 GiB.")
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard.locator("#d-memory-error")).to_contain_text(
        "90 GiB can never fit here (it needs 90 GiB on one device; the largest device gives 80 GiB)"
    )
    await expect(wizard.get_by_label("Memory (GiB)")).to_be_focused()
    await wizard.get_by_label("GPUs", exact=True).select_option("2")
    await expect(fit).to_contain_text(
        "It needs 45 GiB on each of 2 devices: it does not fit now; its requests wait until idle models make room."
    )
    await wizard.get_by_label("GPU 0 (80 GiB)").check()  # one pin for two devices
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard.locator("#d-gpu_ids-error")).to_have_text("Check 2 GPUs (as many as it spans), or none.")
    await expect(fit).to_contain_text("Check 2 GPUs to pin it, or none.")
    await expect(wizard.get_by_label("GPU 0 (80 GiB)")).to_be_focused()
    await assert_no_serious_violations(page, "devices-wizard")
    await shot(page, "devices-wizard")
    await wizard.get_by_label("GPU 1 (80 GiB)").check()
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard).to_be_hidden()
    views = {v["name"]: v for v in (await svc.client.get("/api/deployments")).json()}
    assert (views["wide"]["gpus"], views["wide"]["gpu_pins"], views["wide"]["memory_gib"]) == (2, [0, 1], 90)
    await expect(gpus("wide")).to_have_text("GPUs 0, 1, pinned")
    await page.goto(f"{svc.url}/#deployment/{views['wide']['id']}")  # the detail view says it too
    facts = page.locator("#detail-view #detail-facts")
    await expect(facts).to_contain_text("GPUs 0, 1, pinned (45 GiB on each)")
    await page.goto(f"{svc.url}/#")

    # A pinned one through the wizard: one GPU, pinned to GPU 1; the table shows its devices.
    await page.get_by_role("button", name="Deploy a model").click()
    await wizard.get_by_label("Engine").select_option("command")
    await wizard.get_by_label("Command").fill("\n".join(engine_command()))
    await wizard.get_by_label("Name", exact=True).fill("pinned")
    await wizard.get_by_label("Memory (GiB)").fill("10")
    await wizard.get_by_label("On demand").check()
    await wizard.get_by_label("GPU 1 (80 GiB)").check()
    await expect(fit).to_contain_text("It needs 10 GiB on one device: it fits now.")
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard).to_be_hidden()
    pinned = next(v for v in (await svc.client.get("/api/deployments")).json() if v["name"] == "pinned")
    assert (pinned["gpus"], pinned["gpu_pins"]) == (1, [1])
    await page.get_by_label("Table").check()
    await expect(page.locator("#dep-table th[data-sort=gpus]")).to_be_visible()
    row = lambda name: page.locator("#dep-table tbody tr").filter(  # noqa: E731
        has=page.locator('td[data-col="Name"]', has_text=re.compile(f"^{name}$"))
    )
    await expect(row("pinned").locator('td[data-col="GPUs"]')).to_have_text("GPU 1, pinned")
    await expect(row("a").locator('td[data-col="GPUs"]')).to_have_text("GPU 0")
    await assert_no_serious_violations(page, "devices-table")
    await page.get_by_label("Cards").check()

    # A phone: the device bars fit the width and the first deployment is on the first screen.
    await page.set_viewport_size({"width": 375, "height": 812})
    await page.reload()
    await expect(page.locator("#memory-devices .devbar")).to_have_count(2)
    await expect(page.locator("#cards > li")).to_have_count(5)
    await shot(page, "devices-phone")
    first_top = await page.evaluate("() => document.querySelector('#cards > li').getBoundingClientRect().top")
    assert first_top < 812 - 100, first_top
    await expect(page.locator("#memory-devices .devbar-free").first).to_have_text("20 GiB free")
    await assert_fits(page)


async def test_a_pooled_host_shows_nothing_of_devices(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    view = await svc.create(name="m", memory_gib=4, **ON_DEMAND)
    assert await chat(svc, view) == 200
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(page.locator("#memory-bar .seg-ondemand")).to_have_text("m")
    await expect(page.locator("#memory-devices")).to_be_hidden()
    await expect(page.locator("#memory-history svg")).to_have_count(1)
    await expect(card(page, "m").locator("[data-gpus]")).to_be_hidden()
    await page.get_by_label("Table").check()
    await expect(page.locator("#dep-table th[data-sort=gpus]")).to_be_hidden()
    await expect(page.locator('#dep-table td[data-col="GPUs"]')).to_be_hidden()
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    await expect(wizard.locator("#d-devices")).to_be_hidden()
    await wizard.get_by_label("Engine").select_option("command")
    await wizard.get_by_label("Command").fill("\n".join(engine_command()))
    await wizard.get_by_label("Name", exact=True).fill("plain")
    await wizard.get_by_label("Memory (GiB)").fill("2")
    await wizard.get_by_label("On demand").check()
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard).to_be_hidden()
    plain = next(v for v in (await svc.client.get("/api/deployments")).json() if v["name"] == "plain")
    assert (plain["gpus"], plain["gpu_ids"], plain["gpu_pins"]) == (None, None, None)
