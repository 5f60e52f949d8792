"""A stopped engine's model files dropped from the page cache (deploy/pagecache.py): the pages of
exactly those files leave it, as ``fincore`` (util-linux) counts them; what cannot be opened or is
not a regular file is skipped and said once; the policy table."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from pathlib import Path

import pytest

from dgxmm.deploy import pagecache
from dgxmm.deploy.pagecache import PageCache, cached_bytes, drop

MIB = 1024**2


def cached(path: Path) -> int:
    """The bytes of ``path`` in the page cache now."""
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


@pytest.fixture
def on_disk(tmp_path: Path) -> Path:
    """A directory whose files have a page cache (on tmpfs the pages are the file and stay)."""
    kind = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE", "-T", str(tmp_path)], capture_output=True, text=True, check=True
    )
    if kind.stdout.strip() != "tmpfs":
        return tmp_path
    here = Path(__file__).resolve().parents[2] / "test-output" / f"pagecache-{os.getpid()}"
    here.mkdir(parents=True, exist_ok=True)
    return here


def written(path: Path, mib: int) -> Path:
    with path.open("wb") as out:
        out.write(os.urandom(mib * MIB))
        out.flush()
        os.fsync(out.fileno())  # (written back, as a model file is: the kernel drops clean pages only)
    path.read_bytes()  # (read back: every page cached)
    return path


def test_a_models_pages_leave_the_cache_and_no_other_files(on_disk: Path) -> None:
    model, other = written(on_disk / "model.gguf", 16), written(on_disk / "other.gguf", 8)
    assert cached(model) == 16 * MIB and cached(other) == 8 * MIB
    assert drop([model]) == 16 * MIB
    assert cached(model) == 0 and cached(other) == 8 * MIB


async def test_the_release_drops_every_part_of_a_split_gguf(on_disk: Path) -> None:
    parts = [written(on_disk / f"m-0000{i}-of-00002.gguf", 4) for i in (1, 2)]
    assert await PageCache("release", "declared").release(str(parts[0])) == 8 * MIB
    assert [cached(p) for p in parts] == [0, 0]


async def test_a_snapshot_directory_drops_the_weights_it_loads(on_disk: Path) -> None:
    snap = on_disk / "snap"
    snap.mkdir()
    weights, config = written(snap / "model.safetensors", 4), written(snap / "config.json", 1)
    assert await PageCache("auto", "meminfo").release(str(snap)) == 4 * MIB
    assert cached(weights) == 0 and cached(config) == MIB  # (not a weight file: not the engine's load)


@pytest.mark.parametrize(
    ("policy", "source", "releases"),
    [
        ("auto", "meminfo", True),  # unified memory: cached pages count as used
        ("auto", "nvml", False),  # discrete GPUs: the cache costs them nothing
        ("auto", "declared", False),
        ("keep", "meminfo", False),
        ("release", "nvml", True),
    ],
)
async def test_the_policy(on_disk: Path, policy: str, source: str, releases: bool) -> None:
    model = written(on_disk / "model.gguf", 4)
    assert await PageCache(policy, source).release(str(model)) == (4 * MIB if releases else 0)
    assert cached(model) == (0 if releases else 4 * MIB)


def test_what_cannot_be_dropped_is_skipped_and_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)  # (opened without blocking: no writer needed)
    gone = tmp_path / "gone.gguf"
    with caplog.at_level(logging.WARNING, logger="dgxmm.deploy.pagecache"):
        assert drop([fifo, gone, fifo, gone]) == 0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "not a regular file" in said[0] and "cannot open" in said[1], said


async def test_a_release_that_hangs_is_given_up(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A hung network volume: the stop goes on after the deadline, with nothing advised."""
    entered, hold = threading.Event(), threading.Event()

    def stuck(model: str) -> int:
        entered.set()
        hold.wait(10)
        return 1

    monkeypatch.setattr(pagecache, "_release", stuck)
    monkeypatch.setattr(pagecache, "RELEASE_TIMEOUT_S", 0.05)
    try:
        assert await PageCache("release", "meminfo").release(str(tmp_path / "m.gguf")) == 0
        assert entered.is_set()
    finally:
        hold.set()


async def test_a_model_that_names_no_local_file_releases_nothing() -> None:
    assert await PageCache("release", "meminfo").release("org/model") == 0
    assert await PageCache("release", "meminfo").release("") == 0


def test_the_cached_bytes_of_files_are_what_fincore_counts(on_disk: Path) -> None:
    model, other = written(on_disk / "model.gguf", 16), written(on_disk / "other.gguf", 3)
    drop([model])
    fd = os.open(model, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # (no readahead: exactly what is read is cached)
        os.pread(fd, 5 * MIB, 0)  # (a part of it read again)
    finally:
        os.close(fd)
    assert cached_bytes([model]) == (5 * MIB, 16 * MIB) and cached(model) == 5 * MIB
    assert cached_bytes([model, other, on_disk / "gone"]) == (cached(model) + 3 * MIB, 19 * MIB)
    empty = on_disk / "empty"
    empty.write_bytes(b"")
    assert cached_bytes([empty]) == (0, 0)
