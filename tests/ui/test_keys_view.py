"""The caller keys in the console (issue 37 items 1 and 3, issue 41 items 16 and 18), in the real
Chromium against the real service: a key made in a form that shows every problem at once and the
API's refusal at its field, its secret shown once with Copy, its usage from real traffic through
the model router with that key, its limits changed, its requests ended and its revocation asked
first; a viewer token seeing the keys and no control; the requests view filtering by key and
showing usage per model and per key; a model's usage in its detail view. axe finds nothing
serious on any of it."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, engine_command, gateway_settings, wait_until
from ui.a11y import assert_no_serious_violations
from ui.browser import assert_fits, card, login, page, shot  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def router(svc: Any, key: str) -> httpx.AsyncClient:
    """A caller of the model router (/v1) with ``key``, from an allowed peer."""
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


async def chat(svc: Any, key: str, model: str) -> int:
    async with router(svc, key) as r:
        return (await r.post("/chat/completions", json={**CHAT, "model": model})).status_code


def words(u: dict[str, int]) -> str:
    """A usage entry as the console says it."""
    errors = "no errors" if not u["errors"] else f"{u['errors']} error" + ("s" if u["errors"] > 1 else "")
    requests = f"{u['requests']} request" + ("" if u["requests"] == 1 else "s")
    return f"{requests}, {u['prompt_tokens']:,} → {u['completion_tokens']:,} tokens, {errors}"


async def test_a_key_is_made_shown_once_used_changed_and_revoked(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await svc.create(name="a-1", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("link", name="Keys").click()
    view = page.locator("#keys-view")
    await expect(view.get_by_role("heading", name="Caller keys")).to_be_visible()
    await expect(view.locator("#keys-empty")).to_be_visible()

    # Every problem at once, at its field, before anything is sent.
    await view.get_by_role("button", name="New key").click()
    dialog = page.locator("#key-dialog")
    await dialog.get_by_label("Name").fill("bad name")
    await dialog.get_by_label("Models").fill("a-*, b c, d[")
    await dialog.get_by_label("Expires").fill("2020-01-01T10:00")
    await dialog.get_by_label("Requests at once").fill("0")
    await dialog.get_by_label("Tokens per day").fill("-5")
    await dialog.get_by_label("Priority").fill("1001")
    await dialog.get_by_role("button", name="Create key").click()
    errors = {
        "name": "“bad name” is not allowed",
        "models": "“b c” has a space",
        "expires_at": "is past",
        "max_concurrent": "0 is not allowed",
        "tokens_per_day": "-5 is not allowed",
        "priority": "1001 is not allowed",
    }
    for field, text in errors.items():
        await expect(dialog.locator(f'[data-error-for="{field}"]')).to_contain_text(text)
    await expect(dialog.get_by_label("Name")).to_be_focused()
    await expect(dialog.locator('[aria-invalid="true"]')).to_have_count(6)
    await shot(page, "keys-form-errors")
    await assert_no_serious_violations(page, "keys-form-errors")
    assert (await svc.client.get("/api/keys")).json() == [], "nothing sent"

    # What only the API knows (a name taken meanwhile) at the field it names.
    assert (await svc.client.post("/api/keys", json={"name": "taken"})).status_code == 201
    await dialog.get_by_label("Name").fill("taken")
    await dialog.get_by_label("Models").fill("a-*")
    await dialog.get_by_label("Expires").fill("")
    await dialog.get_by_label("Requests at once").fill("2")
    await dialog.get_by_label("Tokens per day").fill("1000")
    await dialog.get_by_label("Priority").fill("10")
    await dialog.get_by_role("button", name="Create key").click()
    await expect(dialog.locator('[data-error-for="name"]')).to_have_text("A key called taken exists")
    await expect(dialog.get_by_label("Name")).to_be_focused()
    await expect(dialog.locator('[aria-invalid="true"]')).to_have_count(1)

    # Made: the secret shown once, with Copy and the warning. A key for a chat UI: progress ticked.
    await dialog.get_by_label("Name").fill("alice")
    await dialog.get_by_label("Show start-up progress in chat UIs").check()
    await dialog.get_by_role("button", name="Create key").click()
    await expect(dialog).to_be_hidden()
    secret_box = view.locator("#key-secret")
    await expect(secret_box).to_be_visible()
    await expect(secret_box).to_contain_text("it will not be shown again")
    await expect(secret_box).to_be_focused()
    secret = await secret_box.get_by_label("The secret").input_value()
    assert secret.startswith("dgxmm-") and len(secret) > 40
    await secret_box.get_by_role("button", name="Copy").click()
    await expect(view.locator("#keys-status")).to_have_text("Copied the secret.")
    assert await page.evaluate("navigator.clipboard.readText()") == secret
    row = view.locator("#keys-rows tr").filter(has_text="alice")
    await expect(row.locator('td[data-label="Models"]')).to_have_text("a-*")
    await expect(row.locator('td[data-label="Limits"]')).to_have_text(
        "2 at once (0 in flight), 1,000 tokens a day, priority 10; start-up progress in chat UIs"
    )
    await expect(row.locator('td[data-label="Expires"]')).to_have_text("Never")
    assert secret.startswith((await row.locator('td[data-label="Prefix"]').text_content() or "").rstrip("…"))
    await shot(page, "keys-secret")
    await assert_no_serious_violations(page, "keys-secret")

    # Gone once the view is left: never shown again, never fetched again.
    await page.get_by_role("link", name="Requests").click()
    await page.get_by_role("link", name="Keys").click()
    await expect(row).to_be_visible()
    await expect(secret_box).to_be_hidden()
    assert await secret_box.get_by_label("The secret").input_value() == ""
    assert secret not in (await svc.client.get("/api/keys")).text

    # Real traffic with the key: its usage today and in the last hour, read again as it goes.
    assert await chat(svc, secret, "a-1") == 200
    assert await chat(svc, secret, "a-1") == 200
    assert await chat(svc, secret, "b-1") == 404  # outside its models: an error of the key's
    [_, alice] = (await svc.client.get("/api/keys")).json()
    used = alice["usage"]["today"]
    assert used["requests"] == 3 and used["errors"] == 1 and used["completion_tokens"] > 0
    await expect(row.locator('td[data-label="Today"]')).to_have_text(words(used))
    await expect(row.locator('td[data-label="Last hour"]')).to_have_text(words(used))
    await expect(row.locator('td[data-label="In all"]')).to_have_text(words(used))
    await expect(row.locator('td[data-label="Last use"] time')).to_be_visible()

    # Its models and limits changed: only what was changed is sent.
    await row.get_by_role("button", name="Edit alice").click()
    await expect(dialog.get_by_role("heading")).to_have_text("Models and limits of alice")
    await expect(dialog.get_by_label("Models")).to_have_value("a-*")
    await expect(dialog.get_by_label("Name")).to_be_hidden()
    progress = dialog.get_by_label("Show start-up progress in chat UIs")
    await expect(progress).to_be_checked()
    await progress.uncheck()
    await expect(dialog.get_by_label("Priority")).to_have_value("10")
    await dialog.get_by_label("Requests at once").fill("")
    await dialog.get_by_label("Tokens per day").fill("5000")
    await dialog.get_by_label("Priority").fill("")
    await expect(dialog.get_by_label("May keep a model loaded")).to_be_checked()
    await dialog.get_by_label("May keep a model loaded").uncheck()
    await dialog.get_by_role("button", name="Save").click()
    await expect(dialog).to_be_hidden()
    await expect(row.locator('td[data-label="Limits"]')).to_have_text("5,000 tokens a day, may not set keep_alive")
    changed = (await svc.client.get(f"/api/keys/{alice['id']}")).json()
    assert (changed["models"], changed["max_concurrent"], changed["tokens_per_day"], changed["priority"]) == (
        ["a-*"],
        None,
        5000,
        0,
    )
    assert changed["keep_alive"] is False
    assert changed["progress"] == "off"
    assert [row["action"] for row in svc.ctx.store.list_audit(100)].count("key_changed") == 1

    # Its requests in flight ended after a confirmation (none now); the key stays.
    end = row.get_by_role("button", name="End requests alice")
    await end.click()
    confirm = page.locator("#confirm-dialog")
    await expect(confirm.get_by_role("heading")).to_have_text("End the requests of alice?")
    await confirm.get_by_role("button", name="End requests").click()
    await expect(view.locator("#keys-status")).to_have_text("alice: ended 0 requests in flight.")
    await expect(end).to_be_focused()
    assert [row["action"] for row in svc.ctx.store.list_audit(100)].count("key_requests_ended") == 1

    # Revoked after a confirmation; Cancel leaves it.
    revoke = row.get_by_role("button", name="Revoke alice")
    await revoke.click()
    await expect(confirm.get_by_role("heading")).to_have_text("Revoke alice?")
    await expect(confirm).to_contain_text("refused (401) from now on")
    await expect(confirm.get_by_role("button", name="Cancel")).to_be_focused()
    await assert_no_serious_violations(page, "keys-revoke-confirm")
    await confirm.get_by_role("button", name="Cancel").click()
    await expect(revoke).to_be_focused()
    assert await chat(svc, secret, "a-1") == 200
    await revoke.click()
    await confirm.get_by_role("button", name="Revoke").click()
    await expect(row).to_have_count(0)
    await expect(view.locator("#keys-status")).to_have_text("alice revoked: requests with it are refused from now on.")
    assert await chat(svc, secret, "a-1") == 401
    assert [key["name"] for key in (await svc.client.get("/api/keys")).json()] == ["taken"]
    await page.get_by_role("link", name="Deployments").click()
    await card(page, "a-1").get_by_role("button", name=re.compile("^Remove")).click()
    await expect(confirm.get_by_role("button", name="Remove")).to_be_visible()  # the dialog's own words again
    await confirm.get_by_role("button", name="Cancel").click()


async def test_a_viewer_sees_the_keys_and_no_control(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path))
    assert (await svc.client.post("/api/keys", json={"name": "alice", "tokens_per_day": 100})).status_code == 201
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).isoformat()
    brief = (await svc.client.post("/api/keys", json={"name": "brief", "expires_at": soon})).json()

    async def expired() -> bool:
        return bool((await svc.client.get(f"/api/keys/{brief['id']}")).json()["expired"])

    await wait_until(expired, timeout=10, interval=0.2)
    made = await svc.client.post("/api/tokens", json={"name": "watcher", "role": "viewer"})
    await login(page, svc.url, made.json()["token"])
    await page.get_by_role("link", name="Keys").click()
    view = page.locator("#keys-view")
    row = view.locator("#keys-rows tr").filter(has_text="alice")
    await expect(row.locator('td[data-label="Limits"]')).to_have_text("100 tokens a day")
    await expect(view.locator("#keys-readonly")).to_be_visible()
    expires = view.locator("#keys-rows tr").filter(has_text="brief").locator('td[data-label="Expires"]')
    await expect(expires).to_have_text(re.compile(r"^Expired \d"))
    await expect(expires.locator(".expired")).to_have_css("font-weight", "600")
    await expect(view.get_by_role("button")).to_have_count(0)
    await expect(view.get_by_role("columnheader", name="Actions")).to_be_hidden()
    await assert_no_serious_violations(page, "keys-viewer")


async def test_requests_filter_by_key_and_usage_per_model_and_key(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path))
    dep = await svc.create(
        name="a-1", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--reply", "one two")
    )
    alice = (await svc.client.post("/api/keys", json={"name": "alice"})).json()["key"]
    assert await chat(svc, alice, "a-1") == 200
    assert await chat(svc, alice, "a-1") == 200
    assert await chat(svc, alice, "nope") == 404  # no model: the key's error alone
    assert await chat(svc, KEY, "a-1") == 200
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("link", name="Requests").click()
    view = page.locator("#requests-view")
    rows = view.locator("#requests-rows tr:not(.request-detail)")
    await expect(rows).to_have_count(4)
    await expect(rows.nth(0).locator('td[data-label="Key"]')).to_have_text("key-file")

    usage = (await svc.client.get("/api/activity/usage")).json()
    [model] = usage["models"]
    assert model["today"]["requests"] == 3 and model["today"]["errors"] == 0
    by_model = view.locator("#usage-models tr[data-name='a-1']")
    await expect(by_model.locator('td[data-label="Requests today"]')).to_have_text("3")
    tokens = f"{model['today']['prompt_tokens']} → {model['today']['completion_tokens']}"
    await expect(by_model.locator('td[data-label="Tokens today (in → out)"]')).to_have_text(tokens)
    await expect(by_model.locator('td[data-label="Tokens, last hour"]')).to_have_text(tokens)
    by_alice = view.locator("#usage-keys tr[data-name='alice']")
    await expect(by_alice.locator('td[data-label="Requests today"]')).to_have_text("3")
    await expect(by_alice.locator('td[data-label="Errors today"]')).to_have_text("1")
    await expect(by_alice.locator('td[data-label="Errors, last hour"]')).to_have_text("1")
    await expect(view.locator("#usage-keys tr[data-name='key-file'] td[data-label='Requests today']")).to_have_text("1")

    # The filter by key, through the API's ?key=: the key's own requests, each naming it.
    await view.get_by_label("Key", exact=True).select_option("alice")
    await expect(rows).to_have_count(3)
    await expect(rows.locator('td[data-label="Key"]')).to_have_text(["alice"] * 3)
    # live: a new request with the key appears, and the usage follows it
    assert await chat(svc, alice, "a-1") == 200
    await expect(rows).to_have_count(4)
    await expect(by_alice.locator('td[data-label="Requests today"]')).to_have_text("4")
    await expect(by_model.locator('td[data-label="Requests, last hour"]')).to_have_text("4")
    assert await chat(svc, KEY, "a-1") == 200  # another key's: not listed under alice
    await expect(view.locator("#usage-keys tr[data-name='key-file'] td[data-label='Requests today']")).to_have_text("2")
    await expect(rows).to_have_count(4)
    await rows.nth(0).get_by_role("button").click()
    await expect(view.locator(".request-detail [data-key='key']")).to_have_text("Caller keyalice")
    await view.get_by_label("Key", exact=True).select_option("key-file")
    await expect(rows).to_have_count(2)
    await shot(page, "requests-usage", full_page=True)
    await assert_no_serious_violations(page, "requests-usage")

    # A model's usage in its detail view.
    await page.goto(f"{svc.url}/#deployment/{dep['id']}")
    facts = page.locator("#detail-usage")
    model = (await svc.client.get("/api/activity/usage")).json()["models"][0]
    await expect(facts).to_contain_text(f"Usage, last hour{words(model['last_hour'])}")
    await expect(facts).to_contain_text(f"Usage today (UTC){words(model['today'])}")


async def test_keys_and_usage_at_1920_and_on_a_phone(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await svc.create(name="a-1", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    for name in ("alice", "a-rather-long-key-name-for-a-build-robot@ci.example"):
        made = await svc.client.post(
            "/api/keys", json={"name": name, "models": ["a-*", "qwen-*"], "max_concurrent": 4, "tokens_per_day": 10**6}
        )
        assert made.status_code == 201
    assert await chat(svc, made.json()["key"], "a-1") == 200
    await page.set_viewport_size({"width": 1920, "height": 1080})
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("link", name="Keys").click()
    rows = page.locator("#keys-rows tr")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(1).locator('td[data-label="Today"]')).to_contain_text("1 request,")
    width = await page.evaluate("document.querySelector('.keys-table').getBoundingClientRect().width")
    assert width > 1500, width  # the view takes the width: ten columns side by side
    heights = await rows.evaluate_all("rs => rs.map(r => r.getBoundingClientRect().height)")
    await shot(page, "keys-1920")
    assert max(heights) < 100, heights  # short rows, not a column squeezed to a word per line
    await assert_fits(page)
    await shot(page, "keys-1920")

    await page.set_viewport_size({"width": 375, "height": 812})
    await page.reload()
    await expect(rows).to_have_count(2)
    await assert_fits(page)
    first = await rows.nth(0).locator('td[data-label="Name"]').bounding_box()
    models = await rows.nth(0).locator('td[data-label="Models"]').bounding_box()
    assert first and models and models["y"] > first["y"], "a key's facts one under another on a phone"
    await shot(page, "keys-phone", full_page=True)
    await page.get_by_role("link", name="Requests").click()
    await expect(page.locator("#requests-rows tr")).to_have_count(1)
    await expect(page.locator("#usage-box")).not_to_have_attribute("open", "")  # the requests first
    await assert_fits(page)
    await page.locator("#usage-box > summary").click()
    await expect(page.locator("#usage-keys tr")).to_have_count(3)
    await assert_fits(page)
    await assert_no_serious_violations(page, "requests-usage-phone")
