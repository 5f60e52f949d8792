"""dgxmm SIGKILLed mid-start, mid-stop and mid make-room stop, then started again on the same data
directory (docker runtime): containers outlive dgxmm, so the restarted dgxmm must adopt each one
into a state that counts its memory or stop and remove it.

``dgxmm serve`` runs on the host as its own process (tests/dgxmm_process.py); its engines are the
test engine in containers (an imported image with this machine's interpreter and this checkout
bind-mounted), so they can be slow to load or to stop on purpose.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import TEST_ENGINE
from dgxmm_process import Dgxmm, wait_for

from dockerrt.dockerd import DockerEnv
from dockerrt.test_peer_policy_in_container import BASE_IMAGE, _import_base

pytestmark = [pytest.mark.timeout(240), pytest.mark.docker]

HOLDING = ("starting", "ready", "asleep", "stopping")


def engine(*flags: str, **body: object) -> dict[str, object]:
    """A deployment running the test engine in a container."""
    binds = {sys.base_prefix, sys.prefix, str(TEST_ENGINE.parents[1]), "/usr", "/lib", "/lib64", "/bin"}
    return {
        "engine": "command",
        "image": BASE_IMAGE,
        "memory_gib": 1,
        "volumes": [f"{p}:{p}:ro" for p in sorted(binds) if Path(p).exists()],
        "command": [
            sys.executable,
            str(TEST_ENGINE),
            "--host",
            "0.0.0.0",
            "--port",
            "{port}",
            "--served-name",
            "{served_name}",
            *flags,
        ],
        **body,
    }


def running(env: DockerEnv) -> dict[str, str]:
    """Running dgxmm containers: container id -> deployment id."""
    out = env.cli(
        "ps", "--filter", "label=dgxmm.managed=true", "--no-trunc", "--format", '{{.ID}} {{.Label "dgxmm.deployment"}}'
    )
    return dict(line.split() for line in out.splitlines())


def nothing_untracked(dgxmm: Dgxmm, env: DockerEnv, ids: list[str]) -> None:
    """Every running engine belongs to a deployment in a state that holds memory, and the host
    view counts exactly those deployments."""
    views = {i: dgxmm.view(i) for i in ids}
    for container, dep in running(env).items():
        assert views[dep]["state"] in HOLDING, (
            f"container {container[:12]} runs behind a {views[dep]['state']} deployment"
        )
    assert dgxmm.held_gib() == sum(v["memory_gib"] for v in views.values() if v["state"] in HOLDING)


@pytest.fixture
def dgxmm(tmp_path: Path, docker_env: DockerEnv) -> Iterator[Dgxmm]:
    _import_base(docker_env)
    dg = Dgxmm(tmp_path, runtime={"kind": "docker", "docker_host": docker_env.host, "network": docker_env.network})
    yield dg
    dg.stop()
    for container in running(docker_env):
        docker_env.cli("rm", "-f", container, check=False)


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_killed_while_a_container_starts_it_is_adopted_once_it_serves(dgxmm: Dgxmm, docker_env: DockerEnv) -> None:
    dgxmm.start()
    view = dgxmm.create(name="m", **engine("--start-delay", "6"))
    starting = wait_for(lambda: (v := dgxmm.view(view["id"]))["base_url"] and v, what="the container's address")
    assert starting["state"] == "starting"
    [container] = running(docker_env)
    dgxmm.kill()
    assert list(running(docker_env)) == [container], "the container outlives dgxmm"
    wait_for(lambda: healthy(starting["base_url"]), 60, "the engine loaded meanwhile")
    dgxmm.start()
    assert dgxmm.view(view["id"])["state"] == "ready"
    assert list(running(docker_env)) == [container], "adopted, not restarted"
    nothing_untracked(dgxmm, docker_env, [view["id"]])
    assert dgxmm.held_gib() == 1


@pytest.mark.parametrize("mode", ["always_on", "on_demand"])
def test_killed_while_a_container_starts_one_that_never_serves_is_removed(dgxmm, docker_env, mode: str) -> None:
    dgxmm.start()
    view = dgxmm.create(name="m", mode=mode, **engine("--never-healthy"))
    if mode == "on_demand":
        dgxmm.request_model(view["id"])
    dgxmm.wait_state(view["id"], "starting")
    [old] = wait_for(lambda: running(docker_env), what="the container")
    dgxmm.kill()
    dgxmm.start()
    assert old not in running(docker_env)
    if mode == "always_on":  # started again: a new container, counted
        assert dgxmm.view(view["id"])["state"] == "starting"
        assert len(wait_for(lambda: running(docker_env), what="the new container")) == 1
    else:
        assert dgxmm.view(view["id"])["state"] == "stopped" and running(docker_env) == {}
    nothing_untracked(dgxmm, docker_env, [view["id"]])


def test_killed_while_a_container_stops(dgxmm: Dgxmm, docker_env: DockerEnv) -> None:
    """The engine ignores SIGTERM: Docker waits out the 30 s grace; dgxmm dies meanwhile."""
    dgxmm.start()
    view = dgxmm.create(name="m", **engine("--ignore-sigterm"))
    dgxmm.wait_state(view["id"], "ready")
    dgxmm.in_background(
        "POST", f"{dgxmm.api}/deployments/{view['id']}/stop", headers={"Authorization": f"Bearer {dgxmm.token}"}
    )
    dgxmm.wait_state(view["id"], "stopping")
    dgxmm.kill()
    assert len(running(docker_env)) == 1, "still stopping when dgxmm died"
    dgxmm.configure(deployer={"stop_grace_s": 2})
    dgxmm.start()
    assert dgxmm.view(view["id"])["state"] == "stopped"
    assert running(docker_env) == {}
    nothing_untracked(dgxmm, docker_env, [view["id"]])


def test_killed_during_a_make_room_stop(dgxmm: Dgxmm, docker_env: DockerEnv) -> None:
    dgxmm.configure(
        memory={"capacity_gib": 1.5}, deployer={"metrics_interval_s": 0.2}, ondemand={"reaper_interval_s": 3600}
    )
    dgxmm.start()
    a = dgxmm.create(name="a", mode="on_demand", idle_timeout_s=0.2, **engine("--ignore-sigterm"))
    b = dgxmm.create(name="b", mode="on_demand", **engine())
    dgxmm.request_model(a["id"]).join(90)
    assert dgxmm.view(a["id"])["state"] == "ready"
    dgxmm.request_model(b["id"])  # waits while A is stopped to make room
    dgxmm.wait_state(a["id"], "stopping", timeout=30)
    dgxmm.kill()
    assert list(running(docker_env).values()) == [a["id"]], "A still stopping, B not started"
    dgxmm.configure(deployer={"stop_grace_s": 2})
    dgxmm.start()
    assert [dgxmm.view(d["id"])["state"] for d in (a, b)] == ["stopped", "stopped"]
    assert running(docker_env) == {}
    nothing_untracked(dgxmm, docker_env, [a["id"], b["id"]])
