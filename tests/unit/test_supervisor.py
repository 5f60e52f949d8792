"""The supervisor: a failing background task is logged with its traceback, recorded as an event,
restarted with a growing backoff and shown in the health list; a task that returns is forgotten."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from conftest import wait_until

from dgxmm.supervisor import Supervisor


class Events:
    def __init__(self, fail: bool = False) -> None:
        self.rows: list[tuple[str, str | None, str]] = []
        self.fail = fail

    def event(self, actor: str, deployment_id: str | None, text: str) -> Any:
        if self.fail:
            raise OSError("database is locked")
        self.rows.append((actor, deployment_id, text))


class Flaky:
    """A task body that raises ``failures`` times, then runs until cancelled."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.running = asyncio.Event()

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError(f"boom {self.calls}")
        self.running.set()
        await asyncio.Event().wait()


async def test_a_failing_task_is_logged_recorded_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    events = Events()
    sup = Supervisor(events, initial_backoff_s=0.01, max_backoff_s=0.04)
    task = Flaky(failures=3)
    with caplog.at_level(logging.ERROR, logger="dgxmm.supervisor"):
        sup.start("sampler", task, deployment_id="d1")
        await asyncio.wait_for(task.running.wait(), 10)
    assert task.calls == 4
    failures = [r for r in caplog.records if "background task sampler failed" in r.getMessage()]
    assert len(failures) == 3 and all(r.exc_info and r.exc_info[0] is RuntimeError for r in failures)
    assert [row[2] for row in events.rows] == [
        "Background task sampler failed: RuntimeError: boom 1; restarting in 0.01 s",
        "Background task sampler failed: RuntimeError: boom 2; restarting in 0.02 s",
        "Background task sampler failed: RuntimeError: boom 3; restarting in 0.04 s",
    ]
    assert {row[:2] for row in events.rows} == {("supervisor", "d1")}
    [health] = sup.health()
    assert health["name"] == "sampler" and health["running"] and health["restarts"] == 3
    assert health["last_error"] == "RuntimeError: boom 3" and health["last_error_at"] > 0
    await sup.close()
    assert sup.health() == []


async def test_the_backoff_starts_over_after_a_healthy_run() -> None:
    events = Events()
    sup = Supervisor(events, initial_backoff_s=0.01, max_backoff_s=10, healthy_after_s=0.0)
    task = Flaky(failures=3)
    sup.start("reaper", task)
    await asyncio.wait_for(task.running.wait(), 10)
    assert all(text.endswith("restarting in 0.01 s") for _, _, text in events.rows)
    await sup.close()


async def test_a_broken_event_store_does_not_stop_the_restart(caplog: pytest.LogCaptureFixture) -> None:
    sup = Supervisor(Events(fail=True), initial_backoff_s=0.01)
    task = Flaky(failures=2)
    sup.start("litellm-sync", task)
    await asyncio.wait_for(task.running.wait(), 10)
    assert "cannot record the failure of litellm-sync" in caplog.text
    await sup.close()


async def test_a_task_that_returns_is_forgotten() -> None:
    sup = Supervisor(Events())
    done = asyncio.Event()

    async def once() -> None:
        done.set()

    sup.start("watchdog-x", once)
    await done.wait()
    await wait_until(lambda: sup.health() == [])


async def test_stop_cancels_and_stop_from_inside_only_forgets() -> None:
    sup = Supervisor(Events())
    task = Flaky(failures=0)
    sup.start("a", task)
    await task.running.wait()
    sup.stop("a")
    assert sup.names() == []
    finished = asyncio.Event()

    async def stops_itself() -> None:
        sup.stop("b")  # like a watchdog whose deployer.fail unwatches it
        await asyncio.sleep(0)
        finished.set()

    sup.start("b", stops_itself)
    await asyncio.wait_for(finished.wait(), 5)  # it ran to its end: not cancelled by its own stop
    await sup.close()


async def test_nothing_starts_after_close() -> None:
    sup = Supervisor(Events())
    await sup.close()
    sup.start("late", Flaky(failures=0))
    assert sup.names() == []
