"""The requests view and the playground in a real browser (issue 30): every request with what it
waited for and cost, live and filterable, a row opening its details; a model's speed on its card;
and a chat with a cold on-demand model from its detail view, streamed through the gateway, with
the cold start and the tokens per second said as they happen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings, wait_until
from ui.a11y import assert_no_serious_violations
from ui.browser import card, chat, login, page, shot  # noqa: F401 (fixture: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(180)


async def test_requests_are_listed_live_with_what_they_waited_for_and_cost(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    chatty = await svc.create(
        name="chatty",
        engine="command",
        memory_gib=2,
        mode="on_demand",
        command=engine_command("--reply", "one two three four", "--chunk-delay", "0.02"),
    )
    quiet = await svc.create(name="quiet", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    assert await chat(svc, chatty) == 200  # a cold start
    # a stream: its speed is known (an answer sent whole has none without the engine's own figure)
    assert await chat(svc, chatty, stream=True, usage=True) == 200
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(card(page, "chatty").locator('[data-field="speed"]')).to_have_text(re.compile(r"^[\d.]+ tokens/s$"))
    await page.get_by_role("link", name="Requests").click()
    rows = page.locator("#requests-rows tr:not(.request-detail)")
    await expect(rows).to_have_count(2)
    # the older one, below: its engine's load (a command engine's model has no files: nothing cached to say)
    await expect(rows.nth(1)).to_contain_text(re.compile(r"\(cold start: load [\d.]+ s\)"))
    await expect(rows.nth(0)).to_contain_text("Answered")
    await expect(rows.nth(0)).to_contain_text(re.compile(r"\d+ → 4"))  # tokens in → out
    # live: a new request appears at the top without a reload
    assert await chat(svc, quiet) == 200
    await expect(rows).to_have_count(3)
    await expect(rows.nth(0).locator('td[data-label="Model"]')).to_have_text("quiet")
    # filtered by model
    view = page.locator("#requests-view")
    await view.get_by_role("searchbox", name="Model").fill("chatty")
    await expect(rows).to_have_count(2)
    await view.get_by_label("Show").select_option("cold")
    await expect(rows).to_have_count(1)
    # a row opens its details, with the way to the engine's log
    open_it = rows.nth(0).get_by_role("button")
    await open_it.click()
    await expect(open_it).to_have_attribute("aria-expanded", "true")
    details = page.locator("#requests-rows .request-detail")
    await expect(details).to_contain_text("Cold startyes")
    await expect(details.get_by_role("link")).to_have_attribute("href", f"#deployment/{chatty['id']}")
    # ...and the engine's lines as that request ended: its own request line, not the later one's
    excerpt = details.locator("pre.log")
    await expect(excerpt).to_contain_text("able to answer")
    assert (await excerpt.text_content() or "").count("POST /v1/chat/completions") == 1
    await shot(page, "requests")
    await assert_no_serious_violations(page, "requests")


async def test_the_playground_streams_a_cold_model_and_says_how_fast(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 24}))
    await svc.create(
        name="talky",
        engine="command",
        memory_gib=2,
        mode="on_demand",
        command=engine_command("--start-delay", "1", "--chunk-delay", "0.05", "--reply", "Hello there from the engine"),
    )
    await login(page, svc.url, svc.ctx.admin_token)
    await card(page, "talky").get_by_role("link", name="talky").click()
    detail = page.locator("#detail-view")
    await expect(detail.locator('[data-field="status"] .label')).to_have_text("Cold")
    await detail.get_by_label("Message").fill("Say hello")
    await detail.get_by_role("button", name="Send").click()
    status = detail.locator("#playground-status")
    await expect(status).to_contain_text("its engine starts for this message")
    await expect(detail.locator("#playground-answer")).to_have_text("Hello there from the engine", timeout=30_000)
    await expect(status).to_have_text(
        re.compile(r"^First token after [\d.]+ s \(a cold start\); 5 tokens in [\d.]+ s at [\d.]+ tokens/s\.$")
    )
    await expect(detail.locator('[data-field="status"] .label')).to_have_text("Idle")
    [record] = (await svc.client.get("/api/activity")).json()
    assert record["client"] == "console" and record["cold_start"] and record["completion_tokens"] == 5
    assert svc.ctx.keys.current() not in await page.content()
    await shot(page, "playground", full_page=True)
    await assert_no_serious_violations(page, "playground")


def record(**kw: object) -> dict[str, object]:
    """An activity record as the gateway writes it (issue 41's cases, fed to the log directly)."""
    base: dict[str, object] = {
        "time": 1_800_000_000.0,
        "request_id": "r-1",
        "deployment_id": None,
        "served_name": None,
        "route": "chat/completions",
        "status": 200,
        "stream": True,
        "queued_s": 0.0,
        "cold_start": False,
        "ttfb_s": 0.2,
        "ttft_s": 0.2,
        "duration_s": 1.0,
        "prompt_tokens": None,
        "completion_tokens": None,
        "tokens_per_s": None,
        "client": "127.0.0.2",
        "outcome": "answered",
    }
    return {**base, **kw}


async def test_a_queued_stream_shows_the_notice_and_the_first_token_apart(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path))
    svc.ctx.activity.add(
        record(
            request_id="queued-1",
            served_name="m",
            queued_s=4.28,
            cold_start=True,
            ttfb_s=0.007,
            ttft_s=4.35,
            duration_s=5.0,
        )
    )
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("link", name="Requests").click()
    row = page.locator("#requests-rows tr:not(.request-detail)").first
    await expect(row.locator('td[data-label="First byte"]')).to_have_text("0.01 s notice, first token 4.35 s")
    await row.get_by_role("button").click()
    sheet = page.locator("#requests-rows .request-detail")
    await expect(sheet.locator('[data-key="ttft_s"]')).to_have_text("First token4.35 s")
    # Issue 41 item 14: a readable sheet, times as times, nulls left out.
    await expect(sheet.locator('[data-key="time"] dd')).to_have_text(re.compile(r"\d{1,2}:\d\d:\d\d"))
    await expect(sheet.locator('[data-key="prompt_tokens"]')).to_have_count(0)  # null: not known
    await expect(sheet).not_to_contain_text("null")


async def test_requests_are_in_start_order_and_an_unknown_model_is_named(serve, tmp_path: Path, page) -> None:
    svc = await serve(gateway_settings(tmp_path))
    activity = svc.ctx.activity
    activity.add(record(request_id="short-2", served_name="m", time=1_800_000_010.0, duration_s=1.0))
    activity.add(record(request_id="long-1", served_name="m", time=1_800_000_000.0, duration_s=30.0))
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("link", name="Requests").click()
    rows = page.locator("#requests-rows tr:not(.request-detail)")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0)).to_contain_text("short-2")  # it came last, though it ended first
    await wait_until(lambda: len(svc.ctx.activity_feed._subscribers) > 0, timeout=10)  # the page follows
    # live: one that came between the two, ending now, takes its place by arrival
    activity.add(record(request_id="middle-3", served_name="m", time=1_800_000_005.0, duration_s=40.0))
    await expect(rows).to_have_count(3)
    await expect(rows.nth(1)).to_contain_text("middle-3")
    activity.add(
        record(
            request_id="unknown-4",
            time=1_800_000_050.0,
            status=404,
            outcome="refused",
            model="gpt-4o",
            ttfb_s=None,
            ttft_s=None,
        )
    )
    await expect(rows.nth(0).locator('td[data-label="Model"]')).to_have_text("gpt-4o (no such model)")


async def test_a_request_reads_its_speed_in_tokens_per_second_and_an_empty_filter_says_so(
    serve, tmp_path: Path, page
) -> None:
    """Issue 58: the details said "Generation speed 12.22 s" (the field's name ends in ``_s``);
    and a filter that matched nothing said "No requests yet." under a log that had requests."""
    svc = await serve(gateway_settings(tmp_path))
    await login(page, svc.url, svc.ctx.admin_token)
    await page.get_by_role("link", name="Requests").click()
    empty = page.locator("#requests-empty")
    await expect(empty).to_have_text("No requests yet.")
    svc.ctx.activity.add(record(request_id="fast-1", served_name="m", completion_tokens=50, tokens_per_s=12.22))
    rows = page.locator("#requests-rows tr:not(.request-detail)")
    await expect(rows).to_have_count(1)
    await expect(empty).to_be_hidden()
    await expect(rows.first.locator('td[data-label="Tokens/s"]')).to_have_text("12.22")
    await rows.first.get_by_role("button").click()
    sheet = page.locator("#requests-rows .request-detail")
    await expect(sheet.locator('[data-key="tokens_per_s"] dd')).to_have_text("12.2 tokens/s")
    await expect(sheet.locator('[data-key="duration_s"] dd')).to_have_text("1 s")  # durations stay seconds

    await page.locator("#requests-view").get_by_role("searchbox", name="Model").fill("no-such-model")
    await expect(rows).to_have_count(0)
    await expect(empty).to_have_text("No requests match these filters.")
    await page.locator("#requests-view").get_by_role("searchbox", name="Model").fill("")
    await expect(rows).to_have_count(1)
    await expect(empty).to_be_hidden()
