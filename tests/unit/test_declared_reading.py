"""One reading of the declared files at a time (dgxmm.declared.reading), shared by the watcher
and ``GET /api/config/plan``, and a watcher that no error kills (issue 47: the plan started a
second parse of files the watcher was parsing, and a crash of the parser restarted the watcher
with a traceback each time)."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from unit.test_declared_apply import Host, host  # noqa: F401 (the fixture)
from unit.test_declared_watch import files, names, table  # noqa: F401 (the fixture)

from dgxmm.declared import reading
from dgxmm.declared.parse import Declaration, Sources
from dgxmm.declared.plan import Plan
from dgxmm.declared.watch import Declared


class Parses:
    """``parse.read`` counted, each held until ``release`` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.release = threading.Event()
        self.started = 0
        self.running = 0
        self.most = 0
        self._lock = threading.Lock()
        real = reading.read

        def read(sources: Sources) -> tuple[Declaration, ...]:
            with self._lock:
                self.started += 1
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                assert self.release.wait(10)
                return real(sources)
            finally:
                with self._lock:
                    self.running -= 1

        monkeypatch.setattr(reading, "read", read)


async def test_a_plan_asked_while_the_files_are_read_waits_for_that_reading_and_parses_nothing(
    files: tuple[Declared, Path],  # noqa: F811
    host: Host,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared, folder = files
    (folder / "a.toml").write_text(table("a"))
    parses = Parses(monkeypatch)
    first = asyncio.create_task(declared.plan_now())
    await wait_until(lambda: parses.started == 1, timeout=10)
    first.cancel()  # its client went away: the parse goes on, for the others
    reload = asyncio.create_task(declared.reload(again=False))
    plans = [asyncio.create_task(declared.plan_now()) for _ in range(3)]
    await asyncio.sleep(0.05)
    assert parses.started == 1  # (no second parse while the first runs, whatever the wait)
    parses.release.set()
    answers = await asyncio.gather(*plans)
    assert await reload and names(host) == ["a"]
    assert parses.started == 1 and parses.most == 1
    for answer in answers:  # before or after the watcher applied it
        assert answer["valid"] and answer["plan"]["unchanged"] + len(answer["plan"]["created"]) == 1, answer
    assert first.cancelled()
    (folder / "a.toml").write_text(table("a") + table("b"))
    answer = await declared.plan_now()
    assert answer["plan"]["created"][0]["name"] == "b", answer  # changed files: read again
    assert parses.started == 2


async def test_sighup_parses_files_that_look_unchanged(
    files: tuple[Declared, Path],  # noqa: F811
    host: Host,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared, folder = files
    (folder / "a.toml").write_text(table("a"))
    parses = Parses(monkeypatch)
    parses.release.set()
    assert await declared.reload() and await declared.reload(again=False)
    assert parses.started == 1
    assert await declared.reload()  # (SIGHUP and start-up: again)
    assert parses.started == 2


async def test_the_watcher_survives_an_unexpected_error_with_one_line_and_applies_once_it_is_gone(
    files: tuple[Declared, Path],  # noqa: F811
    host: Host,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    declared, folder = files
    await declared.reload()
    broken = threading.Event()
    broken.set()
    tries: list[int] = []
    real = host.applier.apply

    async def apply(declared: Any) -> Plan:
        tries.append(1)
        if broken.is_set():
            raise RuntimeError("the store is gone")
        return await real(declared)

    monkeypatch.setattr(host.applier, "apply", apply)
    caplog.set_level(logging.ERROR)
    task = asyncio.create_task(declared.run())
    try:
        (folder / "a.toml").write_text(table("a"))
        await wait_until(lambda: len(tries) >= 5, timeout=10)  # tried again at each poll
        error = declared.status()["error"]
        assert error is not None and error["message"] == "not applied: RuntimeError: the store is gone"
        assert error["file"] == str(declared.sources.config_file) and not task.done()
        lines = [r for r in caplog.records if "the store is gone" in r.getMessage()]
        assert len(lines) == 1 and lines[0].exc_info is None  # one line, no traceback
        broken.clear()
        await wait_until(lambda: names(host) == ["a"] and declared.status()["error"] is None, timeout=10)
        (folder / "a.toml").write_text(table("a") + table("b"))  # and it goes on watching
        await wait_until(lambda: names(host) == ["a", "b"], timeout=10)
    finally:
        task.cancel()


async def test_a_reading_that_fails_unexpectedly_is_the_files_error_and_the_plan_says_it(
    files: tuple[Declared, Path],  # noqa: F811
    host: Host,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared, folder = files
    (folder / "a.toml").write_text(table("a"))

    def read(sources: Sources) -> tuple[Declaration, ...]:
        raise MemoryError("no more")

    monkeypatch.setattr(reading, "read", read)
    assert not await declared.reload()
    assert declared.status()["error"]["message"] == "not applied: MemoryError: no more"
    answer = await declared.plan_now()
    assert answer["valid"] is False and answer["error"]["message"] == "not applied: MemoryError: no more"
