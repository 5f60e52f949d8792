"""The model router's names in a real browser (issue 27): aliases entered in the wizard, shown on
the card and in the detail view with the OpenAI base URL; a name another deployment has is
refused at the field; a duplicate starts with names of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import card, login, page, shot  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_aliases_in_the_wizard_the_card_and_the_detail_view(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    await svc.create(
        name="coder", engine="command", memory_gib=2, mode="on_demand", aliases=["code"], command=engine_command()
    )
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(card(page, "coder").locator('[data-field="served_name"]')).to_have_text("coder (also code)")

    # The router can call an on-demand model (the on-demand key is there): on demand is proposed.
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    await expect(wizard.get_by_label("On demand")).to_be_checked()
    await expect(wizard.locator("#d-mode-hint")).to_contain_text("The model router (/v1) keeps it callable")
    await wizard.get_by_label("Engine").select_option("command")
    await wizard.get_by_label("Command").fill("\n".join(engine_command()))
    await wizard.get_by_label("Name", exact=True).fill("chat")
    await wizard.get_by_label("Other names").fill("talk, code")
    await wizard.get_by_label("Memory (GiB)").fill("2")
    await wizard.get_by_role("button", name="Deploy").click()
    # "code" is coder's: refused at the field, naming the other deployment.
    await expect(wizard.locator("#d-aliases-error")).to_contain_text("the deployment coder")
    await expect(wizard.get_by_label("Other names")).to_be_focused()
    await shot(page, "wizard-alias-taken")
    await wizard.get_by_label("Other names").fill("talk, gpt-4o-mini")
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard).to_be_hidden()
    await expect(card(page, "chat").locator('[data-field="served_name"]')).to_have_text("chat (also talk, gpt-4o-mini)")
    chat = next(v for v in (await svc.client.get("/api/deployments")).json() if v["name"] == "chat")
    assert chat["aliases"] == ["talk", "gpt-4o-mini"] and chat["mode"] == "on_demand"

    # The detail view: where OpenAI clients call it, and by which names.
    await card(page, "chat").get_by_role("link", name="chat").click()
    facts = page.locator("#detail-facts")
    await expect(facts.locator("div").filter(has_text="OpenAI base URL")).to_contain_text(
        f"http://127.0.0.1:{svc.settings.server.port}/v1"
    )
    await expect(facts.locator("div").filter(has_text="Model names")).to_contain_text("chat (also talk, gpt-4o-mini)")
    await assert_no_serious_violations(page, "detail-model-names")

    # A duplicate gets names of its own (the copy's served name is its new name).
    await page.locator("#detail-view").get_by_role("button", name="Duplicate").click()
    copy = page.get_by_role("dialog", name="Duplicate chat")
    await expect(copy.get_by_label("Other names")).to_have_value("")
    await expect(copy.get_by_label("Served name")).to_have_value("")
    await copy.get_by_role("button", name="Deploy").click()
    await expect(copy).to_be_hidden()
    twin = next(v for v in (await svc.client.get("/api/deployments")).json() if v["name"] == "chat-copy")
    assert (twin["served_name"], twin["aliases"]) == ("chat-copy", [])


async def test_a_preloaded_model_is_started_at_once_and_says_so(serve, tmp_path: Path, page) -> None:
    """Preload (issue 28): the wizard's checkbox, the card's mode text, and the start itself."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    await wizard.get_by_label("Engine").select_option("command")
    await wizard.get_by_label("Command").fill("\n".join(engine_command()))
    await wizard.get_by_label("Name", exact=True).fill("warm")
    await wizard.get_by_label("Memory (GiB)").fill("2")
    await wizard.get_by_label("Preload").check()
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard).to_be_hidden()
    warm = card(page, "warm")
    await expect(warm.locator('[data-field="mode"]')).to_have_text("On demand, default idle timeout, preloaded")
    await expect(warm.locator('[data-field="status"] .label')).to_have_text("Idle")  # started, no request yet
    view = next(v for v in (await svc.client.get("/api/deployments")).json() if v["name"] == "warm")
    assert view["preload"] is True and view["state"] == "ready"
