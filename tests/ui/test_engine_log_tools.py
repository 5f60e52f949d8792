"""The engine log in the detail view (issue 41 item 14): health and metrics probes hidden unless
asked for, a search, the time each followed line arrived, and a download of the lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import chat, login, page, shot  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_probes_hidden_search_times_and_download(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    dep = await svc.create(name="talker", engine="command", memory_gib=2, mode="always_on", command=engine_command())
    await svc.wait_state(dep["id"], "ready")
    await login(page, svc.url, svc.ctx.admin_token)
    await page.goto(f"{svc.url}/#deployment/{dep['id']}")
    log = page.locator("#detail-log")
    await expect(log).to_contain_text("listening")
    probes = log.locator(".line.probe")
    await expect(probes.first).to_be_attached()  # the deployer's readiness probes are in the log...
    await expect(probes.first).to_be_hidden()  # ...and out of sight
    await expect(log.locator(".line", has_text="listening")).to_be_visible()
    assert await chat(svc, dep) == 200
    answer = log.locator(".line", has_text="POST /v1/chat/completions")
    await expect(answer).to_be_visible()
    # A line that arrived while the page followed carries the time it came.
    assert re.match(r"^\d", await answer.get_attribute("data-time") or ""), "no time"

    await page.get_by_label("Show health and metrics probes").check()
    await expect(probes.first).to_be_visible()
    await page.get_by_label("Search").fill("chat/completions")
    await expect(answer).to_be_visible()
    await expect(log.locator(".line", has_text="listening")).to_be_hidden()
    await expect(page.locator("#log-matches")).to_have_text(re.compile(r"^1 of \d+ lines match\.$"))
    await shot(page, "engine-log-tools")
    await assert_no_serious_violations(page, "engine-log-tools")

    async with page.expect_download() as info:
        await page.get_by_role("button", name="Download").click()
    download = await info.value
    assert download.suggested_filename == "talker-engine.log"
    text = Path(await download.path()).read_text()
    assert "listening" in text and re.search(r"^\d{4}-\d\d-\d\dT\S+ POST /v1/chat/completions$", text, re.M), text
