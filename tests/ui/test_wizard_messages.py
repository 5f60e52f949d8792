"""The wizard's messages in a real browser (issue 41 items 8 and 9): every problem at once, said
with what is allowed, before Deploy is pressed; no raw field names from the API; sizes in units
a person reads; a GGUF that is not one refused at the model field; an edit that fixes a failed
deployment leaves a card without the old failure."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import card, login, page, shot  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_every_problem_shows_at_once_before_sending(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    await svc.create(name="coder", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("button", name="Deploy a model").click()
    wizard = page.get_by_role("dialog", name="Deploy a model")
    await wizard.get_by_label("Engine").select_option("llamacpp")
    await wizard.get_by_label("GPU layers").fill("-3")
    await wizard.get_by_label("GPU layers").press("Tab")
    await wizard.get_by_label("Name", exact=True).fill("my model")
    await wizard.get_by_label("Name", exact=True).press("Tab")
    await wizard.get_by_label("Memory (GiB)").fill("0.0001")
    await wizard.get_by_label("Memory (GiB)").press("Tab")
    # Nothing was sent, and each field already says what is wrong and what is allowed.
    await expect(wizard.locator("#d-ngl-error")).to_have_text(
        "-3 is not allowed here: enter a whole number of layers, 0 or more (0: none on the GPU; 999: all)."
    )
    await expect(wizard.locator("#d-name-error")).to_contain_text("“my model” is not allowed")
    await expect(wizard.locator("#d-memory-error")).to_have_text(
        "0.0001 GiB is not allowed: enter the memory in GiB, from 0.01 to 4096."
    )
    await expect(wizard.get_by_label("GPU layers")).to_have_attribute("aria-invalid", "true")
    assert (await svc.client.get("/api/deployments")).json()[0]["name"] == "coder"
    await shot(page, "wizard-all-problems")
    await assert_no_serious_violations(page, "wizard-all-problems")

    # A name another deployment has is refused at the field before sending; Deploy shows the
    # model's absence beside the rest and focuses the first field in the form's order.
    await wizard.get_by_label("Name", exact=True).fill("coder")
    await wizard.get_by_label("Name", exact=True).press("Tab")
    await expect(wizard.locator("#d-name-error")).to_have_text(
        "Another deployment is named coder: choose another name."
    )
    await wizard.get_by_role("button", name="Deploy").click()
    await expect(wizard.locator("#d-model-error")).to_have_text("Enter the model to serve.")
    await expect(wizard.locator("#d-ngl-error")).not_to_be_empty()
    await expect(wizard.get_by_label("Model", exact=True)).to_be_focused()

    # What only the API can know: its message without the raw field name.
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    await wizard.get_by_label("Model", exact=True).fill(str(text))
    await wizard.get_by_label("GPU layers").fill("99")
    await wizard.get_by_label("Name", exact=True).fill("mine")
    await wizard.get_by_label("Memory (GiB)").fill("2")
    await wizard.get_by_role("button", name="Deploy").click()
    error = wizard.locator("#d-model-error")
    await expect(error).to_have_text(f"{text}: not a GGUF file (it does not begin with the GGUF magic)")
    await expect(wizard.get_by_label("Model", exact=True)).to_be_focused()
    await assert_no_serious_violations(page, "wizard-not-a-gguf")


async def test_an_edit_that_fixes_a_failed_deployment_clears_its_card(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    broken = await svc.create(
        name="broken", engine="command", memory_gib=2, mode="on_demand", command=engine_command("--fail-start")
    )
    await svc.client.post(f"/api/deployments/{broken['id']}/start")
    await svc.wait_state(broken["id"], "failed")
    await login(page, svc.url, svc.ctx.admin_token)
    box = card(page, "broken")
    await expect(box.locator('[data-field="reason"]')).to_be_visible()
    await box.get_by_role("button", name="Edit").click()
    wizard = page.get_by_role("dialog", name="Edit broken")
    await wizard.get_by_label("Command").fill("\n".join(engine_command()))
    await wizard.get_by_role("button", name="Save changes").click()
    await expect(wizard).to_be_hidden()
    await expect(box.locator('[data-field="status"] .label')).to_have_text("Cold")
    await expect(box.locator('[data-field="reason"]')).to_be_hidden()
    await expect(box.locator('[data-field="last_failure"]')).to_be_hidden()
    await expect(box).not_to_have_class("is-failed")
    await assert_no_serious_violations(page, "edited-after-failure")
