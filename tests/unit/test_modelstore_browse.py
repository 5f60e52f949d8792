"""A repository's files before a pull (``ModelStore.files``, modelstore/browse.py) against the
local hub: sizes, what an include matches and what is here already, the hub's refusals with its
status, a hub that does not answer, the bounds; and the record as the API shows it (the
deployments that use it, its speed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dgxmm.errors import InvalidInput
from dgxmm.events import EventBus
from dgxmm.modelstore.browse import MAX_LISTED, MAX_LISTINGS, HubRefused, ListingsBusy
from dgxmm.modelstore.record import Status
from dgxmm.modelstore.source import HubSource
from dgxmm.modelstore.store import ModelStore
from dgxmm.settings import ModelsSettings
from dgxmm.store.db import Store
from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import FakeHub

WEIGHTS = bytes(range(256)) * 400  # 100 KiB, an LFS file
OTHER = bytes(range(256)) * 100
CONFIG = b'{"model_type": "llama"}'
TOKEN = "hf_s3cret_token_value"


class Harness:
    def __init__(self, hub: FakeHub, tmp: Path, **settings: Any) -> None:
        self.settings = ModelsSettings(**{"reserve_gib": 0, "stall_timeout_s": 1, **settings})
        self.db = Store(tmp / "dgxmm.db")
        self.bus = EventBus(self.db)
        self.events = self.bus.subscribe()
        self.users: list[str] = []
        source = HubSource(hub.url, self.settings.hub_token_file, self.settings.stall_timeout_s, hub.redirect_hosts)
        self.store = ModelStore(self.settings, tmp, self.db, self.bus, source, users=lambda record: self.users)

    def seen(self) -> list[dict[str, Any]]:
        found = []
        while not self.events._queue.empty():
            message = self.events._queue.get_nowait()
            if message is not None and message.kind == "model":
                found.append(message.data)
        return found

    async def settled(self, model: str) -> None:
        for _ in range(200):
            if self.store.get(model).status is not Status.DOWNLOADING:
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{model} still downloading")

    async def close(self) -> None:
        await self.store.close()
        self.db.close()


@pytest.fixture
async def h(hub: FakeHub, tmp_path: Path) -> AsyncIterator[Harness]:
    hub.add("org/tiny", {"model.gguf": WEIGHTS, "other.gguf": OTHER, "sub/config.json": CONFIG})
    harness = Harness(hub, tmp_path)
    yield harness
    await harness.close()


async def test_the_files_with_their_sizes_what_an_include_matches_and_what_is_here(h: Harness, hub: FakeHub) -> None:
    every = await h.store.files("org/tiny", "main", [])
    assert every["commit"] == hub.repos["org/tiny"].commit and every["gated"] is None and every["warning"] is None
    assert every["files"] == [
        {"path": "model.gguf", "size": len(WEIGHTS), "here": False},
        {"path": "other.gguf", "size": len(OTHER), "here": False},
        {"path": "sub/config.json", "size": len(CONFIG), "here": False},
    ]
    assert every["file_count"] == every["matched"] == 3 and not every["truncated"]
    assert every["bytes_total"] == every["bytes_matched"] == len(WEIGHTS) + len(OTHER) + len(CONFIG)
    assert hub.gets("/resolve/") == [] and hub.gets("/repos/") == []  # listed, nothing fetched

    record, _ = await h.store.pull("org/tiny", "main", ["model.gguf"], user=None)
    await h.settled(record.id)
    ggufs = await h.store.files("org/tiny", "main", ["*.gguf"])
    assert [(f["path"], f["here"]) for f in ggufs["files"]] == [("model.gguf", True), ("other.gguf", False)]
    assert ggufs["matched"] == 2 and ggufs["file_count"] == 3
    assert ggufs["bytes_matched"] == len(WEIGHTS) + len(OTHER) and ggufs["bytes_here"] == len(WEIGHTS)
    assert (await h.store.files("org/tiny", "main", ["*.safetensors"]))["matched"] == 0


async def test_a_long_listing_is_cut_at_max_listed_with_the_counts_of_all(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("org/many", {f"shard-{i:05d}.bin": b"x" * (i % 7 + 1) for i in range(MAX_LISTED + 5)})
    h = Harness(hub, tmp_path)
    try:
        answer = await h.store.files("org/many", "main", [])
        assert answer["truncated"] and len(answer["files"]) == MAX_LISTED
        assert answer["matched"] == answer["file_count"] == MAX_LISTED + 5
        assert answer["bytes_matched"] == sum(i % 7 + 1 for i in range(MAX_LISTED + 5))
        assert answer["files"][0]["path"] == "shard-00000.bin"
        few = await h.store.files("org/many", "main", ["shard-0000?.bin"])
        assert few["matched"] == 10 and not few["truncated"]
    finally:
        await h.close()


async def test_the_hubs_refusals_keep_its_status_and_say_what_to_do(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("org/tiny", {"model.gguf": WEIGHTS})
    hub.add("org/private", {"model.gguf": WEIGHTS}, token=TOKEN, private=True)
    hub.add("org/gated", {"model.gguf": WEIGHTS}, token=TOKEN)
    h = Harness(hub, tmp_path)
    try:
        for repo, revision, status, code in (
            ("org/missing", "main", 404, "repo_not_found"),
            ("org/tiny", "nope", 404, "revision_not_found"),
            ("org/private", "main", 401, "repo_not_found"),
        ):
            with pytest.raises(HubRefused) as refused:
                await h.store.files(repo, revision, [])
            assert (refused.value.status, refused.value.code) == (status, code), refused.value.message
        assert "hub_token_file" in refused.value.message  # the private one, asked without a token
        gated = await h.store.files("org/gated", "main", [])
        assert gated["gated"] == "manual" and gated["files"][0]["size"] == len(WEIGHTS)
        assert "gated" in gated["warning"] and "set [models] hub_token_file" in gated["warning"]
        for repo in ("../etc", "org"):
            with pytest.raises(InvalidInput) as bad:
                await h.store.files(repo, "main", [])
            assert bad.value.field == "repo"
    finally:
        await h.close()
    (tmp_path / "token").write_text(TOKEN + "\n")
    h = Harness(hub, tmp_path, hub_token_file=tmp_path / "token")
    try:
        assert (await h.store.files("org/private", "main", []))["files"][0]["path"] == "model.gguf"
        warning = (await h.store.files("org/gated", "main", []))["warning"]
        assert "granted access" in warning and TOKEN not in warning
    finally:
        await h.close()


async def test_a_hub_that_does_not_answer_fails_the_listing_and_the_pull_after_the_stall_timeout(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add("org/silent", {"model.gguf": WEIGHTS}, stall_info=True)
    h = Harness(hub, tmp_path)  # stall_timeout_s 1
    try:
        with pytest.raises(HubRefused) as refused:
            await h.store.files("org/silent", "main", [])
        assert (refused.value.status, refused.value.code) == (504, "hub_timeout")
        record, _ = await h.store.pull("org/silent", "main", [], user=None)
        assert record.status is Status.FAILED and "stalled" in (record.error or "")
    finally:
        await h.close()


async def test_at_most_max_listings_are_asked_at_once_and_one_more_is_refused(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("org/slow", {"model.gguf": WEIGHTS}, stall_info=True)
    h = Harness(hub, tmp_path, stall_timeout_s=30)
    try:
        asked = [asyncio.create_task(h.store.files("org/slow", "main", [])) for _ in range(MAX_LISTINGS)]
        for _ in range(200):  # every one of them is at the hub, waiting for its answer
            if sum("/api/models/org/slow" in s.path for s in hub.seen) == MAX_LISTINGS:
                break
            await asyncio.sleep(0.02)
        with pytest.raises(ListingsBusy):
            await h.store.files("org/tiny", "main", [])
        hub.released.set()
        answers = await asyncio.gather(*asked)
        assert [a["matched"] for a in answers] == [1] * MAX_LISTINGS
        hub.add("org/tiny", {"model.gguf": WEIGHTS})
        assert (await h.store.files("org/tiny", "main", []))["matched"] == 1  # the slots are free again
    finally:
        await h.close()


async def test_the_records_view_names_its_users_and_its_speed_while_it_downloads(h: Harness, hub: FakeHub) -> None:
    hub.repos["org/tiny"].stall_after["model.gguf"] = 4096
    record, _ = await h.store.pull("org/tiny", "main", ["model.gguf"], user=None)
    h.users = ["chat", "b-chat"]
    for _ in range(100):
        downloading = [e for e in h.seen() if e["status"] == "downloading" and e["bytes_per_s"] is not None]
        if downloading:
            break
        await asyncio.sleep(0.05)
    assert downloading and downloading[-1]["used_by"] == ["b-chat", "chat"]
    assert isinstance(downloading[-1]["bytes_per_s"], float) and downloading[-1]["bytes_per_s"] >= 0
    hub.repos["org/tiny"].stall_after.clear()
    hub.released.set()  # (the stalled transfer breaks off: pulled again, it resumes)
    await h.settled(record.id)
    await h.store.pull("org/tiny", "main", ["model.gguf"], user=None)
    await h.settled(record.id)
    view = h.store.view(h.store.get(record.id))
    assert view["status"] == "ready" and view["bytes_per_s"] is None and view["used_by"] == ["b-chat", "chat"]
    h.users = []
    assert h.store.view(h.store.get(record.id))["used_by"] == []
