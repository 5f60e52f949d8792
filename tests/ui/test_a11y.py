"""Accessibility in the real browser: axe-core finds no serious or critical violation on the
deployments page (cards and table), the detail view and the wizard; the focus ring keeps 3:1
against every background it is drawn on; Loading and Ready differ without colour; the wizard
focuses the first invalid field; every chart has a text equivalent."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations, focus_rings
from ui.browser import card, chat, login, page, shot, status  # noqa: F401 (fixtures: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_axe_focus_ring_shapes_and_text_equivalents(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    ready = await svc.create(name="ready", engine="command", memory_gib=4, command=engine_command())
    loading = await svc.create(
        name="loading", engine="command", memory_gib=4, mode="on_demand", command=engine_command("--never-healthy")
    )
    broken = await svc.create(
        name="broken", engine="command", memory_gib=2, mode="on_demand", command=engine_command("--fail-start")
    )
    await svc.create(name="cold", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    await svc.wait_state(ready["id"], "ready")
    assert await chat(svc, broken) == 503
    waiting = asyncio.create_task(chat(svc, loading))  # it loads and never becomes ready
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(status(page, "loading")).to_have_text("Loading")
    await expect(status(page, "broken")).to_have_text("Failed")

    # Loading and Ready differ by shape and border, not only by colour.
    shapes = {}
    for name in ("loading", "ready", "broken", "cold"):
        badge = card(page, name).locator(".badge")
        shapes[name] = (
            await badge.locator(".glyph").text_content(),
            await badge.evaluate("b => getComputedStyle(b).borderTopStyle"),
        )
    assert len(set(shapes.values())) == 4, shapes
    assert shapes["loading"][1] == "dashed" and shapes["ready"][1] == "solid", shapes

    await assert_no_serious_violations(page, "deployments-cards")
    rings = await focus_rings(page, 45)
    assert len(rings) >= 30
    weak = [r for r in rings if r["style"] == "none" or r["width"] < 2 or r["contrast"] < 3]
    assert not weak, weak
    await page.get_by_label("Table").check()
    await assert_no_serious_violations(page, "deployments-table")
    await page.get_by_label("Cards").check()

    # Every chart says in words what it shows, and has its numbers as a table.
    await expect(page.locator("#memory-history svg")).to_have_attribute("aria-label", re.compile(r"^Memory since "))
    await page.goto(f"{svc.url}/#deployment/{broken['id']}")
    detail = page.locator("#detail-view")
    await expect(detail.locator("#detail-failure")).to_be_visible()
    await expect(detail.locator("#detail-charts figure")).to_have_count(5)
    for figure in await page.locator("figure").all():
        label = await figure.locator("svg").get_attribute("aria-label")
        assert label and len(label) > 20, label
        assert await figure.locator("details.chart-data table").count() == 1
    await assert_no_serious_violations(page, "detail")
    rings = await focus_rings(page, 30)
    assert not [r for r in rings if r["contrast"] < 3], rings
    await shot(page, "a11y-detail")

    # The wizard: axe, then the first invalid field gets the focus (model, before name and memory).
    await page.goto(f"{svc.url}/#deployments")
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    await assert_no_serious_violations(page, "wizard", "#deploy-dialog")
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard.get_by_label("Model", exact=True)).to_be_focused()
    await expect(wizard.get_by_label("Name", exact=True)).to_have_attribute("aria-invalid", "true")
    await expect(wizard.get_by_label("Memory (GiB)")).to_have_attribute("aria-invalid", "true")
    await assert_no_serious_violations(page, "wizard-errors", "#deploy-dialog")
    rings = await focus_rings(page, 25)
    assert not [r for r in rings if r["contrast"] < 3], rings
    await shot(page, "a11y-wizard-errors")
    waiting.cancel()
