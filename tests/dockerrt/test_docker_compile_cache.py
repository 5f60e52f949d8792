"""The docker runtime keeps a vLLM deployment's compile work in a named volume: the suite's vLLM
stand-in in a container loads at its second start what its first "compiled", the volume's size is
shown, and clearing or removing the deployment removes the volume (docs/engines.md#compile-cache)."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import TESTS

from dockerrt.dockerd import DockerEnv
from dockerrt.test_docker_runtime import docker_settings

pytestmark = [pytest.mark.timeout(180), pytest.mark.docker]

FAKE_VLLM = TESTS / "engines" / "fakevllm"
IMAGE = "dgxmm-test/fakevllm:1"


def import_image(env: DockerEnv) -> None:
    """An image whose entrypoint is vLLM's server module, as vLLM's own image's is: this machine's
    interpreter with the stand-in on its path (bound in by the deployment's volumes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for folder in ("tmp", "root", "etc", "proc", "sys", "dev"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
    entry = f'ENTRYPOINT ["{sys.executable}", "-m", "vllm.entrypoints.openai.api_server"]'
    env.cli("import", "--change", entry, "--change", f"ENV PYTHONPATH={FAKE_VLLM}", "-", IMAGE, input=buf.getvalue())


async def run_once(svc, dep_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    assert (await svc.client.post(f"/api/deployments/{dep_id}/start")).status_code == 200
    await svc.wait_state(dep_id, "ready", timeout=60)
    lines = (await svc.client.get(f"/api/deployments/{dep_id}/logs", params={"tail": 100})).json()["lines"]
    assert (await svc.client.post(f"/api/deployments/{dep_id}/stop")).status_code == 200
    return lines


def volumes(env: DockerEnv, dep_id: str) -> list[str]:
    return env.cli("volume", "ls", "-q", "--filter", f"label=dgxmm.deployment={dep_id}").split()


async def test_a_volume_keeps_the_compile_work_between_containers(serve, tmp_path: Path, docker_env: DockerEnv) -> None:
    import_image(docker_env)
    binds = {sys.base_prefix, sys.prefix, str(TESTS), "/usr", "/lib", "/lib64", "/bin"}
    svc = await serve(docker_settings(tmp_path, docker_env))
    view = await svc.create(
        name="q",
        engine="vllm",
        image=IMAGE,
        model="org/model",
        memory_gib=1,
        gpus=0,
        mode="on_demand",
        volumes=[f"{p}:{p}:ro" for p in sorted(binds) if Path(p).exists()],
    )
    dep_id = view["id"]
    first = await run_once(svc, dep_id)
    assert any("Compiling a graph" in line for line in first), first[-20:]
    [volume] = volumes(docker_env, dep_id)
    assert volume.startswith(f"dgxmm-compile-{dep_id}-")
    second = await run_once(svc, dep_id)
    assert any("Directly load the compiled graph(s)" in line for line in second), second[-20:]
    assert not any("Compiling a graph" in line for line in second)

    shown = (await svc.client.get(f"/api/deployments/{dep_id}/compile-cache")).json()
    assert shown["kept"] is True and shown["where"] == volume and shown["bytes"] > 0
    cleared = (await svc.client.delete(f"/api/deployments/{dep_id}/compile-cache")).json()
    assert cleared["bytes"] == shown["bytes"] and volumes(docker_env, dep_id) == []
    third = await run_once(svc, dep_id)
    assert any("Compiling a graph" in line for line in third)
    assert (await svc.client.delete(f"/api/deployments/{dep_id}")).status_code == 200
    assert volumes(docker_env, dep_id) == []
