"""The next model's weights read into the page cache while its start waits (deploy/prefetch.py):
the bound, one read at a time in order, a cancel seen within one chunk and never waited for,
memory pressure stopping a read, files that cannot be read (a device, a FIFO, no permission, one
gone mid-read: each said once), and the progress told as it goes. Interleavings are driven by a
free-memory reading that holds the reading thread at a chosen chunk: no sleeps."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import wait_until

from dgxmm.deploy.pagecache import drop
from dgxmm.deploy import prefetch
from dgxmm.deploy.prefetch import GIB, Prefetcher, allowance, read_free

CHUNK = 1024**2


def model_file(path: Path, chunks: int) -> Path:
    with path.open("wb") as out:
        out.write(os.urandom(chunks * CHUNK))
        out.flush()
        os.fsync(out.fileno())
    drop([path])
    return path


def cached(path: Path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


@pytest.mark.parametrize(
    ("free", "reservation", "unified", "allowed"),
    [
        (10 * GIB, 4 * GIB, True, 5 * GIB),  # unified: the incoming model's reservation is kept
        (10 * GIB, 4 * GIB, False, 9 * GIB),  # discrete GPUs: its memory is on the device
        (4 * GIB, 4 * GIB, True, 0),
        (GIB // 2, 0, False, 0),  # within the margin
        (None, 0, False, 0),  # unknown: nothing
    ],
)
def test_the_bound(free: int | None, reservation: int, unified: bool, allowed: int) -> None:
    assert allowance(free, reservation, unified) == allowed


def test_free_memory_is_memfree_not_the_cache(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemFree: 7 kB\nMemAvailable: 50 kB\n")
    assert read_free(tmp_path / "meminfo") == 7 * 1024
    assert read_free(tmp_path / "none") is None
    assert read_free() is not None


def plenty() -> int:
    return 64 * GIB


class Gate:
    """A free-memory reading that holds the reading thread at its ``at``-th call until released."""

    def __init__(self, at: int, then: Callable[[], int] = plenty) -> None:
        self.at, self.then, self.calls = at, then, 0
        self.reached, self.go = threading.Event(), threading.Event()

    def __call__(self) -> int:
        self.calls += 1
        if self.calls == self.at:
            self.reached.set()
            self.go.wait(10)
        return self.then()


async def test_a_waiting_models_files_are_read_into_the_cache(tmp_path: Path) -> None:
    model = model_file(tmp_path / "m.gguf", 6)
    assert cached(model) == 0
    p = Prefetcher(unified=False, free=plenty, chunk=CHUNK)
    p.want("d1", str(model), 1.0)
    await wait_until(lambda: p.read_bytes == 6 * CHUNK, timeout=10)
    assert cached(model) == 6 * CHUNK and p.progress("d1") is None


async def test_a_cancel_stops_the_read_within_a_chunk_and_does_not_wait(tmp_path: Path) -> None:
    model = model_file(tmp_path / "m.gguf", 8)
    gate = Gate(at=3)
    p = Prefetcher(unified=False, free=gate, chunk=CHUNK)
    p.want("d1", str(model), 1.0)
    await asyncio.to_thread(gate.reached.wait, 10)
    assert p.progress("d1") == (2 * CHUNK, 8 * CHUNK)
    p.cancel("d1")  # (returns with the thread still held: a start never waits for it)
    assert p.progress("d1") is None
    gate.go.set()
    await wait_until(lambda: p.read_bytes > 0, timeout=10)
    assert p.read_bytes == 3 * CHUNK  # the chunk it was about to read, and no more


async def test_memory_that_fills_up_stops_the_read(tmp_path: Path) -> None:
    model = model_file(tmp_path / "m.gguf", 8)
    readings = iter([64 * GIB, 64 * GIB] + [GIB] * 100)  # then within the margin
    p = Prefetcher(unified=False, free=lambda: next(readings), chunk=CHUNK)
    p.want("d1", str(model), 1.0)
    await wait_until(lambda: p.read_bytes > 0, timeout=10)
    assert p.read_bytes == 2 * CHUNK


async def test_models_are_read_one_at_a_time_in_the_order_they_began_to_wait(tmp_path: Path) -> None:
    a, b = model_file(tmp_path / "a.gguf", 3), model_file(tmp_path / "b.gguf", 3)
    seen: list[str | None] = []
    gate = Gate(at=2)

    def free() -> int:
        seen.append(next((d for d in ("a", "b") if p.progress(d) is not None), None))  # whose read asks
        return gate()

    p = Prefetcher(unified=False, chunk=CHUNK, free=free)
    p.want("a", str(a), 1.0)
    await asyncio.to_thread(gate.reached.wait, 10)
    p.want("b", str(b), 1.0)
    p.want("a", str(a), 1.0)  # (already being read: not again)
    assert p.progress("b") is None
    gate.go.set()
    await wait_until(lambda: p.read_bytes == 6 * CHUNK, timeout=10)
    assert seen == ["a"] * 4 + ["b"] * 4  # (a read checks once more before it finds the end)


async def test_a_cancelled_wait_that_was_not_yet_read_is_dropped(tmp_path: Path) -> None:
    a, b = model_file(tmp_path / "a.gguf", 2), model_file(tmp_path / "b.gguf", 2)
    gate = Gate(at=1)
    p = Prefetcher(unified=False, free=gate, chunk=CHUNK)
    p.want("a", str(a), 1.0)
    p.want("b", str(b), 1.0)
    await asyncio.to_thread(gate.reached.wait, 10)
    p.cancel("b")
    gate.go.set()
    await wait_until(lambda: p.read_bytes == 2 * CHUNK, timeout=10)
    await p.close()
    assert p.read_bytes == 2 * CHUNK and cached(b) == 0


async def test_what_cannot_be_read_is_not_prefetched_and_nothing_hangs(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.gguf")  # (no writer: a blocking open would hang)
    real = model_file(tmp_path / "real.gguf", 2)
    p = Prefetcher(unified=False, free=plenty, chunk=CHUNK)
    for model in (str(tmp_path / "fifo.gguf"), str(tmp_path / "gone.gguf"), "org/model", "", str(real)):
        p.want(model, model, 1.0)
    await wait_until(lambda: p.read_bytes == 2 * CHUNK, timeout=10)  # (in order: the others came first)
    await p.close()
    assert p.read_bytes == 2 * CHUNK


async def test_progress_is_told_at_the_first_chunk_then_at_most_once_a_second_and_at_the_end(tmp_path: Path) -> None:
    """The reading thread's clock, moved by hand per chunk: told at the first chunk (0 s), at the
    chunks the clock passed a second since (1.0 s, 2.5 s), and once more when the read ended, by
    which time there is no progress to show. (What is shown is the progress when the loop gets to
    it: the thread reads on meanwhile.)"""
    model = model_file(tmp_path / "m.gguf", 8)
    times = iter([0.0, 0.2, 0.9, 1.0, 1.5, 1.9, 2.5, 3.0])  # one reading per chunk read
    told: list[tuple[int, int] | None] = []
    p = Prefetcher(
        unified=False,
        free=plenty,
        chunk=CHUNK,
        clock=lambda: next(times),
        on_progress=lambda i: told.append(p.progress(i)),
    )
    p.want("d1", str(model), 1.0)
    await wait_until(lambda: p.read_bytes == 8 * CHUNK, timeout=10)
    await wait_until(lambda: told and told[-1] is None, timeout=10)
    assert [t is not None and t[1] == 8 * CHUNK for t in told] == [True, True, True, False]


async def test_a_read_that_never_began_tells_nothing(tmp_path: Path) -> None:
    told: list[str] = []
    p = Prefetcher(unified=False, free=lambda: 0, chunk=CHUNK, on_progress=told.append)  # no free memory: not one chunk
    p.want("d1", str(model_file(tmp_path / "m.gguf", 2)), 1.0)
    p.want("d2", "org/model", 1.0)
    await p.close()
    assert told == [] and p.read_bytes == 0


async def test_a_device_or_a_fifo_named_as_the_model_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a file to read: nothing read, a warning once per path; a path that is not there (a hub
    name, a path only a container sees) is no fault, and not said."""
    monkeypatch.setattr(prefetch, "_warned", set())
    os.mkfifo(tmp_path / "fifo.gguf")
    last = model_file(tmp_path / "real.gguf", 1)  # (read last: the ones before it are done)
    p = Prefetcher(unified=False, free=plenty, chunk=CHUNK)
    with caplog.at_level(logging.WARNING, logger="dgxmm.deploy.prefetch"):
        for model in ("/dev/zero", str(tmp_path / "fifo.gguf"), "/dev/zero", str(tmp_path / "gone.gguf"), "org/m"):
            p.want(model + str(len(p._waiting)), model, 1.0)
        p.want("last", str(last), 1.0)
        await wait_until(lambda: p.read_bytes == CHUNK, timeout=10)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "/dev/zero is not prefetched: not a regular file",
        f"{tmp_path}/fifo.gguf is not prefetched: not a regular file",
    ]


def open_files() -> set[Path]:
    """The files this process has open now."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # (one closed meanwhile)
            found.add(Path(os.readlink(f"/proc/self/fd/{fd}")))
    return found


async def test_a_file_gone_while_its_model_is_read_is_said_once_and_the_read_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot's second file removed while the first is read (held at its first chunk)."""
    monkeypatch.setattr(prefetch, "_warned", set())
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    files = {model_file(snapshot / "a.safetensors", 2), model_file(snapshot / "b.safetensors", 2)}
    gate = Gate(at=1)
    p = Prefetcher(unified=False, free=gate, chunk=CHUNK)
    with caplog.at_level(logging.WARNING, logger="dgxmm.deploy.prefetch"):
        p.want("d", str(snapshot), 1.0)
        await asyncio.to_thread(gate.reached.wait, 10)
        assert p.progress("d") == (0, 4 * CHUNK)
        (first,) = files & open_files()
        (second,) = files - {first}  # (not opened yet: a snapshot's files are read in the listing's order)
        second.unlink()
        gate.go.set()
        await wait_until(lambda: p.read_bytes > 0, timeout=10)
    assert p.read_bytes == 2 * CHUNK and cached(first) == 2 * CHUNK
    assert [r.getMessage() for r in caplog.records] == [
        f"{second} is not prefetched: cannot open it (No such file or directory)"
    ]


CHILD = """
import asyncio, logging, sys, time
from dgxmm.deploy.prefetch import Prefetcher

async def main() -> None:
    p = Prefetcher(unified=False, free=lambda: 64 * 1024**3, chunk=1024**2)
    *models, last = sys.argv[1:]
    for i, model in enumerate([*models, *models, last]):
        p.want(str(i), model, 1.0)
    deadline = time.monotonic() + 10
    while p.read_bytes == 0 and time.monotonic() < deadline:  # (the last is read after the others)
        await asyncio.sleep(0.01)
    print(p.read_bytes)

logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
asyncio.run(main())
"""


def test_files_its_user_may_not_read_are_said_once_and_the_rest_is_read(tmp_path: Path) -> None:
    """Permissions: a model file and a snapshot directory dgxmm's user may not read. Root reads
    every file, so when the tests run as root the prefetcher runs in a child process without the
    capabilities that override file modes (still root: the clone and its venv may lie under a
    directory only root may enter, as a mktemp directory is)."""
    import tempfile

    place = Path(tempfile.mkdtemp(prefix="dgxmm-perm-", dir="/tmp"))
    try:
        place.chmod(0o755)
        secret, snapshot, real = place / "secret.gguf", place / "snapshot", place / "real.gguf"
        secret.write_bytes(b"x" * CHUNK)
        secret.chmod(0o000)
        snapshot.mkdir(mode=0o000)
        real.write_bytes(b"y" * 3 * CHUNK)
        real.chmod(0o644)
        unprivileged = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
        out = subprocess.run(
            [*unprivileged, sys.executable, "-c", CHILD, str(secret), str(snapshot), str(real)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            cwd="/",
        )
        assert out.stdout.splitlines() == [
            f"{secret} is not prefetched: cannot open it (Permission denied)",
            f"{snapshot} is not prefetched: cannot list it (Permission denied)",
            str(3 * CHUNK),
        ], out.stderr
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(place)], check=False)
        shutil.rmtree(place, ignore_errors=True)
