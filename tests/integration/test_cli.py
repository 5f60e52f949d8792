"""The ``dgxmm`` command as users run it: help, config errors, serve, and a clean SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import engine_command, free_port
from engines.litellm_standin import StandIn

DGXMM = [sys.executable, "-m", "dgxmm.cli"]


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DGXMM, *args], capture_output=True, text=True, timeout=60, check=False, env={**os.environ, **(env or {})}
    )


def test_help_lists_the_subcommands() -> None:
    out = run("--help")
    assert out.returncode == 0 and "serve" in out.stdout and "check-config" in out.stdout


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[ondemand]\nqueue_timeout = 5\n", "ondemand.queue_timeout"),
        ("[server]\nport = 'eighty'\n", "server.port"),
        ("[ondemand]\nidle_timeout_s = 30\n", "ondemand.idle_timeout_s"),
    ],
)
def test_config_error_exits_2_with_one_line_and_starts_nothing(tmp_path: Path, toml: str, key: str) -> None:
    data = tmp_path / "data"
    config = tmp_path / "c.toml"
    config.write_text(
        f'[server]\ndata_dir = "{data}"\n' + toml
        if "[server]" not in toml
        else toml.replace("[server]\n", f'[server]\ndata_dir = "{data}"\n')
    )
    out = run("serve", "--config", str(config))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], out.stderr
    assert not data.exists(), "nothing is started or created"


def test_environment_error_is_a_config_error_too(tmp_path: Path) -> None:
    out = run("check-config", env={"DGXMM_ONDEMAND__MAX_QUEUED": "many"})
    assert out.returncode == 2 and "ondemand.max_queued" in out.stderr


def test_newer_database_refuses_to_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    conn = sqlite3.connect(data / "dgxmm.db")
    conn.execute("CREATE TABLE schema_migrations (number INTEGER PRIMARY KEY, name TEXT, applied_at REAL)")
    conn.execute("INSERT INTO schema_migrations VALUES (1000, 'future', 0)")
    conn.commit()
    out = run("serve", env={"DGXMM_SERVER__DATA_DIR": str(data), "DGXMM_SERVER__PORT": str(free_port())})
    assert out.returncode == 2 and "newer than this dgxmm" in out.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_logs_where_it_listens_and_sigterm_leaves_no_engine_when_engines_die_with_it(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """With ``engines_outlive_dgxmm = false``; the default, where they go on and the next dgxmm
    adopts them, is tests/integration/test_engines_outlive.py's."""
    port = free_port()
    env = {
        **os.environ,
        "DGXMM_SERVER__PORT": str(port),
        "DGXMM_SERVER__DATA_DIR": str(tmp_path / "d"),
        "DGXMM_MEMORY__CAPACITY_GIB": "10",
        "DGXMM_RUNTIME__ENGINES_OUTLIVE_DGXMM": "false",
    }
    proc = subprocess.Popen([*DGXMM, "serve"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}/dgxmm/api"
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(base + "/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        token = (tmp_path / "d" / "admin-token").read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        view = httpx.post(
            base + "/deployments",
            headers=headers,
            json={"name": "e", "engine": "command", "memory_gib": 1, "command": engine_command()},
        ).json()
        while (v := httpx.get(f"{base}/deployments/{view['id']}", headers=headers).json())["state"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        url = v["base_url"]
        assert httpx.get(url + "/health").status_code == 200
        proc.send_signal(sig)
        # uvicorn re-raises the signal after a graceful shutdown, so -sig is a clean exit too.
        assert proc.wait(timeout=30) in (0, -sig)
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)
    finally:
        proc.kill()
        stderr = proc.stderr.read() if proc.stderr else ""
    assert f"admin API on http://127.0.0.1:{port}/dgxmm/api" in stderr
    assert "Application shutdown complete" in stderr  # engines stopped by the lifespan, not luck


def test_served_gateway_never_trusts_forwarding_headers(tmp_path: Path) -> None:
    """dgxmm serve runs Uvicorn with proxy-header rewriting off: a local caller cannot pick its
    peer address with X-Forwarded-For, and any forwarding header is refused by the guard."""
    port = free_port()
    key = tmp_path / "k"
    key.write_text("sk-x\n")
    env = {
        **os.environ,
        "DGXMM_SERVER__PORT": str(port),
        "DGXMM_SERVER__DATA_DIR": str(tmp_path / "d"),
        "DGXMM_ONDEMAND__KEY_FILE": str(key),
        "DGXMM_ONDEMAND__ALLOWED_CIDRS": '["127.0.0.2/32"]',
    }
    proc = subprocess.Popen([*DGXMM, "serve"], env=env, stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/dgxmm/ondemand/x/v1/models"
        headers = {"Authorization": "Bearer sk-x"}
        deadline = time.monotonic() + 30
        while True:
            try:
                first = httpx.get(url, headers=headers, timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        assert first.status_code == 404  # 127.0.0.1 is not allowed
        spoofed = httpx.get(url, headers={**headers, "X-Forwarded-For": "127.0.0.2"})
        assert spoofed.status_code == 404
        allowed = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        assert allowed.get(url, headers=headers).status_code == 404  # allowed peer, unknown id
        assert allowed.get(url, headers=headers).json()["error"]["message"] == "no deployment x"
        assert (
            allowed.get(url, headers={**headers, "X-Forwarded-For": "127.0.0.2"}).json()["error"]["message"]
            == "Not Found"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_unreadable_memory_source_is_a_config_error(tmp_path: Path) -> None:
    """No NVIDIA driver here: asking for nvml stops start-up with one line, nothing started."""
    out = run(
        "serve",
        env={
            "DGXMM_MEMORY__SOURCE": "nvml",
            "DGXMM_SERVER__DATA_DIR": str(tmp_path / "d"),
            "DGXMM_SERVER__PORT": str(free_port()),
        },
    )
    assert out.returncode == 2 and out.stderr.startswith("config error: memory.source")
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "d").exists()


async def test_litellm_purge_retires_one_instance(tmp_path: Path) -> None:
    lite = await StandIn().start()
    try:
        for instance in ("gone", "alive"):
            lite.entries.append(
                {
                    "model_name": "m",
                    "litellm_params": {"model": "openai/m", "api_base": "x"},
                    "model_info": {"id": instance + "-entry", "dgxmm_id": "d", "dgxmm_instance": instance},
                }
            )
        (tmp_path / "master.key").write_text(lite.master_key + "\n")
        config = tmp_path / "c.toml"
        config.write_text(f'[litellm]\nurl = "{lite.url}"\nmaster_key_file = "{tmp_path / "master.key"}"\n')

        async def purge(*args: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                *DGXMM, "litellm", "purge", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            return proc.returncode or 0, out.decode(), err.decode()

        code, out, _ = await purge("--config", str(config), "--instance", "gone")
        assert code == 0 and out.startswith("deleted m (entry gone-entry, deployment d, gone)")
        assert [e["model_info"]["id"] for e in lite.entries] == ["alive-entry"]
        lite.fail_status = 503
        code, _, err = await purge("--config", str(config), "--instance", "alive")
        assert code == 1 and err.startswith("error: cannot read LiteLLM's entries") and "503" in err
        (tmp_path / "empty.toml").write_text("")
        code, _, err = await purge("--config", str(tmp_path / "empty.toml"), "--legacy")
        assert code == 2 and "litellm: url and master_key_file" in err
    finally:
        await lite.stop()


def test_json_logs_every_line_from_dgxmm_and_uvicorn(tmp_path: Path) -> None:
    """log_format = "json": every line on stderr is one JSON object, Uvicorn's included; the
    gateway's access line has the request's fields and never its query string."""
    port = free_port()
    key = tmp_path / "k"
    key.write_text("sk-x\n")
    env = {
        **os.environ,
        "DGXMM_SERVER__PORT": str(port),
        "DGXMM_SERVER__DATA_DIR": str(tmp_path / "d"),
        "DGXMM_SERVER__LOG_FORMAT": "json",
        "DGXMM_ONDEMAND__KEY_FILE": str(key),
        "DGXMM_ONDEMAND__ALLOWED_CIDRS": '["127.0.0.2/32"]',
    }
    proc = subprocess.Popen([*DGXMM, "serve"], env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        url = f"http://127.0.0.1:{port}/dgxmm/ondemand/nope/v1/chat/completions?api_key=sk-secret"
        client = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        deadline = time.monotonic() + 30
        while True:
            try:
                resp = client.post(url, headers={"Authorization": "Bearer sk-x", "X-Request-Id": "r-cli"}, json={})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        assert resp.status_code == 404 and resp.headers["x-request-id"] == "r-cli"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        stderr = proc.stderr.read() if proc.stderr else ""
    records = [json.loads(line) for line in stderr.splitlines()]
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert any(r["logger"] == "uvicorn.error" and r["message"] == "Application shutdown complete." for r in records)
    access = next(r for r in records if r["logger"] == "dgxmm.access")
    assert access["message"].startswith("POST /dgxmm/ondemand/nope/v1/chat/completions 404 not_found ")
    assert (access["request_id"], access["peer"]) == ("r-cli", "127.0.0.2") and "deployment" not in access
    assert "sk-secret" not in stderr and "sk-x" not in stderr


def test_estimate_refuses_a_fifo_a_sparse_file_and_a_hostile_header_at_once(tmp_path: Path) -> None:
    """Issue 34: a FIFO nobody writes to hung ``dgxmm estimate`` for good, a huge claim grew it
    by gigabytes; each is now one line and exit code 2."""
    from hostile.ggufs import SHAPES, write_specials

    specials = write_specials(tmp_path)
    hostile = tmp_path / "array.gguf"
    raw, words = SHAPES["an array of 2^62 uint8"]
    hostile.write_bytes(raw)
    for path, expected in [specials["a FIFO"], specials["a sparse 4 GiB file claiming 2^27 tensors"], (hostile, words)]:
        out = run("estimate", str(path))
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and expected in lines[0], out.stderr


def test_estimate_refuses_a_context_no_model_has(tmp_path: Path) -> None:
    out = run("estimate", "--ctx", str(1 << 40), str(tmp_path / "m.gguf"))
    assert out.returncode == 2 and "not a context size from 1 to 16777216" in out.stderr


def test_check_config_prints_the_plan_and_export_round_trips(tmp_path: Path) -> None:
    """``dgxmm check-config`` as a user runs it before committing a change of the files, and
    ``dgxmm export`` printing what it accepts back (issue 39)."""
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    models = tmp_path / "models"
    models.mkdir()
    for name in ("qwen.gguf", "bge.gguf"):  # the model files a new declaration's check opens
        (models / name).write_bytes(b"GGUF")
    config = tmp_path / "dgxmm.toml"
    config.write_text(
        f'[server]\ndata_dir = "{tmp_path / "data"}"\ndeployments_dir = "{folder}"\n\n'
        '[deployment_defaults]\nengine = "llamacpp"\nmode = "on_demand"\n\n'
        f'[[deployments]]\nname = "qwen"\nmodel = "{models}/qwen.gguf"\nmemory_gib = 8\n'
    )
    (folder / "embed.toml").write_text(f'[[deployments]]\nname = "bge"\nmodel = "{models}/bge.gguf"\nmemory_gib = 1\n')
    out = run("check-config", "--config", str(config))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "config ok",
        f"create  qwen ({config})",
        f"create  bge ({folder / 'embed.toml'})",
        "unchanged: 0",
    ]
    (folder / "embed.toml").write_text(f'[[deployments]]\nname = "bge"\nmodel = "{models}/bge.gguf"\nmemory_gb = 1\n')
    out = run("check-config", "--config", str(config))
    assert out.returncode == 2 and out.stdout == ""
    assert (
        out.stderr.strip()
        == f"config error: {folder / 'embed.toml'}:4: [[deployments]] #1 (bge) memory_gb: unknown field"
    )
    exported = run("export", "--config", str(config))
    assert exported.returncode == 0 and exported.stdout.startswith("# 0 deployments")


def test_check_config_and_serve_refuse_a_hostile_file_at_once_in_one_line(tmp_path: Path) -> None:
    """Issue 47: a dotted key of 100,000 parts took minutes and gigabytes to parse, a nesting
    200,000 deep a traceback; ``check-config`` and ``serve`` read the files within the same bounds."""
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    config = tmp_path / "dgxmm.toml"
    head = f'[server]\ndata_dir = "{tmp_path / "data"}"\ndeployments_dir = "{folder}"\n'
    config.write_text(head)
    (folder / "a.toml").write_text("x = " + "[" * 200_000 + "]" * 200_000 + "\n")
    out = run("check-config", "--config", str(config))
    assert (
        out.returncode == 2
        and out.stderr == f"config error: {folder / 'a.toml'}:1: arrays and inline tables nested more than 32 deep\n"
    )
    config.write_text(head + "a" + ".a" * 99_999 + " = 1\n")
    for command in ("check-config", "serve"):
        began = time.monotonic()
        out = run(command, "--config", str(config))
        assert (
            out.returncode == 2
            and out.stderr == f"config error: {config}:4: a key or table header of more than 8 parts\n"
        )
        assert time.monotonic() - began < 10  # (a start of the interpreter; the scan takes microseconds)
