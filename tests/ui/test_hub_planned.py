"""A deployment whose model a hub names, on the console while its file downloads from the local
hub (tests/hub): its card says Planned with how far the download is, offers no Start (it starts
itself), and turns Cold once the file is here. Screenshots go to test-output/ui/."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from conftest import engine_command, gateway_settings
from huggingface_hub import constants
from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import FakeHub
from ui.browser import card, login, page, shot, status, status_detail  # noqa: F401 (fixtures: page)

pytest.importorskip("playwright.async_api")
from playwright.async_api import expect

pytestmark = pytest.mark.timeout(120)
WEIGHTS = hashlib.sha256(b"weights").digest() * (256 * 1024 // 32)


async def test_a_planned_card_shows_the_download_and_then_turns_cold(
    serve, hub: FakeHub, tmp_path: Path, page, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)  # (progress within the small file)
    repo = hub.add("org/tiny", {"model.gguf": WEIGHTS})
    repo.stall_after["model.gguf"] = 64 * 1024
    models = {**hub.settings, "reserve_gib": 0, "stall_timeout_s": 60}
    svc = await serve(gateway_settings(tmp_path, models=models))
    await svc.create(
        name="tiny",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        model="hf://org/tiny/model.gguf",
        command=engine_command(),
    )
    await login(page, svc.url, svc.ctx.admin_token)
    await expect(status(page, "tiny")).to_have_text("Planned")
    await expect(status_detail(page, "tiny")).to_contain_text("downloading 0.1 of 0.2 MiB")
    await expect(card(page, "tiny").locator('button[data-action="start"]')).to_be_hidden()
    await shot(page, "status-planned")
    repo.stall_after.clear()
    hub.released.set()
    await expect(status(page, "tiny")).to_have_text("Cold", timeout=20_000)
    await expect(status_detail(page, "tiny")).to_contain_text("The next request starts it.")
