"""1000 mixed chat completions through the gateway to llama-server in a container (docker runtime,
reached through its published port): all answered 200, each run by the engine exactly once
(see tests/e2e/llama_traffic.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e.llama_traffic import run_traffic

from dockerrt.dockerd import DockerEnv
from dockerrt.test_docker_runtime import LLAMA, docker_settings

pytestmark = [pytest.mark.timeout(600), pytest.mark.docker, pytest.mark.e2e]


async def test_1000_mixed_requests_docker_runtime(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    svc = await serve(docker_settings(tmp_path, docker_env, gateway=True))
    view = await svc.create(name="tiny", **LLAMA)
    await run_traffic(svc, view, lambda: docker_env.logs(f"dgxmm-{view['id']}"))
    await svc.client.delete(f"/api/deployments/{view['id']}")
