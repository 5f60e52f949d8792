"""dgxmm SIGKILLed mid-start, mid-stop and mid make-room stop, then started again on the same data
directory (process runtime): no engine is left running that dgxmm does not count.

``dgxmm serve`` runs as its own process (tests/dgxmm_process.py). Its engines are test-engine
processes; every process carrying a deployment's marker is found through /proc, so an engine
that outlived the kill would show. The parent-death signal kills them with dgxmm; the restarted
dgxmm then starts again only what should run, and counts it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import engine_command
from dgxmm_process import Dgxmm, engine_pids, wait_for

from dgxmm.records.deployment import Deployment, State
from dgxmm.deploy.runtimes.process import MARKER, ProcessRuntime
from dgxmm.settings import EngineSettings

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def dgxmm(tmp_path: Path):
    dg = Dgxmm(tmp_path)
    yield dg
    dg.stop()


def test_killed_while_starting_an_always_on_engine(dgxmm: Dgxmm) -> None:
    dgxmm.start()
    view = dgxmm.create(name="m", engine="command", memory_gib=1, command=engine_command("--start-delay", "60"))
    dgxmm.wait_state(view["id"], "starting")
    old = wait_for(lambda: engine_pids(view["id"]), what="the engine process")
    dgxmm.kill()
    wait_for(lambda: not engine_pids(view["id"]), 10, "the engine dying with dgxmm (parent-death signal)")
    dgxmm.start()
    after = dgxmm.view(view["id"])
    assert after["state"] == "starting"  # always on: started again, counted
    new = wait_for(lambda: engine_pids(view["id"]), what="the new engine process")
    assert len(new) == 1 and new != old
    assert dgxmm.held_gib() == 1


def test_killed_while_starting_an_on_demand_engine(dgxmm: Dgxmm) -> None:
    dgxmm.start()
    view = dgxmm.create(
        name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--start-delay", "60")
    )
    dgxmm.request_model(view["id"])
    dgxmm.wait_state(view["id"], "starting")
    wait_for(lambda: engine_pids(view["id"]), what="the engine process")
    dgxmm.kill()
    dgxmm.start()
    assert dgxmm.view(view["id"])["state"] == "stopped"  # its next request starts it
    wait_for(lambda: not engine_pids(view["id"]), 10, "no engine left")
    assert dgxmm.held_gib() == 0


def test_killed_while_stopping(dgxmm: Dgxmm) -> None:
    """The engine ignores SIGTERM, so the stop waits out its grace (30 s); dgxmm dies meanwhile.
    The always-on deployment someone stopped stays stopped."""
    dgxmm.start()
    view = dgxmm.create(name="m", engine="command", memory_gib=1, command=engine_command("--ignore-sigterm"))
    dgxmm.wait_state(view["id"], "ready")
    dgxmm.in_background(
        "POST", f"{dgxmm.api}/deployments/{view['id']}/stop", headers={"Authorization": f"Bearer {dgxmm.token}"}
    )
    dgxmm.wait_state(view["id"], "stopping")
    assert engine_pids(view["id"]), "still stopping"
    dgxmm.kill()
    wait_for(lambda: not engine_pids(view["id"]), 10, "the engine dying with dgxmm")
    dgxmm.start()
    assert dgxmm.view(view["id"])["state"] == "stopped"
    assert not engine_pids(view["id"]) and dgxmm.held_gib() == 0


def test_killed_during_a_make_room_stop(dgxmm: Dgxmm) -> None:
    """Room for one of two on-demand models: a request for B stops the idle A, whose engine is
    slow to stop; dgxmm dies during that stop."""
    dgxmm.configure(
        memory={"capacity_gib": 1.5}, deployer={"metrics_interval_s": 0.2}, ondemand={"reaper_interval_s": 3600}
    )
    dgxmm.start()
    a = dgxmm.create(
        name="a",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        idle_timeout_s=0.2,
        command=engine_command("--ignore-sigterm"),
    )
    b = dgxmm.create(name="b", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    dgxmm.request_model(a["id"]).join(60)
    assert dgxmm.view(a["id"])["state"] == "ready"
    dgxmm.request_model(b["id"])  # waits while A is stopped to make room
    dgxmm.wait_state(a["id"], "stopping", timeout=30)
    assert engine_pids(a["id"]) and not engine_pids(b["id"])
    dgxmm.kill()
    wait_for(lambda: not engine_pids(a["id"]), 10, "A's engine dying with dgxmm")
    dgxmm.start()
    assert [dgxmm.view(d["id"])["state"] for d in (a, b)] == ["stopped", "stopped"]
    assert not engine_pids(a["id"]) and not engine_pids(b["id"])
    assert dgxmm.held_gib() == 0


def test_what_an_earlier_dgxmm_left_is_killed_even_without_its_leader(tmp_path: Path) -> None:
    """The parent-death signal reaches only an engine's first process: a child it started (vLLM
    runs several) would outlive dgxmm. Adopting kills every process carrying the marker."""
    dep = Deployment(
        id="left0123abcd",
        name="m",
        served_name="m",
        engine="command",
        command=["x"],
        memory_gib=1,
        state=State.STARTING,
    )
    env = {**os.environ, MARKER: dep.id}
    leader = subprocess.Popen(
        ["sh", "-c", f"{sys.executable} -c 'import time; time.sleep(120)' & exit 0"], env=env, start_new_session=True
    )
    leader.wait(10)
    orphan = wait_for(lambda: engine_pids(dep.id), what="the orphaned child")
    try:
        assert leader.pid not in orphan
        runtime = ProcessRuntime(tmp_path, EngineSettings())
        assert asyncio.run(runtime.adopt(dep)) is None
        wait_for(lambda: not engine_pids(dep.id), 10, "the child killed")
    finally:
        for pid in engine_pids(dep.id):  # only if the test failed
            os.kill(pid, signal.SIGKILL)
