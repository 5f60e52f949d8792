"""Engines outlive dgxmm with the process runtime (issue 54 item 1, ``[runtime]
engines_outlive_dgxmm``, the default): after a ``kill -9`` or a SIGTERM of ``dgxmm serve``, the
engine goes on serving and the next dgxmm adopts it (same pid, no second start in its log), so
the first request to a model that was ready gets no cold start. A process that has the recorded
pid but another start time is not the engine: it is never adopted, and is killed like anything
else an earlier dgxmm left.

``dgxmm serve`` runs as its own process (tests/dgxmm_process.py); engines are test-engine
processes found through their deployment marker in /proc."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import KEY, engine_command
from dgxmm_process import Dgxmm, engine_pids, wait_for

from dgxmm.deploy.runtimes.base import START_MARK
from dgxmm.deploy.runtimes.members import start_ticks
from dgxmm.deploy.runtimes.process import MARKER, ProcessRuntime
from dgxmm.records.deployment import Deployment, RuntimeHandle, State
from dgxmm.settings import EngineSettings

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def dgxmm(tmp_path: Path) -> Iterator[Dgxmm]:
    dg = Dgxmm(tmp_path, runtime={"engines_outlive_dgxmm": True})
    yield dg
    dg.stop()
    for dep in (tmp_path / "data" / "logs").glob("*.log"):  # the engines it leaves, as it should
        for pid in engine_pids(dep.stem):
            os.kill(pid, signal.SIGKILL)


def chat(dg: Dgxmm, deployment_id: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=60) as client:
        return client.post(
            f"{dg.gateway}/{deployment_id}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}
        )


def starts_in_log(dg: Dgxmm, deployment_id: str) -> int:
    return (dg.dir / "data" / "logs" / f"{deployment_id}.log").read_text().count(START_MARK)


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_the_next_dgxmm_adopts_the_ready_engine_and_answers_without_a_cold_start(dgxmm: Dgxmm, how: str) -> None:
    dgxmm.start()
    view = dgxmm.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    assert chat(dgxmm, view["id"]).status_code == 200  # cold start
    dgxmm.wait_state(view["id"], "ready")
    engine = engine_pids(view["id"])
    assert len(engine) == 1
    dgxmm.kill() if how == "kill -9" else dgxmm.stop()
    assert engine_pids(view["id"]) == engine, "the engine goes on without dgxmm"

    dgxmm.start()
    after = dgxmm.view(view["id"])
    assert after["state"] == "ready" and engine_pids(view["id"]) == engine  # adopted, not restarted
    assert chat(dgxmm, view["id"]).status_code == 200
    assert engine_pids(view["id"]) == engine and starts_in_log(dgxmm, view["id"]) == 1  # no cold start
    assert dgxmm.held_gib() == 1  # counted
    events = dgxmm.call("GET", "/events/history", params={"deployment_id": view["id"]}).json()
    assert any("Adopted the running engine" in str(e) for e in events), events

    # A stop of the adopted engine ends it, as a stop of one dgxmm started does.
    assert dgxmm.call("POST", f"/deployments/{view['id']}/stop").status_code == 200
    dgxmm.wait_state(view["id"], "stopped")
    wait_for(lambda: not engine_pids(view["id"]), 30, "the adopted engine stopped")


def test_a_process_with_the_recorded_pid_and_another_start_time_is_killed_not_adopted(tmp_path: Path) -> None:
    dep = Deployment(
        id="outlive0123a", name="m", served_name="m", engine="command", command=["x"], memory_gib=1, state=State.READY
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        env={**os.environ, MARKER: dep.id},
        start_new_session=True,
    )
    try:
        wait_for(lambda: proc.pid in engine_pids(dep.id), what="the process exec'd with its marker")
        ticks = wait_for(lambda: start_ticks(proc.pid), what="the process's start time")
        wrong = RuntimeHandle(ref=str(proc.pid), base_url="http://127.0.0.1:9", port=9, started_ticks=ticks + 1)
        runtime = ProcessRuntime(tmp_path, EngineSettings(), outlive=True)
        assert asyncio.run(runtime.adopt(dep.model_copy(update={"runtime_handle": wrong}))) is None
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()


def test_an_adopted_process_is_followed_to_its_end(tmp_path: Path) -> None:
    """Not dgxmm's child: its end is seen (through a pidfd), and said as such."""
    dep = Deployment(
        id="outlive4567b", name="m", served_name="m", engine="command", command=["x"], memory_gib=1, state=State.READY
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        env={**os.environ, MARKER: dep.id},
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    wait_for(lambda: proc.pid in engine_pids(dep.id), what="the process exec'd with its marker")
    ticks = wait_for(lambda: start_ticks(proc.pid), what="the process's start time")
    handle = RuntimeHandle(ref=str(proc.pid), base_url="http://127.0.0.1:9", port=9, started_ticks=ticks)

    async def run() -> tuple[str | None, str]:
        runtime = ProcessRuntime(tmp_path, EngineSettings(), outlive=True)
        assert await runtime.adopt(dep.model_copy(update={"runtime_handle": handle})) == handle
        running = runtime.exit_reason(dep.id)
        usage = await runtime.usage(dep.id)
        assert usage is not None and proc.pid in usage.pids
        assert proc.stdin is not None
        proc.stdin.close()  # it ends by itself
        return running, await asyncio.wait_for(runtime.wait_exit(dep.id), 30)

    try:
        running, ended = asyncio.run(run())
        assert running is None and "adopted" in ended
    finally:
        proc.kill()
        proc.wait()


def dgxmm_stop(dg: Dgxmm, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dgxmm.cli", "stop", "--config", str(dg.dir / "dgxmm.toml"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_dgxmm_stop_leaves_the_engines_for_the_next_start_and_stop_engines_stops_them(dgxmm: Dgxmm) -> None:
    dgxmm.start()
    view = dgxmm.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    assert chat(dgxmm, view["id"]).status_code == 200
    dgxmm.wait_state(view["id"], "ready")
    engine = engine_pids(view["id"])
    assert dgxmm.proc is not None
    pid = dgxmm.proc.pid

    done = dgxmm_stop(dgxmm)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"dgxmm stop: PID {pid} exited, its engines left running for the next start"
    assert dgxmm.proc.poll() is not None  # it has exited when the command returns
    assert engine_pids(view["id"]) == engine

    dgxmm.start()
    assert dgxmm.view(view["id"])["state"] == "ready" and engine_pids(view["id"]) == engine  # adopted
    done = dgxmm_stop(dgxmm, "--stop-engines")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("exited, its engines stopped")
    assert not engine_pids(view["id"])  # stopped with their grace before dgxmm exited
    assert not (dgxmm.dir / "data" / "stop-request").exists()

    dgxmm.start()
    assert dgxmm.view(view["id"])["state"] == "stopped"  # recorded stopped: nothing to adopt
    dgxmm.stop()
    done = dgxmm_stop(dgxmm)
    assert (done.returncode, done.stdout.split("(")[0]) == (0, "dgxmm stop: not running ")
