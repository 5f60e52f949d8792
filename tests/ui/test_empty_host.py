"""A fresh data directory in a real browser (issue 41 item 11): the page says what to do first,
and the memory section shows the host's memory, before any deployment exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import login, page  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(120)


async def test_an_empty_host_says_what_to_do_first(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(page.locator("#deployments-empty")).to_be_visible()
    await expect(page.locator("#deployments-empty")).to_have_text(
        "No deployments yet. Use “Deploy a model” to add one."
    )
    await expect(page.locator("#memory-summary")).to_contain_text("24 GiB")
    await assert_no_serious_violations(page, "empty-host")
