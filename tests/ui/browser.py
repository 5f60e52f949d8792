"""The browser fixture and helpers (import them into a test module): Playwright for Python driving Debian's chromium (installed by .ci/run).

Chromium is launched by its executable path, headless, with a fresh profile in the test's temp
folder and background networking off, so a test never reaches beyond this machine. Screenshots go
to ``test-output/ui/`` at the repository root.
"""

from __future__ import annotations

import asyncio

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path(os.environ.get("DGXMM_TEST_CHROMIUM", "/usr/bin/chromium"))
SHOTS = Path(__file__).resolve().parents[2] / "test-output" / "ui"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.fixture
async def litellm(tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """[litellm] settings for an in-process LiteLLM stand-in, so GET /api/host reports it ready."""
    from engines.litellm_standin import StandIn

    lite = await StandIn().start()
    master = tmp_path / "litellm-master.key"
    master.write_text(lite.master_key + "\n")
    yield {"enabled": True, "url": lite.url, "master_key_file": master, "sync_interval_s": 0.5}
    await lite.stop()


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Any]:
    """A fresh page in a fresh headless chromium at a desktop size (1280 x 900)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run installs it)")
    playwright_api = pytest.importorskip("playwright.async_api")
    async with playwright_api.async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
            locale="en-GB",
            timezone_id="UTC",
            permissions=["clipboard-read", "clipboard-write"],
        )
        # Assertions wait as long as actions do: on a loaded 2-core machine a view can take more than
        # expect()'s own 5 s default to render (seen once while another suite ran beside this one).
        context.set_default_timeout(15_000)
        playwright_api.expect.set_options(timeout=15_000)
        page = context.pages[0] if context.pages else await context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            yield page
        finally:
            await context.close()
        assert not errors, f"JavaScript errors on the page: {errors}"


async def shot(page: Any, name: str, **kw: Any) -> Path:
    """Save a screenshot as test-output/ui/<name>.png."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    await page.screenshot(path=str(path), **kw)
    return path


async def assert_fits(page: Any) -> None:
    """Nothing scrolls sideways past the viewport once the view has settled (a re-render on a
    live event may widen a frame for a moment on a loaded machine: polled for up to 5 s); a
    failure names the elements that reach past it outside any scrolling box (tag#id.class and
    their right edge), so a failed "fits a phone" check names its culprit."""
    over, culprits = 0, []
    for _ in range(50):
        over, culprits = await page.evaluate(
            """() => {
              const clipped = (e) => { for (let a = e.parentElement; a; a = a.parentElement)
                if (getComputedStyle(a).overflowX !== "visible") return true; return false; };
              return [document.documentElement.scrollWidth - innerWidth,
                [...document.body.querySelectorAll("*")]
                  .filter((e) => e.getBoundingClientRect().right > innerWidth + 0.5 && !clipped(e))
                  .map((e) => `${e.tagName}#${e.id}.${e.className} right=${Math.round(e.getBoundingClientRect().right)}`)
                  .slice(0, 8)];
            }"""
        )
        if over <= 0:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{over} px wider than the screen: {culprits}")


async def login(page: Any, url: str, token: str) -> None:
    """Open the UI and log in with a token (admin or viewer) through the login form."""
    from playwright.async_api import expect

    await page.goto(f"{url}/")
    await page.get_by_label("Admin or viewer token").fill(token)
    await page.get_by_role("button", name="Log in").click()
    await expect(page.get_by_role("heading", name="Deployments", exact=True)).to_be_visible()
    await expect(page.locator("#conn")).to_have_text("Live")


def card(page: Any, name: str) -> Any:
    """The card of the deployment called ``name``."""
    return page.locator("#cards > li").filter(has=page.get_by_role("heading", name=name, exact=True))


def status(page: Any, name: str) -> Any:
    """The label of the status badge on ``name``'s card, e.g. "Queued 1" (the badge's shape is
    beside it, and the badge's ``data-status`` is the status code)."""
    return card(page, name).locator('[data-field="status"] .badge .label')


def status_time(page: Any, name: str) -> Any:
    """The time beside the badge: "for 3 s", "stops in 4:59", "starts refused for 0:52 more"."""
    return card(page, name).locator('[data-field="status"] .status-time')


def status_detail(page: Any, name: str) -> Any:
    """The sentence under the badge, e.g. what a queued request waits for."""
    return card(page, name).locator('[data-field="status_detail"]')


async def chat(svc: Any, dep: dict[str, Any], *, stream: bool = False, usage: bool = False) -> int:
    """A chat request through the gateway as LiteLLM sends it (a stream with ``usage`` asks for
    its token counts); returns the status code once the whole answer has arrived."""
    from conftest import caller

    body: dict[str, Any] = {"model": dep["name"], "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
    if usage:
        body["stream_options"] = {"include_usage": True}
    async with (
        caller(svc, timeout=120) as gw,
        gw.stream("POST", f"/{dep['id']}/v1/chat/completions", json=body) as resp,
    ):
        async for _ in resp.aiter_bytes():
            pass
        return int(resp.status_code)
