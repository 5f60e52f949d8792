"""A hostile hub against the model store (issue 47 items 6 and 7), in-process against the local hub
(tests/hub) with the Hub's client reading in small pieces: a file is cut at its listed size and
not kept, a size that is no file's refuses the pull before any byte, the free-space reserve is
checked as bytes arrive, and a redirect goes only to the hub's own origin and the hosts of
``[models] redirect_hosts``."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from huggingface_hub import constants

from dgxmm.modelstore import pull
from dgxmm.modelstore.hosts import AllowedHosts
from dgxmm.modelstore.source import MAX_FILE_BYTES, HubSource, Oversized, RemoteFile, SourceError
from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import MISSING, Bystander, FakeHub
from unit.test_modelstore import CHUNK, WEIGHTS, Harness

GIB = 1024**3


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hub's client writes what it reads in pieces of this size (10 MB by default)."""
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)


@pytest.fixture
def bystander() -> Iterator[Bystander]:
    server = Bystander("127.0.0.2").start()
    try:
        yield server
    finally:
        server.close()


def blobs(tmp: Path, repo: str) -> list[Path]:
    folder = tmp / "models" / f"models--{repo.replace('/', '--')}" / "blobs"
    return sorted(folder.iterdir()) if folder.exists() else []


async def settled(harness: Harness, record_id: str) -> dict[str, Any]:
    view = await harness.settled(record_id)
    await harness.store.close()
    harness.db.close()
    return view


def test_the_hub_sending_more_than_it_lists_is_cut_at_the_listed_size(hub: FakeHub, tmp_path: Path) -> None:
    """The writer refuses the piece that would pass the size: the partial file holds exactly the
    listed bytes when the transfer ends, none past them (the finding: 73 MB for 1,000 listed)."""
    hub.add("evil/grows", {"model.gguf": WEIGHTS}, grows={"model.gguf": 10 * CHUNK})
    source = HubSource(hub.url, None, 5, hub.redirect_hosts)
    listing = source.listing("evil/grows", "main")
    partial = tmp_path / "model.gguf.incomplete"
    announced: list[int] = []
    with pytest.raises(Oversized, match=f"model.gguf: the hub sent more than the {len(WEIGHTS)} bytes it lists"):
        source.fetch("evil/grows", listing.commit, listing.files[0], partial, announced.append)
    assert partial.stat().st_size == len(WEIGHTS) == sum(announced)


def test_a_resume_answered_with_the_whole_file_starts_over_and_counts_its_bytes_once(
    hub: FakeHub, tmp_path: Path
) -> None:
    """A range request answered 200 with the whole file: the Hub's client truncates what was
    there and writes it all; the bytes announced add up to the file, the part taken back among
    them, so a pull's progress never passes its total."""
    hub.add("org/tiny", {"model.gguf": WEIGHTS}, whole={"model.gguf"})
    source = HubSource(hub.url, None, 5, hub.redirect_hosts)
    listing = source.listing("org/tiny", "main")
    partial = tmp_path / "model.gguf.incomplete"
    partial.write_bytes(WEIGHTS[: 10 * CHUNK])
    announced: list[int] = []
    source.fetch("org/tiny", listing.commit, listing.files[0], partial, announced.append)
    assert partial.read_bytes() == WEIGHTS and hub.gets("model.gguf")[-1].range == f"bytes={10 * CHUNK}-"
    assert announced[0] == -10 * CHUNK and 10 * CHUNK + sum(announced) == len(WEIGHTS)


async def test_a_file_that_grows_past_its_listed_size_fails_the_pull_and_is_not_kept(
    hub: FakeHub, tmp_path: Path
) -> None:
    hub.add("evil/grows", {"model.gguf": WEIGHTS}, grows={"model.gguf": 1000 * CHUNK})
    h = Harness(hub, tmp_path)
    record, _ = await h.store.pull("evil/grows", "main", [], user=None)
    view = await settled(h, record.id)
    assert view["status"] == "failed" and "sent more than the 102400 bytes it lists" in view["error"], view
    assert view["bytes_done"] == 0 and blobs(tmp_path, "evil/grows") == []


@pytest.mark.parametrize(
    ("listed", "shown"),
    [(-5, "-5"), (MISSING, "None"), (MAX_FILE_BYTES + 1, str(MAX_FILE_BYTES + 1)), (1.5, "1.5"), ("100", "'100'")],
)
async def test_a_size_that_is_no_files_refuses_the_pull_before_any_byte(
    hub: FakeHub, tmp_path: Path, listed: object, shown: str
) -> None:
    """A sibling listed at a negative size once made the pull's total negative and passed the
    space check; a missing, fractional or absurd one is as much a lie."""
    hub.add("evil/sizes", {"model.gguf": WEIGHTS, "config.json": b"{}"}, listed={"config.json": listed})
    h = Harness(hub, tmp_path)
    record, _ = await h.store.pull("evil/sizes", "main", ["*.gguf"], user=None)
    assert record.status.value == "failed"
    assert record.error == f"the hub lists config.json in evil/sizes at {shown} bytes, which is no file's size " + (
        f"(0 to {MAX_FILE_BYTES}): not pulled"
    )
    assert hub.gets("/resolve/") == [] and hub.gets("/repos/") == []
    await h.store.close()
    h.db.close()


async def test_the_reserve_is_checked_as_bytes_arrive_and_the_part_is_kept_for_a_later_pull(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer fills the disk during the transfer (the disk's free space as ``statvfs``
    reports it, made to fall after ten pieces): the pull fails ``insufficient_storage`` before the
    piece that would cross the reserve is written, keeps what it has, and resumes from it."""
    real = shutil.disk_usage
    asked = [0]

    def filling(path: Any) -> Any:
        asked[0] += 1
        free = 10 * GIB if asked[0] <= 10 else GIB + CHUNK - 1  # (the first is the check before any byte)
        return real(path)._replace(free=free)

    monkeypatch.setattr(pull.shutil, "disk_usage", filling)
    hub.add("org/tiny", {"model.gguf": WEIGHTS})
    h = Harness(hub, tmp_path, reserve_gib=1)
    record, _ = await h.store.pull("org/tiny", "main", [], user=None)
    view = await h.settled(record.id)
    assert view["status"] == "failed" and view["error"].startswith("insufficient_storage: "), view
    assert "under [models] reserve_gib = 1 GiB; the part downloaded is kept" in view["error"]
    (partial,) = blobs(tmp_path, "org/tiny")
    assert partial.name.endswith(".incomplete") and partial.stat().st_size == 9 * CHUNK == view["bytes_done"]
    monkeypatch.setattr(pull.shutil, "disk_usage", real)
    h.settings.reserve_gib = 0
    again, began = await h.store.pull("org/tiny", "main", [], user=None)
    assert began and (await settled(h, again.id))["status"] == "ready"
    assert hub.gets("model.gguf")[-1].range == f"bytes={9 * CHUNK}-"


@pytest.mark.parametrize("what", ["model.gguf", "info"])
async def test_a_redirect_to_another_host_fails_the_pull_without_being_followed(
    hub: FakeHub, bystander: Bystander, tmp_path: Path, what: str
) -> None:
    """The file's ``resolve`` (or the model info) answered with a 302 to a server on another
    address: the pull fails naming where, and that server is never asked."""
    hub.add("evil/redirects", {"model.gguf": WEIGHTS}, redirect={what: f"{bystander.url}/api/host?sig=secret"})
    h = Harness(hub, tmp_path)
    record, _ = await h.store.pull("evil/redirects", "main", [], user=None)
    view = await settled(h, record.id)
    assert view["status"] == "failed"
    where = f"the hub redirected to {bystander.url}, which is neither the hub's host nor one of [models] redirect_hosts"
    assert where in view["error"] and "secret" not in view["error"], view
    assert view["error"].startswith("model.gguf: " if what != "info" else "the hub")
    assert bystander.seen == []


async def test_a_redirect_to_a_listed_host_is_followed(hub: FakeHub, bystander: Bystander, tmp_path: Path) -> None:
    """The hosts of ``redirect_hosts`` are where the storage answers: there a redirect goes."""
    hub.add("org/elsewhere", {"config.json": b"{}"}, redirect={"config.json": f"{bystander.url}/file"})
    listed = [*hub.redirect_hosts, bystander.url.removeprefix("http://")]
    source = HubSource(hub.url, None, 5, listed)
    listing = source.listing("org/elsewhere", "main")
    file = RemoteFile("config.json", 2, None, listing.files[0].blob)
    source.fetch("org/elsewhere", listing.commit, file, tmp_path / "part", lambda n: None)
    assert (tmp_path / "part").read_bytes() == b"ok" and bystander.seen == ["/file"]
    with pytest.raises(SourceError, match="not followed"):
        HubSource(hub.url, None, 5, hub.redirect_hosts).fetch(
            "org/elsewhere", listing.commit, file, tmp_path / "again", lambda n: None
        )


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://huggingface.co/org/m/resolve/main/x", True),  # the hub's origin
        ("https://huggingface.co:444/x", False),
        ("http://huggingface.co/x", False),
        ("https://cdn-lfs-us-1.hf.co/repos/x", True),
        ("https://cas-bridge.xethub.hf.co/x", True),
        ("https://hf.co.evil.example/x", False),
        ("https://evilhf.co/x", False),
        ("https://cdn.hf.co:8443/x", False),
        ("https://storage.example:9000/x", True),
        ("https://storage.example/x", False),
        ("http://127.0.0.1:8080/dgxmm/api/host", False),
    ],
)
def test_allowed_hosts_match_the_hubs_origin_hosts_ports_and_domains(url: str, allowed: bool) -> None:
    hosts = AllowedHosts.of("https://huggingface.co", ["*.hf.co", "*.huggingface.co", "storage.example:9000"])
    assert hosts.allows(httpx2.URL(url)) is allowed


async def test_the_hosts_allowance_is_the_calls_own(hub: FakeHub, tmp_path: Path) -> None:
    """Two sources at once, each on its own thread, each with its own allowance."""
    hub.add("org/tiny", {"model.gguf": WEIGHTS})
    allowed = HubSource(hub.url, None, 5, hub.redirect_hosts)
    refused = HubSource(hub.url, None, 5, [])
    listing = allowed.listing("org/tiny", "main")
    commit, file = listing.commit, listing.files[0]

    def fetch(source: HubSource, name: str) -> str:
        try:
            source.fetch("org/tiny", commit, file, tmp_path / name, lambda n: None)
        except SourceError as exc:
            return str(exc)
        return "fetched"

    results = await asyncio.gather(asyncio.to_thread(fetch, allowed, "a"), asyncio.to_thread(fetch, refused, "b"))
    assert results[0] == "fetched" and "not followed" in results[1]
