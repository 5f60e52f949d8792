"""`make demo` as a newcomer runs it: a served dgxmm with examples/dgxmm.toml exactly as `make run`
uses it (only the port and the llama-server path differ), started at the root of a fresh clone
(its examples/), and the demo against it, twice.

The demo model is a declared deployment (examples/deployments.d/demo.toml). `make run` writes its
model before it starts dgxmm (tests/unit/test_demo_model.py); this dgxmm starts without it, as
`dgxmm serve` run by hand would: the missing model is the file's error, shown in GET /api/host,
and once the demo writes the model dgxmm creates the deployment, with no edit of the file.

It also checks what the example config promises a fresh install: the on-demand key file is
created on the first start (mode 0600), loopback callers pass the peer guard, and a refused
caller is logged with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BIN = os.environ.get("DGXMM_LLAMA_SERVER")
if not BIN:
    pytest.skip(
        "DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server", allow_module_level=True
    )

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIG = "examples/dgxmm.toml"  # as `make run` names it, from the root of the clone


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """`dgxmm serve --config examples/dgxmm.toml` started at the root of a fresh clone."""
    shutil.copytree(EXAMPLES / "deployments.d", tmp_path / "examples" / "deployments.d")
    shutil.copy(EXAMPLES / "dgxmm.toml", tmp_path / "examples" / "dgxmm.toml")
    port = free_port()
    env = {
        **os.environ,
        "DGXMM_SERVER__PORT": str(port),
        "DGXMM_ENGINES__LLAMACPP_BIN": str(BIN),
        "DGXMM_RUNTIME__ENGINES_OUTLIVE_DGXMM": "false",  # the demo's engine ends with the test's dgxmm
    }
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dgxmm.cli", "serve", "--config", CONFIG],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/dgxmm/api/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.1)
        yield env, log_path
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def demo(tmp_path: Path, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "dgxmm.demo", "--config", CONFIG],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_demo_streams_a_cold_start_through_the_gateway(served: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, log_path = served
    key_file = tmp_path / "data" / "ondemand.key"
    assert key_file.stat().st_mode & 0o777 == 0o600 and len(key_file.read_text().strip()) >= 32
    assert f"created an on-demand key in {Path('data/ondemand.key')}" in log_path.read_text()

    base = f"http://127.0.0.1:{env['DGXMM_SERVER__PORT']}/dgxmm/api"
    token = {"Authorization": f"Bearer {(tmp_path / 'data' / 'admin-token').read_text().strip()}"}
    error = httpx.get(f"{base}/host", headers=token, timeout=10).json()["config"]["error"]
    assert (error["file"], error["name"], error["field"], error["recheck"]) == (
        "examples/deployments.d/demo.toml",
        "demo",
        "model",
        True,
    )
    assert error["message"] == "data/demo/tiny-random-llama.gguf: no such file on this host"
    assert httpx.get(f"{base}/deployments", headers=token, timeout=10).json() == []

    first = demo(tmp_path, env)
    assert "RANDOM weights" in first and "written now" in first
    assert "dgxmm created the declared on-demand deployment demo" in first
    assert "$(cat data/ondemand.key)" in first  # the printed curl works when pasted in that directory
    router = f"http://127.0.0.1:{env['DGXMM_SERVER__PORT']}/v1"
    assert f"export OPENAI_BASE_URL={router}\n" in first and "export OPENAI_API_KEY=$(cat data/ondemand.key)" in first
    assert f"curl -sN {router}/chat/completions" in first  # the model router, the model picked by name
    assert first.count('"object":"chat.completion.chunk"') > 1 and "data: [DONE]" in first
    assert "cold start: first token after" in first
    assert (tmp_path / "data" / "demo" / "tiny-random-llama.gguf").is_file()

    (view,) = httpx.get(f"{base}/deployments", headers=token, timeout=10).json()
    assert (view["managed_by"], view["declared_in"]) == ("config", "examples/deployments.d/demo.toml")
    assert httpx.get(f"{base}/host", headers=token, timeout=10).json()["config"]["error"] is None

    # Run again: the declared deployment is used, and stopped first so that this is a cold start too.
    second = demo(tmp_path, env)
    assert "the declared deployment demo" in second and "stopping it first" in second
    assert "cold start: first token after" in second and "data: [DONE]" in second
    assert "Started for a request" in log_path.read_text()


def test_a_caller_the_example_config_does_not_admit_is_refused_and_logged(
    served: tuple[dict[str, str], Path],
) -> None:
    env, log_path = served
    url = f"http://127.0.0.1:{env['DGXMM_SERVER__PORT']}/dgxmm/ondemand/x/v1/models"
    transport = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(transport=transport, timeout=10) as client:
        assert client.get(url).status_code == 404
    deadline = time.monotonic() + 10
    while "on-demand gateway refused 127.0.0.2 with 404: the peer is not allowed" not in log_path.read_text():
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.1)
    assert "allowed: 127.0.0.1/32, ::1/128" in log_path.read_text()
