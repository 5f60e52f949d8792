"""Connection honesty in a real browser: dgxmm stopped with the page open shows the banner, greys
the stale page, disables every action and counts down to the next attempt; Retry now tries at
once; dgxmm restarted on the same port and data reconnects with a notice that it restarted, stale
errors cleared and the page resynced."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import engine_command, make_settings
from ui.browser import card, login, page, shot, status  # noqa: F401 (fixtures: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_disconnect_banner_with_dgxmm_stopped_and_restarted(serve, tmp_path: Path, page) -> None:
    settings = make_settings(tmp_path, memory={"capacity_gib": 24})
    svc = await serve(settings)
    fixed = await svc.create(name="fixed", engine="command", memory_gib=4, command=engine_command())
    # big fits on the host, but not beside the ready models: its Start is refused (a model that
    # can never fit offers no Start at all, issue 30)
    await svc.create(name="big", engine="command", memory_gib=14, mode="on_demand", command=engine_command())
    other = await svc.create(name="other", engine="command", memory_gib=8, mode="on_demand", command=engine_command())
    await svc.client.post(f"/api/deployments/{other['id']}/start")
    await svc.wait_state(fixed["id"], "ready")
    await svc.wait_state(other["id"], "ready")
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(status(page, "fixed")).to_have_text("Ready")

    # An error on a card (big does not fit now), named by name, with the page's own usable memory.
    await card(page, "big").get_by_role("button", name="Start").click()
    error = card(page, "big").locator('[data-field="error"]')
    await expect(error).to_have_text(
        "big needs 14 GiB, 12.0 GiB free of 24.0 GiB usable, 4.0 GiB of it held by always-on and system deployments"
    )

    # dgxmm stops: the banner says the page may be stale; actions wait; a countdown runs.
    await svc.shutdown()
    banner = page.locator("#conn-banner")
    await expect(banner).to_contain_text("Disconnected: what you see may be stale.")
    await expect(page.locator("#conn")).to_have_text("Disconnected")
    await expect(page.locator("body")).to_have_attribute("data-conn", "down")
    await expect(card(page, "fixed").get_by_role("button", name="Stop")).to_be_disabled()
    await expect(card(page, "big").get_by_role("button", name="Remove")).to_be_disabled()
    await expect(page.get_by_role("button", name="Deploy a model")).to_be_disabled()
    countdown = page.locator("#conn-countdown")
    await expect(countdown).to_have_text(re.compile(r"^Reconnecting( in \d+ s)?…?\.?$"))
    await shot(page, "disconnected")
    # Retry now tries at once: it fails again, and the next wait is longer.
    await expect(countdown).to_have_text(re.compile(r"^Reconnecting in [2-9] s\.$"), timeout=10_000)
    await banner.get_by_role("button", name="Retry now").click()
    await expect(countdown).to_have_text(re.compile(r"^Reconnecting in ([4-9]|1\d) s\.$"))

    # dgxmm comes back (same port, same data): Retry now reconnects; the notice says it restarted.
    restarted = await serve(settings)
    assert restarted.ctx.started_at > svc.ctx.started_at
    await banner.get_by_role("button", name="Retry now").click()
    await expect(page.locator("#conn")).to_have_text("Live", timeout=10_000)
    await expect(banner).to_be_hidden()
    await expect(page.locator("#conn-notice")).to_have_text(re.compile(r"^Reconnected: dgxmm restarted at .+\.$"))
    await expect(error).to_be_hidden()  # stale errors are cleared
    await expect(card(page, "fixed").get_by_role("button", name="Stop")).to_be_enabled()
    # Resynced: the always-on model was restarted by the new dgxmm and shows it.
    await expect(status(page, "fixed")).to_have_text("Ready", timeout=20_000)
    await shot(page, "reconnected")
