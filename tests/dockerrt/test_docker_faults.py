"""Engines in the field, as containers (a real dockerd, llama-server inside): a paused container
(``docker pause``, the container's SIGSTOP), idle or mid-stream, and a killed one are found, their
requests end with a clear error, the container is removed and the next request gets a new one.
The process runtime's counterparts are in tests/integration/test_engine_faults.py."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Service, caller, wait_until

from dockerrt.dockerd import DockerEnv
from dockerrt.test_docker_runtime import LLAMA, containers, docker_settings

pytestmark = [pytest.mark.timeout(240), pytest.mark.docker]

INTERVAL_S = 0.5
FAILURES = 3
BOUND_S = (FAILURES + 1) * (INTERVAL_S + min(5.0, INTERVAL_S))  # docs/deployer.md
SLACK_S = 3.0


def chat(stream: bool, max_tokens: int = 4) -> dict[str, Any]:
    return {
        "model": "od",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }


async def started(svc: Service) -> str:
    view = await svc.create(name="od", mode="on_demand", **{**LLAMA, "args": ["-c", "2048", "-np", "1"]})
    async with caller(svc, timeout=60) as c:
        resp = await c.post(f"/{view['id']}/v1/chat/completions", json=chat(False))
    assert resp.status_code == 200, resp.text
    return str(view["id"])


def container_id(svc: Service, deployment_id: str) -> str:
    handle = svc.ctx.deployer.get(deployment_id).runtime_handle
    assert handle is not None
    return handle.ref


async def fault_service(serve: Any, tmp_path: Path, env: DockerEnv) -> Service:
    return await serve(
        docker_settings(
            tmp_path,
            env,
            gateway=True,
            deployer={"health_interval_s": INTERVAL_S, "health_failures": FAILURES, "stop_grace_s": 2},
        )
    )


async def test_a_paused_idle_container_is_found_removed_and_replaced(
    serve, tmp_path: Path, docker_env: DockerEnv
) -> None:
    svc = await fault_service(serve, tmp_path, docker_env)
    dep_id = await started(svc)
    first = container_id(svc, dep_id)
    docker_env.pause(f"dgxmm-{dep_id}")
    began = time.monotonic()
    failed = await svc.wait_state(dep_id, "failed", timeout=BOUND_S + SLACK_S + 10)
    assert time.monotonic() - began <= BOUND_S + SLACK_S
    assert failed["state_reason"].startswith(f"health check failed {FAILURES} times in a row")
    await wait_until(lambda: containers(docker_env) == [], timeout=30, interval=0.2)
    async with caller(svc, timeout=60) as c:
        resp = await c.post(f"/{dep_id}/v1/chat/completions", json=chat(False))
    assert resp.status_code == 200, resp.text
    assert container_id(svc, dep_id) != first
    assert containers(docker_env) == [f"dgxmm-{dep_id} running"]
    await svc.client.delete(f"/api/deployments/{dep_id}")


async def test_a_stream_held_by_a_paused_container_ends_with_an_error(
    serve, tmp_path: Path, docker_env: DockerEnv
) -> None:
    svc = await fault_service(serve, tmp_path, docker_env)
    dep_id = await started(svc)
    first = container_id(svc, dep_id)
    # A slow engine, so the stream is still under way when it is paused: a third of a core (much less and runc cannot freeze it in time).
    docker_env.cli("update", "--cpus", "0.3", f"dgxmm-{dep_id}")
    events: list[Any] = []

    async def read(resp: httpx.Response) -> None:
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))

    async with (
        caller(svc, timeout=120) as c,
        c.stream("POST", f"/{dep_id}/v1/chat/completions", json=chat(True, max_tokens=2000)) as resp,
    ):
        assert resp.status_code == 200
        reading = asyncio.create_task(read(resp))
        await wait_until(lambda: len(events) >= 3, timeout=60)
        docker_env.pause(f"dgxmm-{dep_id}")
        paused = time.monotonic()
        await asyncio.wait_for(reading, BOUND_S + SLACK_S + 10)
        ended = time.monotonic() - paused
    assert ended <= BOUND_S + SLACK_S, ended
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "ondemand_upstream_error"
    assert svc.ctx.ondemand.status(dep_id)["inflight"] == 0
    await wait_until(lambda: containers(docker_env) == [], timeout=30, interval=0.2)
    async with caller(svc, timeout=60) as c:
        resp = await c.post(f"/{dep_id}/v1/chat/completions", json=chat(False))
    assert resp.status_code == 200 and container_id(svc, dep_id) != first
    await svc.client.delete(f"/api/deployments/{dep_id}")


async def test_a_request_to_a_killed_container_ends_and_the_next_gets_a_new_one(
    serve, tmp_path: Path, docker_env: DockerEnv
) -> None:
    svc = await fault_service(serve, tmp_path, docker_env)
    dep_id = await started(svc)
    first = container_id(svc, dep_id)
    docker_env.cli("update", "--cpus", "0.3", f"dgxmm-{dep_id}")
    events: list[Any] = []
    async with (
        caller(svc, timeout=120) as c,
        c.stream("POST", f"/{dep_id}/v1/chat/completions", json=chat(True, max_tokens=2000)) as resp,
    ):
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else json.loads(data))
                if len(events) == 3:
                    docker_env.cli("kill", f"dgxmm-{dep_id}")
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "ondemand_upstream_error"
    failed = await svc.wait_state(dep_id, "failed", timeout=30)
    assert failed["state_reason"].startswith("engine exited (exit code 137)")
    async with caller(svc, timeout=60) as c:
        resp = await c.post(f"/{dep_id}/v1/chat/completions", json=chat(False))
    assert resp.status_code == 200 and container_id(svc, dep_id) != first
    await svc.client.delete(f"/api/deployments/{dep_id}")
