"""The playground as a chat (issue 41 item 15): several turns, each message carrying the ones
before it and the system prompt, max tokens and the temperature checked and sent (to the
engine), a new chat, and the request as curl to copy (the caller's key left as $DGXMM_KEY, never
the on-demand key)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
from conftest import engine_command, gateway_settings
from ui.a11y import assert_no_serious_violations
from ui.browser import login, page, shot  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_a_chat_of_several_turns_and_its_curl(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    dep = await svc.create(
        name="talky", engine="command", memory_gib=2, mode="always_on", command=engine_command("--reply", "Hi there")
    )
    dep = await svc.wait_state(dep["id"], "ready")
    await login(page, svc.url, svc.ctx.admin_token)
    await page.goto(f"{svc.url}/#deployment/{dep['id']}")
    detail = page.locator("#detail-view")
    answer = detail.locator("#playground-answer")
    await detail.get_by_label("System prompt").fill("Be brief.")
    await detail.get_by_label("Max tokens").fill("0")
    await detail.get_by_label("Temperature").fill("2.5")
    await detail.get_by_label("Message").fill("Hello")
    await detail.get_by_role("button", name="Send").click()
    await expect(detail.locator("#playground-max-error")).to_have_text(  # both said at once
        "0 is not allowed: enter a whole number of tokens from 1 to 32768."
    )
    await expect(detail.locator("#playground-temperature-error")).to_have_text(
        "2.5 is not allowed: enter a temperature from 0 to 2, or leave it empty for the model's default."
    )
    await expect(detail.get_by_label("Temperature")).to_have_attribute("aria-invalid", "true")
    await shot(page, "playground-refused")
    await assert_no_serious_violations(page, "playground-refused")
    await expect(detail.get_by_label("Message")).to_have_value("Hello")  # nothing was sent
    await detail.get_by_label("Max tokens").fill("64")
    await detail.get_by_label("Temperature").fill("0.7")
    async with page.expect_request(lambda r: r.url.endswith("/playground")) as first:
        await detail.get_by_role("button", name="Send").click()
    assert (await first.value).post_data_json == {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        "max_tokens": 64,
        "temperature": 0.7,
    }
    await expect(answer).to_have_text("Hi there")
    await expect(detail.locator("#playground-temperature-error")).to_have_text("")
    async with httpx.AsyncClient() as engine:  # what the engine was sent (its record of requests)
        records = (await engine.get(f"{dep['base_url']}/_test/requests")).json()
    chats = [json.loads(r["body"]) for r in records if r["path"] == "/v1/chat/completions"]
    assert [(b["temperature"], b["max_tokens"]) for b in chats] == [(0.7, 64)]
    await detail.get_by_label("Message").fill("And again?")
    async with page.expect_request(lambda r: r.url.endswith("/playground")) as second:
        await detail.get_by_role("button", name="Send").click()
    assert (await second.value).post_data_json["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "And again?"},
    ]
    await expect(answer).to_have_text("Hi there")
    turns = detail.locator("#playground-turns li")
    await expect(turns).to_have_text(["You:Hello", "Model:Hi there", "You:And again?"])

    await detail.get_by_role("button", name="Copy as curl").click()
    curl = detail.locator("#playground-curl")
    await expect(curl).to_be_visible()
    text = await curl.text_content() or ""
    assert text.startswith(f"curl -N {svc.url}/ondemand/{dep['id']}/v1/chat/completions \\\n")
    assert "Authorization: Bearer $DGXMM_KEY" in text and svc.ctx.keys.current() not in text
    body = json.loads(re.search(r"-d '(.*)'$", text, re.S).group(1))  # type: ignore[union-attr]
    assert body["model"] == "talky" and body["max_tokens"] == 64 and body["temperature"] == 0.7
    assert len(body["messages"]) == 4
    assert await page.evaluate("() => navigator.clipboard.readText()") == text
    await shot(page, "playground-chat", full_page=True)
    await assert_no_serious_violations(page, "playground-chat")

    await detail.get_by_role("button", name="New chat").click()
    await expect(turns).to_have_count(0)
    await expect(answer).to_have_text("")
