"""What a start says of its load (issue 40 item 4): how much of the model's files the page cache
held as it began (``pagecache.cached_fraction``, counted by ``CacheCount`` in a thread beside the
start) and how long the launch took, reported to the metrics, which give both to the activity row
of a request that waited for it. The count never holds up the start: one not done when the
engine is ready is unknown (null) and stops. Threads are held by gates, not timed."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from conftest import wait_until
from unit.ondemand_harness import harness
from unit.test_pagecache import cached, on_disk, written  # noqa: F401 (fixture: on_disk)

from dgxmm.deploy import starts
from dgxmm.deploy.pagecache import CacheCount, cached_fraction, drop
from dgxmm.gateway.exchange import Exchange
from dgxmm.records.deployment import State

pytestmark = pytest.mark.timeout(30)
MIB = 1024**2


def half_cached(path: Path) -> Path:
    """A 16 MiB model file of which exactly the first 8 MiB are in the page cache."""
    written(path, 16)
    drop([path])
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # (no readahead: exactly what is read is cached)
        os.pread(fd, 8 * MIB, 0)
    finally:
        os.close(fd)
    assert cached(path) == 8 * MIB
    return path


def test_the_cached_fraction_of_a_model(on_disk: Path) -> None:  # noqa: F811
    model = half_cached(on_disk / "m.gguf")
    assert cached_fraction(str(model)) == 0.5
    written(on_disk / "other.gguf", 1)
    assert cached_fraction(str(on_disk / "other.gguf")) == 1.0
    (on_disk / "empty.gguf").write_bytes(b"")
    for unknown in ("org/model", "", str(on_disk / "gone.gguf"), str(on_disk / "empty.gguf"), "/dev/zero"):
        assert cached_fraction(unknown) is None, unknown
    assert cached_fraction(str(model), stopped=lambda: True) is None  # given up: unknown, not 0


def waiting_for(deployment_id: str, arrival: float, slot_at: float) -> Exchange:
    """A request that waited for the deployment's start from ``arrival`` to ``slot_at``."""
    ex = Exchange(arrival, "r", "p")
    ex.deployment_id, ex.cold, ex.slot_at = deployment_id, True, slot_at
    return ex


async def test_a_start_reports_its_load_and_how_much_was_cached(
    tmp_path: Path,
    on_disk: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = half_cached(on_disk / "m.gguf")
    counts: list[CacheCount] = []

    class Seen(CacheCount):
        def __init__(self, *args: object, **kw: object) -> None:
            # The count's own time limit is the next test's: here a loaded machine, which may not
            # schedule the count's thread for seconds, must not reach it (seen once: None, not 0.5).
            super().__init__(*args, **{**kw, "limit_s": 600.0})  # type: ignore[arg-type]
            counts.append(self)

    monkeypatch.setattr(starts, "CacheCount", Seen)
    async with harness(tmp_path) as h:
        await h.add("m", 2, model=str(model))
        arrival = h.clock()
        h.deployer.restart("m", actor="test")
        await h.deployer.starting("m")
        await wait_until(lambda: counts and counts[0].done(), timeout=10)
        h.clock.advance(3)
        await h.ready("m")
        load = h.metrics.load_waited_for(waiting_for("m", arrival, h.clock()))
        assert load is not None and load.cached_fraction == 0.5 and load.seconds >= 0


async def test_a_count_not_done_when_the_engine_is_ready_is_unknown_and_stops(
    tmp_path: Path,
    on_disk: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The count's clock is held inside the thread (it is read before each window): the engine
    becomes ready meanwhile, the start reports an unknown share at once, and the count, let go,
    stops instead of finishing."""
    model = half_cached(on_disk / "m.gguf")
    entered, hold = threading.Event(), threading.Event()
    reads = 0

    def held_clock() -> float:
        nonlocal reads
        reads += 1
        if reads > 1:  # (the first reading is the limit's, on the loop)
            entered.set()
            hold.wait(10)
        return 0.0

    counts: list[CacheCount] = []

    class Held(CacheCount):
        def __init__(self, model: str) -> None:
            super().__init__(model, clock=held_clock)
            counts.append(self)

    monkeypatch.setattr(starts, "CacheCount", Held)
    try:
        async with harness(tmp_path) as h:
            await h.add("m", 2, model=str(model))
            arrival = h.clock()
            h.deployer.restart("m", actor="test")
            await h.deployer.starting("m")
            await wait_until(entered.is_set, timeout=10)
            await h.ready("m")  # (the count still held: the start did not wait for it)
            assert h.state("m") is State.READY and not counts[0].done()
            load = h.metrics.load_waited_for(waiting_for("m", arrival, h.clock()))
            assert load is not None and load.cached_fraction is None
            hold.set()
            await wait_until(counts[0].done, timeout=10)
            assert counts[0].result() is None and reads == 2  # stopped at its first window
    finally:
        hold.set()
