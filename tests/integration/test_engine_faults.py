"""Engines in the field, as local processes: a busy engine whose health check is slow is kept; a
hung one (SIGSTOP), idle or mid-stream, and a killed one are found, their requests end with a
clear error, their process is ended and the next request gets a new engine (docs/deployer.md,
"Watchdog"). The same faults in containers are in tests/dockerrt/test_docker_faults.py."""

from __future__ import annotations

import pytest

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
from conftest import Service, caller, engine_command, gateway_settings, wait_until

INTERVAL_S = 0.5
FAILURES = 3
# How long a hung engine can go unnoticed (docs/deployer.md): (failures + 1) probes of
# health_interval_s plus the probe's timeout, min(5, health_interval_s).
BOUND_S = (FAILURES + 1) * (INTERVAL_S + min(5.0, INTERVAL_S))
SLACK_S = 3.0  # a loaded CI machine's scheduling, beyond what the loop measured of it (late())


def late(svc: Service) -> float:
    """How late dgxmm's event loop has been in all so far (its loop-lag probe): the timers a
    bound is made of fire that much later on a busy machine."""
    return float(svc.ctx.metrics.loop_lag.lag.sum)


def fault_settings(tmp_path: Path, deployer: dict[str, Any] | None = None, **sections: dict[str, Any]) -> Any:
    return gateway_settings(
        tmp_path,
        deployer={"health_interval_s": INTERVAL_S, "health_failures": FAILURES, "stop_grace_s": 2, **(deployer or {})},
        **sections,
    )


def chat(stream: bool, **body: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream, **body}


def pid_of(svc: Service, deployment_id: str) -> int:
    handle = svc.ctx.deployer.get(deployment_id).runtime_handle
    assert handle is not None
    return int(handle.ref)


def gone(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def ready_on_demand(svc: Service, *flags: str, name: str = "m", gib: float = 1) -> str:
    view = await svc.create(
        name=name, engine="command", memory_gib=gib, mode="on_demand", command=engine_command(*flags)
    )
    async with caller(svc) as c:
        resp = await c.post(f"/{view['id']}/v1/chat/completions", json=chat(False))
        assert resp.status_code == 200, resp.text
    return str(view["id"])


async def read_stream(resp: httpx.Response, events: list[Any]) -> None:
    async for line in resp.aiter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))


async def test_a_busy_engine_whose_health_check_is_slow_serves_its_whole_stream(serve, tmp_path: Path) -> None:
    """Done when (issue 24): a 20 s stream to an engine whose health check takes 8 s while it is
    busy, with the watchdog probing every second, completes; the engine is the same process."""
    svc = await serve(fault_settings(tmp_path, {"health_interval_s": 1.0}))
    words = " ".join(f"w{i}" for i in range(40))
    dep_id = await ready_on_demand(svc, "--busy-health-delay", "8", "--chunk-delay", "0.5", "--reply", words)
    pid = pid_of(svc, dep_id)
    events: list[Any] = []
    began = time.monotonic()
    async with (
        caller(svc, timeout=60) as c,
        c.stream("POST", f"/{dep_id}/v1/chat/completions", json=chat(True)) as resp,
    ):
        assert resp.status_code == 200
        await read_stream(resp, events)
    assert time.monotonic() - began >= 19.5
    assert events[-1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for e in events)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"])
    assert text == words
    view = await svc.view(dep_id)
    assert view["state"] == "ready" and pid_of(svc, dep_id) == pid and not gone(pid)
    events_log = [row["text"] for row in (await svc.client.get("/api/events/history")).json()]
    assert not any(text.startswith("Failed") for text in events_log)


@pytest.mark.bounded
async def test_a_stopped_idle_engine_is_found_ended_and_replaced(serve, tmp_path: Path) -> None:
    svc = await serve(fault_settings(tmp_path))
    dep_id = await ready_on_demand(svc)
    pid = pid_of(svc, dep_id)
    os.kill(pid, signal.SIGSTOP)
    began, lag = time.monotonic(), late(svc)
    failed = await svc.wait_state(dep_id, "failed", timeout=BOUND_S + SLACK_S + 60)
    assert time.monotonic() - began <= BOUND_S + SLACK_S + late(svc) - lag
    assert failed["state_reason"].startswith(f"health check failed {FAILURES} times in a row, with no other sign")
    await wait_until(lambda: gone(pid), timeout=10)  # SIGTERM reached it (dgxmm sends SIGCONT with it)
    async with caller(svc) as c:
        resp = await c.post(f"/{dep_id}/v1/chat/completions", json=chat(False))
    assert resp.status_code == 200, resp.text
    assert pid_of(svc, dep_id) != pid
    assert (await svc.view(dep_id))["state"] == "ready"


@pytest.mark.bounded
async def test_a_stream_held_by_an_engine_that_hangs_ends_with_an_error_and_the_next_request_gets_a_new_engine(
    serve, tmp_path: Path
) -> None:
    svc = await serve(fault_settings(tmp_path))
    words = " ".join(f"w{i}" for i in range(200))
    dep_id = await ready_on_demand(svc, "--chunk-delay", "0.05", "--reply", words)
    pid = pid_of(svc, dep_id)
    events: list[Any] = []
    async with (
        caller(svc, timeout=60) as c,
        c.stream("POST", f"/{dep_id}/v1/chat/completions", json=chat(True)) as resp,
    ):
        reading = asyncio.create_task(read_stream(resp, events))
        await wait_until(lambda: len(events) >= 3)
        os.kill(pid, signal.SIGSTOP)
        stopped, lag = time.monotonic(), late(svc)
        await asyncio.wait_for(reading, BOUND_S + SLACK_S + 60)
        ended, lagged = time.monotonic() - stopped, late(svc) - lag
    assert ended <= BOUND_S + SLACK_S + lagged, (ended, lagged)
    assert events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["code"] == "ondemand_upstream_error" and error["message"].startswith("m failed: health check failed")
    assert svc.ctx.ondemand.status(dep_id)["inflight"] == 0  # its slot went back
    await wait_until(lambda: gone(pid), timeout=10)
    async with caller(svc) as c:
        resp = await c.post(f"/{dep_id}/v1/chat/completions", json=chat(False))
    assert resp.status_code == 200 and pid_of(svc, dep_id) != pid


async def test_a_stream_of_an_engine_killed_mid_answer_ends_with_an_error(serve, tmp_path: Path) -> None:
    svc = await serve(fault_settings(tmp_path))
    words = " ".join(f"w{i}" for i in range(200))
    dep_id = await ready_on_demand(svc, "--chunk-delay", "0.05", "--reply", words)
    pid = pid_of(svc, dep_id)
    events: list[Any] = []
    async with (
        caller(svc, timeout=60) as c,
        c.stream("POST", f"/{dep_id}/v1/chat/completions", json=chat(True)) as resp,
    ):
        reading = asyncio.create_task(read_stream(resp, events))
        await wait_until(lambda: len(events) >= 3)
        os.kill(pid, signal.SIGKILL)
        await asyncio.wait_for(reading, 10)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "ondemand_upstream_error"
    failed = await svc.wait_state(dep_id, "failed", timeout=10)
    assert failed["state_reason"].startswith("engine exited (killed by SIGKILL)")
    async with caller(svc) as c:
        resp = await c.post(f"/{dep_id}/v1/chat/completions", json=chat(False))
    assert resp.status_code == 200 and pid_of(svc, dep_id) != pid


async def test_a_hung_engine_that_ignores_sigterm_holds_its_memory_until_it_is_killed(serve, tmp_path: Path) -> None:
    """The record says failed at once, but the budget counts the engine's memory until SIGKILL
    (after the stop grace) ended it; then the memory is free and a queued start goes ahead."""
    svc = await serve(fault_settings(tmp_path, {"stop_grace_s": 3}, memory={"capacity_gib": 2}))
    dep_id = await ready_on_demand(svc, "--ignore-sigterm", gib=2)
    other = await svc.create(name="other", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    pid = pid_of(svc, dep_id)
    os.kill(pid, signal.SIGSTOP)
    await svc.wait_state(dep_id, "failed", timeout=BOUND_S + SLACK_S + 5)
    failed_at = time.monotonic()
    assert not gone(pid) and svc.ctx.deployer.snapshot().held == 2  # still there, still counted
    async with caller(svc, timeout=60) as c:
        resp = await c.post(f"/{other['id']}/v1/chat/completions", json=chat(False))
    assert resp.status_code == 200, resp.text
    assert gone(pid) and time.monotonic() - failed_at >= 2.5  # it waited for the SIGKILL
    assert svc.ctx.deployer.snapshot().held == 2  # now only the other engine
