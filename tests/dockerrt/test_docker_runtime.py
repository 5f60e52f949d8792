"""The docker runtime with a real Docker engine and a real llama-server image."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from conftest import caller, gateway_settings, make_settings, sse_events, wait_until

from dgxmm.demo.tiny_gguf import write_tiny_gguf
from dockerrt.dockerd import LLAMA_IMAGE, DockerEnv
from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import FakeHub

pytestmark = [pytest.mark.timeout(180), pytest.mark.docker]

LLAMA = {
    "engine": "llamacpp",
    "image": LLAMA_IMAGE,
    "model": "/models/tiny.gguf",
    "memory_gib": 1,
    "args": ["-c", "2048", "-np", "2"],
}


def docker_settings(tmp_path: Path, env: DockerEnv, gateway: bool = False, **sections):
    """Every docker test is one dgxmm instance ("dgxmm-tests"), so each one's start removes the
    containers an earlier test's deployments left (they are its own instance's, of deployments
    it does not know), as one host's dgxmm does after a crash."""
    runtime = {"kind": "docker", "docker_host": env.host, "network": env.network}
    make = gateway_settings if gateway else make_settings
    server = {"instance_id": "dgxmm-tests", **sections.pop("server", {})}
    return make(tmp_path, runtime=runtime, server=server, **sections)


def containers(env: DockerEnv) -> list[str]:
    return env.cli("ps", "-a", "--filter", "label=dgxmm.managed=true", "--format", "{{.Names}} {{.State}}").splitlines()


async def test_start_ready_stop_remove(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    svc = await serve(docker_settings(tmp_path, docker_env))
    view = await svc.create(name="tiny", **LLAMA)
    ready = await svc.wait_state(view["id"], "ready", timeout=60)
    assert ready["base_url"].startswith("http://127.0.0.1:")  # dgxmm on the host: a published port
    async with httpx.AsyncClient(timeout=30, headers=svc.engine_auth(view["id"])) as c:
        answer = await c.post(
            ready["base_url"] + "/v1/chat/completions",
            json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert answer.status_code == 200 and answer.json()["choices"]
    assert containers(docker_env) == [f"dgxmm-{view['id']} running"]
    lines = (await svc.client.get(f"/api/deployments/{view['id']}/logs", params={"tail": 20})).json()["lines"]
    assert lines and any("server" in line or "llama" in line for line in lines)

    assert (await svc.client.post(f"/api/deployments/{view['id']}/stop")).json()["state"] == "stopped"
    assert containers(docker_env) == []
    await svc.client.post(f"/api/deployments/{view['id']}/start")
    await svc.wait_state(view["id"], "ready", timeout=60)
    assert (await svc.client.delete(f"/api/deployments/{view['id']}")).status_code == 200
    assert containers(docker_env) == []


async def test_the_containers_output_is_counted_for_the_readiness_hint(
    serve, tmp_path: Path, docker_env: DockerEnv
) -> None:
    """The readiness wait probes at once when the engine writes (deploy/readiness.py): the docker
    runtime counts what the container writes, from its log stream, as the process runtime does
    from the log file."""
    svc = await serve(docker_settings(tmp_path, docker_env))
    runtime = svc.ctx.deployer.runtime
    view = await svc.create(name="tiny", mode="on_demand", **LLAMA)
    assert runtime.output_size(view["id"]) is None  # no container: nothing to tell
    await svc.client.post(f"/api/deployments/{view['id']}/start")
    ready = await svc.wait_state(view["id"], "ready", timeout=60)
    logged = "\n".join(await runtime.logs(view["id"], 10_000))
    await wait_until(lambda: (runtime.output_size(view["id"]) or 0) >= len(logged))  # all of it counted
    before = runtime.output_size(view["id"])
    async with httpx.AsyncClient(
        timeout=30, headers=svc.engine_auth(view["id"])
    ) as c:  # llama-server logs each request
        await c.post(
            ready["base_url"] + "/v1/chat/completions",
            json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
    await wait_until(lambda: (runtime.output_size(view["id"]) or 0) > before)
    await svc.client.post(f"/api/deployments/{view['id']}/stop")
    assert runtime.output_size(view["id"]) is None


async def test_the_console_follows_a_containers_log(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    """``/logs/follow`` (the console's live log) on a container: the tail first, then the lines
    llama-server writes for a request, each line once."""
    svc = await serve(docker_settings(tmp_path, docker_env))
    view = await svc.create(name="tiny", **LLAMA)
    ready = await svc.wait_state(view["id"], "ready", timeout=60)
    batches: list[list[str]] = []

    async def read() -> None:
        async with svc.client.stream("GET", f"/api/deployments/{view['id']}/logs/follow", params={"tail": 5}) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for _, data in sse_events(resp):
                batches.append(data["lines"])

    reader = asyncio.create_task(read())
    try:
        await wait_until(lambda: len(batches) >= 1, timeout=20)
        assert len(batches[0]) == 5
        async with httpx.AsyncClient(timeout=30, headers=svc.engine_auth(view["id"])) as c:  # it logs each request
            await c.post(
                ready["base_url"] + "/v1/chat/completions",
                json={"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            )
        await wait_until(lambda: len(batches) >= 2, timeout=20)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    later = [line for batch in batches[1:] for line in batch]
    assert all(batches[1:]), "later batches come only with new lines"
    assert set(later) <= set(await svc.ctx.deployer.runtime.logs(view["id"], 10_000))  # the container's own
    assert any("launch_slot_" in line for line in later), "the request's lines came after the tail"
    assert len(set(later)) == len(later), "no line twice"  # each of llama-server's lines has its own time


async def test_adopted_after_a_dgxmm_restart(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    settings = docker_settings(tmp_path, docker_env)
    svc = await serve(settings)
    view = await svc.create(name="keep", **LLAMA)
    ready = await svc.wait_state(view["id"], "ready", timeout=60)
    container_id, auth = svc.ctx.deployer.get(view["id"]).runtime_handle.ref, svc.engine_auth(view["id"])
    assert auth, "the engine demands a key of its own"
    await svc.shutdown()
    assert containers(docker_env) == [f"dgxmm-{view['id']} running"], "containers outlive dgxmm"

    svc2 = await serve(
        settings.model_copy(
            update={"server": settings.server.model_copy(update={"port": make_settings(tmp_path).server.port})}
        )
    )
    again = await svc2.view(view["id"])
    assert again["state"] == "ready"
    assert svc2.ctx.deployer.get(view["id"]).runtime_handle.ref == container_id, "not restarted"
    assert svc2.engine_auth(view["id"]) == auth, "the adopted engine's key is known"
    async with httpx.AsyncClient(timeout=30, headers=auth) as c:
        assert (await c.get(ready["base_url"] + "/metrics")).status_code == 200
    texts = [e["text"] for e in svc2.ctx.store.list_events(20, view["id"])]
    assert "Adopted the running engine" in texts
    await svc2.client.delete(f"/api/deployments/{view['id']}")


async def test_dead_containers_are_removed_at_restart(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    settings = docker_settings(tmp_path, docker_env)
    svc = await serve(settings)
    view = await svc.create(name="dies", mode="on_demand", **LLAMA)
    await svc.client.post(f"/api/deployments/{view['id']}/start")
    await svc.wait_state(view["id"], "ready", timeout=60)
    await svc.shutdown()
    docker_env.cli("kill", f"dgxmm-{view['id']}")
    svc2 = await serve(
        settings.model_copy(
            update={"server": settings.server.model_copy(update={"port": make_settings(tmp_path).server.port})}
        )
    )
    assert (await svc2.view(view["id"]))["state"] == "stopped"
    assert containers(docker_env) == []


async def test_a_killed_container_is_caught_by_the_watchdog(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    svc = await serve(docker_settings(tmp_path, docker_env))
    view = await svc.create(name="crash", **LLAMA)
    await svc.wait_state(view["id"], "ready", timeout=60)
    docker_env.cli("kill", f"dgxmm-{view['id']}")
    failed = await svc.wait_state(view["id"], "failed", timeout=30)
    assert failed["state_reason"].startswith("engine exited (exit code 137)")
    # The deployer marks it failed first, then removes the container.
    await wait_until(lambda: containers(docker_env) == [], timeout=30, interval=0.2)


async def test_a_name_left_by_a_crashed_dgxmm_does_not_block(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    svc = await serve(docker_settings(tmp_path, docker_env))
    view = await svc.create(name="left", mode="on_demand", **LLAMA)
    docker_env.cli("create", "--name", f"dgxmm-{view['id']}", "--label", "dgxmm.managed=true", LLAMA_IMAGE, "--version")
    await svc.client.post(f"/api/deployments/{view['id']}/start")
    await svc.wait_state(view["id"], "ready", timeout=60)
    assert containers(docker_env) == [f"dgxmm-{view['id']} running"]
    await svc.client.delete(f"/api/deployments/{view['id']}")


async def test_gpu_request_without_an_nvidia_runtime_fails_clearly(
    serve, tmp_path: Path, docker_env: DockerEnv
) -> None:
    svc = await serve(docker_settings(tmp_path, docker_env))
    view = await svc.create(name="gpu", gpus=True, **LLAMA)
    failed = await svc.wait_state(view["id"], "failed", timeout=30)
    assert "no NVIDIA container runtime" in failed["state_reason"]
    assert containers(docker_env) == []


async def test_a_failed_pull_fails_the_start_with_the_reason(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    svc = await serve(docker_settings(tmp_path, docker_env))
    view = await svc.create(name="pull", **{**LLAMA, "image": "registry.invalid/nope/llama:1"})
    failed = await svc.wait_state(view["id"], "failed", timeout=60)
    assert failed["state_reason"].startswith("cannot pull registry.invalid/nope/llama:1")
    texts = [e["text"] for e in svc.ctx.store.list_events(20, view["id"])]
    assert "Pulling image registry.invalid/nope/llama:1" in texts


async def test_on_demand_cold_start_through_the_gateway(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    svc = await serve(docker_settings(tmp_path, docker_env, gateway=True))
    view = await svc.create(name="od", mode="on_demand", **LLAMA)
    async with caller(svc, timeout=60) as g:
        resp = await g.post(
            f"/{view['id']}/v1/chat/completions",
            json={"model": "od", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert resp.status_code == 200 and resp.json()["object"] == "chat.completion"
    assert (await svc.view(view["id"]))["state"] == "ready"
    await svc.client.delete(f"/api/deployments/{view['id']}")


async def test_a_removed_container_is_caught_by_the_watchdog(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    svc = await serve(docker_settings(tmp_path, docker_env))
    view = await svc.create(name="gone", **LLAMA)
    await svc.wait_state(view["id"], "ready", timeout=60)
    docker_env.cli("rm", "-f", f"dgxmm-{view['id']}")
    failed = await svc.wait_state(view["id"], "failed", timeout=30)
    assert failed["state_reason"].startswith("engine exited (")


async def test_an_adopted_on_demand_model_waits_a_full_idle_timeout(
    serve, tmp_path: Path, docker_env: DockerEnv
) -> None:
    """After a dgxmm restart a ready on-demand engine is kept, and the reaper stops it only once
    a full idle timeout has passed since dgxmm saw it again (nothing of the controller persists)."""
    settings = docker_settings(
        tmp_path, docker_env, ondemand={"idle_timeout_min_s": 1, "idle_timeout_s": 3, "reaper_interval_s": 0.2}
    )
    svc = await serve(settings)
    view = await svc.create(name="idle", mode="on_demand", **LLAMA)
    await svc.client.post(f"/api/deployments/{view['id']}/start")
    await svc.wait_state(view["id"], "ready", timeout=60)
    await svc.shutdown()
    await asyncio.sleep(3.5)  # longer than the idle timeout, while no dgxmm runs
    loop = asyncio.get_running_loop()
    restarted = loop.time()  # dgxmm sees the engine again during its start-up: not before this
    svc2 = await serve(
        settings.model_copy(
            update={"server": settings.server.model_copy(update={"port": make_settings(tmp_path).server.port})}
        )
    )
    # Until a full idle timeout after `restarted` it must still run. A start-up slowed down by a
    # loaded machine may leave less of that time to look at; a read that ends later proves nothing.
    for pause in (0.0, 1.5):
        await asyncio.sleep(pause)
        state = (await svc2.view(view["id"]))["state"]
        if loop.time() < restarted + 3:
            assert state == "ready", "stopped before a full idle timeout"
    await svc2.wait_state(view["id"], "stopped", timeout=20)
    assert loop.time() - restarted >= 3
    texts = [e["text"] for e in svc2.ctx.store.list_events(20, view["id"])]
    assert "Stopped after 3 s idle" in texts
    assert containers(docker_env) == []


async def test_only_this_instances_containers_are_removed_at_start(
    serve, tmp_path: Path, docker_env: DockerEnv
) -> None:
    """At start-up dgxmm removes its own containers of deployments it no longer has; another
    instance's (another dgxmm on this Docker host, or one on a new data directory) are not its
    to touch, nor an older dgxmm's unlabelled ones of deployments it does not know."""
    settings = docker_settings(tmp_path, docker_env)
    ours = settings.server.instance_id
    for name, labels in (
        ("foreign", {"dgxmm.instance": "another-host-1", "dgxmm.deployment": "abc123"}),
        ("legacy", {"dgxmm.deployment": "def456"}),
        ("stale", {"dgxmm.instance": ours, "dgxmm.deployment": "0a0b0c0d0e0f"}),
    ):
        flags = [
            arg for key, value in {"dgxmm.managed": "true", **labels}.items() for arg in ("--label", f"{key}={value}")
        ]
        docker_env.cli("create", "--name", f"left-{name}", *flags, LLAMA_IMAGE, "--version")
    svc = await serve(settings)
    names = docker_env.cli("ps", "-a", "--format", "{{.Names}}").split()
    assert "left-foreign" in names and "left-legacy" in names
    assert "left-stale" not in names  # this instance's, of a deployment that is gone
    await svc.shutdown()
    for name in ("left-foreign", "left-legacy"):
        docker_env.cli("rm", "-f", name)


async def test_a_container_is_measured_while_it_runs(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    """Measured memory (issue 29) of a container: its cgroup's memory (what ``docker stats``
    shows) and its processes, while it runs; nothing once it is stopped."""
    svc = await serve(docker_settings(tmp_path, docker_env, deployer={"metrics_interval_s": 0.2}))
    view = await svc.create(name="tiny", **LLAMA)
    await svc.wait_state(view["id"], "ready", timeout=60)
    usage = await svc.ctx.deployer.runtime.usage(view["id"])
    assert usage is not None and usage.host_bytes > 1024 * 1024 and usage.pids  # llama-server and its model
    gib = await wait_until(lambda: svc.ctx.measured.gib(view["id"]), timeout=10)
    assert 0.001 < gib < 1.0 and (await svc.view(view["id"]))["memory_measured_gib"] is not None
    await svc.client.post(f"/api/deployments/{view['id']}/stop")
    assert await svc.ctx.deployer.runtime.usage(view["id"]) is None
    assert (await svc.view(view["id"]))["memory_measured_gib"] is None


async def test_a_model_pulled_from_the_hub_is_bound_into_its_container(
    serve, tmp_path: Path, docker_env: DockerEnv, hub: FakeHub
) -> None:
    """An ``hf://`` model is a file in the model store on the host; the engine's container is given
    the models directory read-only at the same path, with no ``volumes`` from the user."""
    hub.add("org/tiny", {"model.gguf": write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()})
    models = {**hub.settings, "reserve_gib": 0}
    svc = await serve(docker_settings(tmp_path, docker_env, gateway=True, models=models))
    view = await svc.create(name="pulled", **{**LLAMA, "model": "hf://org/tiny/model.gguf"})
    ready = await svc.wait_state(view["id"], "ready", timeout=90)
    store = str((tmp_path / "data" / "models").absolute())
    assert ready["model_path"].startswith(store + "/")
    binds = docker_env.cli("inspect", "--format", "{{json .HostConfig.Binds}}", f"dgxmm-{view['id']}")
    assert f"{store}:{store}:ro" in binds
    async with caller(svc, timeout=60) as g:
        answer = await g.post(
            f"/{view['id']}/v1/chat/completions",
            json={"model": "pulled", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert answer.status_code == 200 and answer.json()["choices"]
    await svc.client.delete(f"/api/deployments/{view['id']}")
