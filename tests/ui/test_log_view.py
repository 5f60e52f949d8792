"""dgxmm's own log in a real browser (issue 30): the Events view shows its latest lines; a caller's
request is found by its id, with the peer and the status; the level filter keeps warnings and
errors; axe clean."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import gateway_settings, refused_request
from ui.a11y import assert_no_serious_violations
from ui.browser import login, page, shot  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(120)


async def test_a_refused_request_is_found_in_dgxmms_log_by_its_id(serve, tmp_path: Path, page, caplog) -> None:
    caplog.set_level(logging.INFO)  # dgxmm's default log_level
    svc = await serve(gateway_settings(tmp_path))
    await refused_request(svc, "caller-req-777")
    logging.getLogger("dgxmm.test").warning("a warning for the filter")
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("link", name="Events and audit").click()
    panel = page.get_by_role("region", name="dgxmm's log")
    await panel.get_by_label("Words or request id").fill("caller-req-777")
    await panel.get_by_role("button", name="Show lines").click()
    rows = panel.locator("#log-rows tr")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("401")
    await expect(rows.first).to_contain_text("request_id=caller-req-777")
    await expect(rows.first).to_contain_text("peer=127.0.0.2")
    await assert_no_serious_violations(page, "server-log")
    await shot(page, "server-log", full_page=True)

    await panel.get_by_label("Words or request id").fill("")
    await panel.get_by_label("Level").select_option("warning")
    await expect(rows.filter(has_text="a warning for the filter")).to_have_count(1)
    await expect(rows.filter(has_text="caller-req-777")).to_have_count(0)
