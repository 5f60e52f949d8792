"""Declared deployments on the console (issue 39, issue 41 item 18): a declared card and detail
view name the file that declares it and offer no Edit, Change mode or Remove (the API refuses
them), while Start and Stop work as on any other; a configuration error of the files is a banner
with file, line, table, field and message over every view, live, until the files are fixed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import card, login, page, shot, status  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


def table(name: str, memory: str = "memory_gib = 2") -> str:
    command = json.dumps(engine_command())
    return f'[[deployments]]\nname = "{name}"\nengine = "command"\nmode = "on_demand"\ncommand = {command}\n{memory}\n'


async def test_a_declared_deployment_is_read_only_and_a_file_error_is_a_banner(serve, tmp_path: Path, page) -> None:
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    models = folder / "models.toml"
    models.write_text(table("filed"))
    settings = gateway_settings(
        tmp_path, server={"deployments_dir": folder, "deployments_poll_s": 0.2}, ondemand={"idle_timeout_s": 3600}
    )
    svc = await serve(settings)
    await svc.create(name="mine", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    await login(page, svc.url, svc.ctx.admin_token)

    filed, mine = card(page, "filed"), card(page, "mine")
    await expect(filed.locator('[data-field="declared_in"]')).to_have_text(str(models))
    await expect(filed).to_contain_text("read-only here: its settings are the file's")
    await expect(mine.locator("[data-declared]")).to_be_hidden()
    for name in ("Edit", "Change mode", "Remove"):
        await expect(filed.get_by_role("button", name=name, exact=True)).to_have_count(0)
        await expect(mine.get_by_role("button", name=name, exact=True)).to_be_visible()
    await expect(page.locator("#config-error")).to_be_hidden()
    await shot(page, "declared-card")
    await assert_no_serious_violations(page, "declared-card")
    await filed.get_by_role("button", name="Start").click()
    await expect(status(page, "filed")).to_have_text("Idle", timeout=20_000)
    await filed.get_by_role("button", name="Stop").click()
    await expect(status(page, "filed")).to_have_text("Cold")

    # The detail view: the file, read-only, and the actions that work.
    await filed.get_by_role("link", name="filed").click()
    detail = page.locator("#detail-view")
    await expect(detail.locator("#detail-declared")).to_be_visible()
    await expect(detail.locator("#detail-declared-file")).to_have_text(str(models))
    await expect(detail.locator("#detail-facts")).to_contain_text(f"Declared in{models}")
    actions = detail.locator("#detail-actions")
    for name in ("Edit", "Change mode", "Remove"):
        await expect(actions.get_by_role("button", name=name, exact=True)).to_have_count(0)
    await actions.get_by_role("button", name="Start").click()
    await expect(actions.get_by_role("button", name="Stop")).to_be_visible(timeout=20_000)
    await shot(page, "declared-detail", full_page=True)
    await assert_no_serious_violations(page, "declared-detail")
    await actions.get_by_role("button", name="Stop").click()
    await expect(actions.get_by_role("button", name="Start")).to_be_visible()

    # An error of the file: a banner over the view shown, live, with where and why.
    models.write_text(table("filed") + table("second", memory="memory_gb = 2"))
    banner = page.locator("#config-error")
    await expect(banner).to_be_visible()
    await expect(banner.locator("#config-error-text")).to_have_text("unknown field")
    await expect(banner.locator("#config-error-file")).to_have_text(str(models))
    await expect(banner.locator("#config-error-line")).to_have_text("12")
    await expect(banner.locator("#config-error-table")).to_have_text("[[deployments]] #2 (second)")
    await expect(banner.locator("#config-error-field")).to_have_text("memory_gb")
    await expect(banner).to_contain_text("Nothing of this change is applied")
    await banner.scroll_into_view_if_needed()
    await shot(page, "config-error")
    await assert_no_serious_violations(page, "config-error")
    await page.goto(f"{svc.url}/#deployments")  # over every view, and after a reload of the page
    await page.reload()
    await expect(banner).to_be_visible()
    await expect(card(page, "second")).to_have_count(0)

    # A model file that is not there yet: said so, and applied once it is, with no edit of the file.
    gguf = tmp_path / "later.gguf"
    llama = (
        f'[[deployments]]\nname = "later"\nengine = "llamacpp"\nmode = "on_demand"\nmemory_gib = 1\nmodel = "{gguf}"\n'
    )
    models.write_text(table("filed") + llama)
    await expect(banner.locator("#config-error-text")).to_have_text(f"{gguf}: no such file on this host")
    await expect(banner.locator("#config-error-field")).to_have_text("model")
    await expect(banner.locator("#config-error-then")).to_contain_text("dgxmm looks again every 0.2 s")
    await assert_no_serious_violations(page, "config-error-recheck")
    gguf.write_bytes(b"GGUF")
    await expect(banner).to_be_hidden()
    await expect(card(page, "later").locator('[data-field="declared_in"]')).to_have_text(str(models))

    # The table: the file under the name, and no Edit or Remove in the row.
    await page.get_by_label("Table").check()
    row = page.locator("#dep-rows tr").filter(has=page.get_by_role("link", name="later", exact=True))
    await expect(row.locator(".read-only")).to_have_text(f"declared in {models}")
    await expect(row.get_by_role("button", name="Remove")).to_have_count(0)
    await expect(row.get_by_role("button", name="Start")).to_be_visible()
    await assert_no_serious_violations(page, "declared-table")
