"""The model store against the local hub (tests/hub): pulls land in the Hub's cache layout,
verified, resumed with a range request, refused for want of space before any byte, and the
token stays out of every record, event and error."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from huggingface_hub import constants

from dgxmm.errors import InvalidInput
from dgxmm.events import EventBus
from dgxmm.deploy.pagecache import PageCache, cached_bytes
from dgxmm.modelstore.pull import Release
from dgxmm.modelstore.record import Status
from dgxmm.modelstore.source import HubSource
from dgxmm.modelstore.store import CLOSE_WAIT_S, ModelInUse, ModelStore
from dgxmm.settings import ModelsSettings
from dgxmm.store.db import Store
from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import FakeHub
from unit import test_pagecache
from unit.rawengine import Engine

on_disk = test_pagecache.on_disk  # the fixture: a directory on a disk (on tmpfs the pages are the file)
WEIGHTS = bytes(range(256)) * 400  # 100 KiB, an LFS file
CONFIG = b'{"model_type": "llama"}'
TOKEN = "hf_s3cret_token_value"
CHUNK = 4096


class Harness:
    def __init__(self, hub: FakeHub, tmp: Path, release: Release | None = None, **settings: Any) -> None:
        self.hub, self.tmp, self.release = hub, tmp, release
        self.settings = ModelsSettings(**{"reserve_gib": 0, "stall_timeout_s": 1, **settings})
        self.db = Store(tmp / "dgxmm.db")
        self.bus = EventBus(self.db)
        self.events = self.bus.subscribe()
        self.users: list[str] = []
        self.store = self.open()

    def open(self) -> ModelStore:
        source = HubSource(
            self.hub.url, self.settings.hub_token_file, self.settings.stall_timeout_s, self.hub.redirect_hosts
        )
        return ModelStore(
            self.settings, self.tmp, self.db, self.bus, source, users=lambda record: self.users, release=self.release
        )

    def seen(self) -> list[dict[str, Any]]:
        found = []
        while not self.events._queue.empty():
            message = self.events._queue.get_nowait()
            if message is not None and message.kind == "model":
                found.append(message.data)
        return found

    async def settled(self, model: str) -> dict[str, Any]:
        for _ in range(200):
            record = self.store.get(model)
            if record.status is not Status.DOWNLOADING:
                return record.view()
            await asyncio.sleep(0.05)
        raise AssertionError(f"{model} still downloading: {self.store.get(model).view()}")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub writes what it reads in pieces of this size (10 MB by default): small
    ones, so a stall in the middle of a 100 KiB file leaves its first pieces on disk."""
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)


@pytest.fixture
async def h(hub: FakeHub, tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(hub, tmp_path)
    hub.add("org/tiny", {"model.gguf": WEIGHTS, "sub/config.json": CONFIG})
    yield harness
    await harness.store.close()
    harness.db.close()


async def test_a_two_file_pull_ends_ready_in_the_cache_layout_and_again_downloads_nothing(h: Harness) -> None:
    record, began = await h.store.pull("org/tiny", "main", [], user="admin")
    assert began and record.status is Status.DOWNLOADING
    view = await h.settled(record.id)
    assert view["status"] == "ready" and view["bytes_done"] == view["bytes_total"] == len(WEIGHTS) + len(CONFIG)
    commit = h.hub.repos["org/tiny"].commit
    snapshot = h.tmp / "models" / "models--org--tiny" / "snapshots" / commit
    assert view["path"] == str(snapshot)
    assert hashlib.sha256((snapshot / "model.gguf").read_bytes()).hexdigest() == hashlib.sha256(WEIGHTS).hexdigest()
    assert (snapshot / "model.gguf").is_symlink() and (snapshot / "sub" / "config.json").read_bytes() == CONFIG
    assert (h.tmp / "models" / "models--org--tiny" / "refs" / "main").read_text() == commit
    files = {f["path"]: f for f in view["files"]}
    assert files["model.gguf"]["sha256"] == hashlib.sha256(WEIGHTS).hexdigest()
    statuses = [e["status"] for e in h.seen()]
    assert statuses[0] == "downloading" and statuses[-1] == "ready"
    gets = len(h.hub.gets("/resolve/")) + len(h.hub.gets("/repos/"))
    again, began = await h.store.pull("org/tiny", "main", [], user="admin")
    assert not began and again.status is Status.READY
    assert len(h.hub.gets("/resolve/")) + len(h.hub.gets("/repos/")) == gets  # no byte fetched again


async def test_an_include_pulls_only_the_files_it_matches_and_one_that_matches_none_is_refused(h: Harness) -> None:
    record, _ = await h.store.pull("org/tiny", "main", ["*.gguf"], user=None)
    assert [f["path"] for f in (await h.settled(record.id))["files"]] == ["model.gguf"]
    with pytest.raises(InvalidInput) as refused:
        await h.store.pull("org/tiny", "main", ["*.safetensors"], user=None)
    assert refused.value.field == "include"
    for repo in ("../evil", "org/../x", "/abs/x", "org"):
        with pytest.raises(InvalidInput) as bad:
            await h.store.pull(repo, "main", [], user=None)
        assert bad.value.field == "repo"


async def test_bytes_that_do_not_match_the_hubs_sha256_fail_the_pull_naming_the_file_and_are_not_kept(
    h: Harness,
) -> None:
    h.hub.repos["org/tiny"].corrupt.add("model.gguf")
    record, _ = await h.store.pull("org/tiny", "main", [], user=None)
    view = await h.settled(record.id)
    assert view["status"] == "failed"
    assert "model.gguf" in view["error"] and "SHA-256" in view["error"]
    blobs = h.tmp / "models" / "models--org--tiny" / "blobs"
    assert not (blobs / hashlib.sha256(WEIGHTS).hexdigest()).exists()
    assert not list(blobs.glob("*.incomplete"))


async def test_too_little_space_fails_insufficient_storage_before_any_byte(hub: FakeHub, tmp_path: Path) -> None:
    h = Harness(hub, tmp_path, reserve_gib=1e9)
    hub.add("org/tiny", {"model.gguf": WEIGHTS})
    record, _ = await h.store.pull("org/tiny", "main", [], user=None)
    view = await h.settled(record.id)
    assert view["status"] == "failed" and view["error"].startswith("insufficient_storage:")
    assert "GiB remain to download" in view["error"] and "GiB free" in view["error"]
    assert hub.gets("model.gguf") == []
    h.db.close()


async def test_a_hub_that_sends_nothing_fails_the_pull_after_the_stall_timeout_and_it_can_be_retried(
    h: Harness,
) -> None:
    h.hub.repos["org/tiny"].stall_after["model.gguf"] = 0
    record, _ = await h.store.pull("org/tiny", "main", ["*.gguf"], user=None)
    view = await h.settled(record.id)
    assert view["status"] == "failed" and "stalled" in view["error"]
    h.hub.repos["org/tiny"].stall_after.clear()
    again, began = await h.store.pull("org/tiny", "main", ["*.gguf"], user=None)
    assert began
    assert (await h.settled(again.id))["status"] == "ready"


async def test_a_hub_that_stalls_in_the_middle_of_a_file_fails_after_one_stall_timeout_and_resumes_when_pulled_again(
    h: Harness,
) -> None:
    """huggingface_hub tries a read that timed out again, five times once bytes had arrived: the
    stall guard refuses those retries, so the transfer is asked for once, not six times."""
    h.hub.repos["org/tiny"].stall_after["model.gguf"] = 10 * CHUNK
    record, _ = await h.store.pull("org/tiny", "main", ["*.gguf"], user=None)
    view = await h.settled(record.id)
    assert view["status"] == "failed" and "sent nothing for 1 s (stalled)" in view["error"], view
    assert [s.origin for s in h.hub.gets("model.gguf")] == ["hub", "cdn"]  # one transfer, no retry
    assert view["bytes_done"] >= 10 * CHUNK  # what arrived is kept
    h.hub.repos["org/tiny"].stall_after.clear()
    again, began = await h.store.pull("org/tiny", "main", ["*.gguf"], user=None)
    assert began and (await h.settled(again.id))["status"] == "ready"
    assert h.hub.gets("model.gguf")[-1].range == f"bytes={view['bytes_done']}-"


@pytest.mark.parametrize(("policy", "left"), [("release", 0), ("keep", len(WEIGHTS))])
async def test_a_pulled_files_pages_leave_the_page_cache_where_the_policy_releases_them(
    hub: FakeHub, on_disk: Path, policy: str, left: int
) -> None:
    """Issue 40 item 2: a download written to the disk leaves the page cache at once on unified
    memory (CUDA counts cached pages as used); with ``page_cache = "keep"`` it stays, as mincore
    shows (the models directory is on a disk here: on tmpfs the pages are the file)."""
    h = Harness(hub, on_disk / policy, release=PageCache(policy, "meminfo").release_files)
    hub.add("org/tiny", {"model.gguf": WEIGHTS})
    record, _ = await h.store.pull("org/tiny", "main", [], user=None)
    view = await h.settled(record.id)
    blob = Path(view["path"]) / "model.gguf"
    assert cached_bytes([blob]) == (left, len(WEIGHTS))
    await h.store.close()
    h.db.close()


@pytest.mark.bounded
async def test_a_restart_resumes_a_pull_that_was_downloading(h: Harness) -> None:
    h.hub.repos["org/tiny"].stall_after["model.gguf"] = 10 * CHUNK
    record, _ = await h.store.pull("org/tiny", "main", ["*.gguf"], user=None)
    for _ in range(100):
        if h.store.get(record.id).bytes_done >= 10 * CHUNK:
            break
        await asyncio.sleep(0.05)
    # a tick's progress event while the transfer stands still
    await wait_until(
        lambda: [e for e in h.seen() if e["status"] == "downloading" and 0 < e["bytes_done"] < len(WEIGHTS)]
    )
    h.hub.repos["org/tiny"].stall_after.clear()
    await h.store.close()  # a shutdown mid-transfer: the record stays downloading
    h.store = h.open()
    assert h.store.get(record.id).status is Status.DOWNLOADING
    h.store.resume()
    assert (await h.settled(record.id))["status"] == "ready"
    assert h.hub.gets("model.gguf")[-1].range == f"bytes={10 * CHUNK}-"


async def test_a_gated_repo_needs_hub_token_file_and_the_token_appears_nowhere(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("org/gated", {"model.gguf": WEIGHTS}, token=TOKEN)
    h = Harness(hub, tmp_path)
    record, _ = await h.store.pull("org/gated", "main", [], user=None)
    view = await h.settled(record.id)
    assert view["status"] == "failed" and "hub_token_file" in view["error"]
    (tmp_path / "token").write_text(TOKEN + "\n")
    h.settings.hub_token_file = tmp_path / "token"
    h.store = h.open()
    record, _ = await h.store.pull("org/gated", "main", [], user=None)
    assert (await h.settled(record.id))["status"] == "ready"
    assert TOKEN not in json.dumps(h.seen()) + json.dumps(h.store.get(record.id).view())
    assert TOKEN not in json.dumps(h.db.list_audit(100)) + json.dumps(h.db.list_events(100))
    h.db.close()


async def test_an_unknown_repository_or_revision_fails_with_the_hubs_404(h: Harness) -> None:
    record, _ = await h.store.pull("org/missing", "main", [], user=None)
    assert "not found" in (record.error or "") and "404" in (record.error or "")
    record, _ = await h.store.pull("org/tiny", "nope", [], user=None)
    assert record.status is Status.FAILED and "revision 'nope'" in (record.error or "")


async def test_a_hub_url_that_is_no_hub_fails_the_pull_saying_so(h: Harness) -> None:
    """A server that answers 200 with JSON that is no model's information (a misnamed
    ``hub_url``): the pull fails with a message, never an exception out of the API (a 500)."""
    other = Engine()  # answers {"ok": true} to every request
    try:
        h.store.source = HubSource(other.url, None, 1, [])
        record, _ = await h.store.pull("org/tiny", "main", [], user=None)
    finally:
        other.stop()
    assert record.status is Status.FAILED
    assert (
        record.error == f"{other.url} answered with no model information for org/tiny@main: is [models] hub_url a hub?"
    )


async def test_delete_removes_the_files_no_other_model_shares_and_is_refused_while_in_use(h: Harness) -> None:
    whole, _ = await h.store.pull("org/tiny", "main", [], user=None)
    gguf, _ = await h.store.pull("org/tiny", "main", ["*.gguf"], user=None)
    await h.settled(whole.id)
    await h.settled(gguf.id)
    h.users = ["chat"]
    with pytest.raises(ModelInUse):
        await h.store.delete(whole.id, user=None)
    h.users = []
    await h.store.delete(whole.id, user=None)
    snapshot = Path(h.store.get(gguf.id).path or "")
    assert (snapshot / "model.gguf").read_bytes() == WEIGHTS  # shared with the other model: kept
    assert not (snapshot / "sub" / "config.json").exists()
    blobs = h.tmp / "models" / "models--org--tiny" / "blobs"
    assert sorted(p.name for p in blobs.iterdir()) == [hashlib.sha256(WEIGHTS).hexdigest()]
    assert [m.id for m in h.store.all()] == [gguf.id]


async def test_two_pulls_of_one_model_at_once_download_it_once(h: Harness) -> None:
    (first, began_a), (second, began_b) = await asyncio.gather(
        h.store.pull("org/tiny", "main", ["*.gguf"], user=None), h.store.pull("org/tiny", "main", ["*.gguf"], user=None)
    )
    assert first.id == second.id and sorted([began_a, began_b]) == [False, True]
    assert (await h.settled(first.id))["status"] == "ready"
    assert [s.origin for s in h.hub.gets("model.gguf")] == ["hub", "cdn"]  # one redirect, one transfer


async def test_a_ready_model_stays_ready_when_the_hub_cannot_be_asked(h: Harness) -> None:
    record, _ = await h.store.pull("org/tiny", "main", [], user=None)
    await h.settled(record.id)
    h.hub.close()
    again, began = await h.store.pull("org/tiny", "main", [], user=None)
    assert not began and again.status is Status.READY and again.error is None


async def test_a_deployers_question_gets_the_local_file_once_the_pull_of_its_name_is_done(h: Harness) -> None:
    model = "hf://org/tiny/model.gguf"
    assert h.store.readiness_of(model).status is None and not h.store.readiness_of(model).downloading
    await h.store.fetch(model, user=None)
    await h.settled(h.store.all()[0].id)
    ready = h.store.readiness_of(model)
    assert ready.status is Status.READY and ready.path is not None
    assert Path(ready.path).read_bytes() == WEIGHTS
    with pytest.raises(InvalidInput) as missing:
        await h.store.fetch("hf://org/tiny/absent.gguf", user=None)
    assert missing.value.field == "model" and "has no file absent.gguf" in missing.value.message


async def test_a_snapshot_entry_that_points_out_of_the_models_directory_is_refused(h: Harness) -> None:
    outside = h.tmp / "outside.gguf"
    outside.write_bytes(WEIGHTS)
    commit = h.hub.repos["org/tiny"].commit
    entry = h.tmp / "models" / "models--org--tiny" / "snapshots" / commit / "model.gguf"
    entry.parent.mkdir(parents=True)
    entry.symlink_to(outside)
    record, _ = await h.store.pull("org/tiny", "main", ["*.gguf"], user=None)
    view = await h.settled(record.id)
    assert view["status"] == "failed" and "points outside the models directory" in view["error"]
    assert outside.read_bytes() == WEIGHTS and h.hub.gets("model.gguf") == []


@pytest.mark.bounded
async def test_a_shutdown_does_not_wait_for_a_transfer_blocked_on_a_silent_hub(hub: FakeHub, tmp_path: Path) -> None:
    h = Harness(hub, tmp_path, stall_timeout_s=30)
    hub.add("org/tiny", {"model.gguf": WEIGHTS}).stall_after["model.gguf"] = 10 * CHUNK
    record, _ = await h.store.pull("org/tiny", "main", [], user=None)
    for _ in range(100):
        if h.store.get(record.id).bytes_done >= 10 * CHUNK:
            break
        await asyncio.sleep(0.05)
    began = time.monotonic()
    await h.store.close()
    assert (
        time.monotonic() - began < (CLOSE_WAIT_S + 30) / 2
    )  # well short of the silent hub's 30 s: it did not wait for it
    assert h.store.get(record.id).status is Status.DOWNLOADING
    hub.repos["org/tiny"].stall_after.clear()
    hub.released.set()
    h.store = h.open()
    h.store.resume()
    assert (await h.settled(record.id))["status"] == "ready"
    await h.store.close()
    h.db.close()
