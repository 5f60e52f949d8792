"""Through the served admin API: the memory limit a vLLM deployment is launched with, and the
deployments refused at create time because they could never keep to their memory_gib."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import TESTS, make_settings

FAKE_VLLM = TESTS / "engines" / "fakevllm"  # vLLM's command line in front of the test engine
GIB = 1024**3


def settings(tmp_path: Path, **engines: str):  # type: ignore[no-untyped-def]
    """A 128 GiB device, vLLM run by this Python (with the stand-in on its path)."""
    return make_settings(
        tmp_path, memory={"source": "declared", "capacity_gib": 128}, engines={"vllm_python": sys.executable, **engines}
    )


async def test_a_32_gib_deployment_of_a_128_gib_device_is_launched_with_a_quarter(serve, tmp_path: Path) -> None:
    svc = await serve(settings(tmp_path))
    view = await svc.create(
        name="quarter", engine="vllm", model="org/model", memory_gib=32, env={"PYTHONPATH": str(FAKE_VLLM)}
    )
    assert view["memory_limit"] == {
        "flag": "--gpu-memory-utilization",
        "value": "0.25",
        "gib": 32.0,
        "set_by": "dgxmm",
        "added": ["--gpu-memory-utilization", "0.25"],
        "device_total_gib": 128.0,
        "weights_gib": None,
    }
    await svc.wait_state(view["id"], "ready")
    handle = svc.ctx.deployer.get(view["id"]).runtime_handle
    assert handle is not None
    argv = Path(f"/proc/{handle.ref}/cmdline").read_bytes().decode().split("\0")
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.25"


async def test_a_flag_claiming_more_than_memory_gib_is_422_on_args(serve, tmp_path: Path) -> None:
    svc = await serve(settings(tmp_path))
    resp = await svc.client.post(
        "/api/deployments",
        json={
            "name": "greedy",
            "engine": "vllm",
            "model": "org/model",
            "memory_gib": 32,
            "mode": "on_demand",
            "args": ["--max-model-len", "4096", "--gpu-memory-utilization", "0.9"],
        },
    )
    assert resp.status_code == 422
    error = resp.json()["error"]
    assert error["field"] == "args" and error["code"] == "invalid_input"
    assert error["message"] == ("args: --gpu-memory-utilization 0.9 claims 115.20 GiB, more than memory_gib 32 GiB")
    own = await svc.create(
        name="modest",
        engine="vllm",
        model="org/model",
        memory_gib=32,
        mode="on_demand",
        args=["--gpu-memory-utilization=0.2"],
    )
    assert own["memory_limit"]["set_by"] == "deployment" and own["memory_limit"]["added"] == []
    assert [d["name"] for d in (await svc.client.get("/api/deployments")).json()] == ["modest"]


async def test_a_gguf_larger_than_memory_gib_is_422_naming_both_sizes(serve, tmp_path: Path) -> None:
    svc = await serve(settings(tmp_path))
    gguf = tmp_path / "big.gguf"
    with gguf.open("wb") as f:
        f.write(b"GGUF")  # the magic the create checks (api/modelcheck.py)
        f.truncate(3 * GIB)  # sparse: no disk is used
    body = {"name": "big", "engine": "llamacpp", "model": str(gguf), "mode": "on_demand"}
    resp = await svc.client.post("/api/deployments", json={**body, "memory_gib": 2.5})
    assert resp.status_code == 422
    assert resp.json()["error"] == {
        "message": f"memory_gib: the model file {gguf} is 3.00 GiB, more than memory_gib 2.5 GiB: "
        "the engine could never fit",
        "type": "invalid_request_error",
        "code": "invalid_input",
        "field": "memory_gib",
    }
    assert (await svc.create(**body, memory_gib=4))["memory_limit"] is None


async def test_sleep_mode_on_the_cpu_build_is_422_at_create_time(serve, tmp_path: Path) -> None:
    svc = await serve(settings(tmp_path, vllm_build="cpu"))
    resp = await svc.client.post(
        "/api/deployments",
        json={"name": "sleepy", "engine": "vllm", "model": "org/model", "memory_gib": 4, "sleep_mode": True},
    )
    assert resp.status_code == 422 and resp.json()["error"]["field"] == "sleep_mode"
    assert "the CPU build of vLLM cannot sleep" in resp.json()["error"]["message"]
    view = await svc.create(name="awake", engine="vllm", model="org/model", memory_gib=4, mode="on_demand")
    assert view["memory_limit"]["flag"] == "--kv-cache-memory-bytes"
    assert view["memory_limit"]["value"] == str(4 * GIB)


async def test_an_sglang_deployment_gets_its_share_and_spans_its_own_tp_size(serve, tmp_path: Path) -> None:
    """SGLang's static share is vLLM's arithmetic; its own --tp-size sets how many devices it spans;
    it offers no sleep (docs/engines.md#sglang)."""
    svc = await serve(
        make_settings(tmp_path, memory={"source": "declared", "capacity_gib": None, "devices_gib": [80, 80]})
    )
    view = await svc.create(
        name="sgl", engine="sglang", model="/models/qwen", memory_gib=60, mode="on_demand", args=["--tp-size", "2"]
    )
    assert view["gpus"] == 2
    limit = view["memory_limit"]
    assert (limit["flag"], limit["value"], limit["added"]) == (
        "--mem-fraction-static",
        "0.375",
        ["--mem-fraction-static", "0.375"],
    )
    resp = await svc.client.post(
        "/api/deployments",
        json={"name": "sleepy", "engine": "sglang", "model": "/m", "memory_gib": 8, "sleep_mode": True},
    )
    assert resp.status_code == 422 and resp.json()["error"]["message"] == "sleep_mode: SGLang has no sleep mode"
