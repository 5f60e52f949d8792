"""Ollama's own listener (``[ollama] listen``, issue 49 item 1): a second real socket on a free
port (never 11434 itself) serving Ollama's API alone, with every check the main listener's
``/api/*`` makes; the official ``ollama`` client pointed at it as at an Ollama; a port already
taken stops ``dgxmm serve`` with one line naming it."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest
from conftest import KEY, engine_command, free_port, gateway_settings
from served import Served


def at(port: int, key: str | None = KEY, address: str = "127.0.0.2") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        transport=httpx.AsyncHTTPTransport(local_address=address),
        headers={"Authorization": f"Bearer {key}"} if key else {},
        timeout=60,
    )


async def test_the_ollama_client_on_its_own_port_reaches_ollamas_api_only(serve: Any, tmp_path: Path) -> None:
    port = free_port()
    svc = await serve(gateway_settings(tmp_path, ollama={"listen": f"127.0.0.1:{port}"}))
    view = await svc.create(name="qwen3", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    c = ollama.AsyncClient(
        host=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {KEY}"},
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        timeout=60,
    )
    assert [m.model for m in (await c.list()).models] == ["qwen3:latest"]
    reply = await c.chat("qwen3", [{"role": "user", "content": "hi"}], stream=False)
    assert reply.message.content and (reply.load_duration or 0) > 0, "a cold start through the second port"
    assert [m.model for m in (await c.ps()).models] == ["qwen3:latest"]
    assert (await svc.view(view["id"]))["state"] == "ready"

    base = svc.settings.server.base_path
    async with at(port) as r:
        assert (await r.get("/api/version")).status_code == 200
        for path in ("/v1/models", f"{base}/api/deployments", f"{base}/", "/health", "/models"):
            other = await r.get(path)
            assert other.status_code == 404 and "Ollama's API" in other.json()["error"], (path, other.text)
    async with at(port, key=None) as r:  # no key, no keyless key: 401 in Ollama's shape
        keyless = await r.get("/api/tags")
    assert keyless.status_code == 401 and set(keyless.json()) == {"error"}
    async with at(port, address="127.0.0.1") as r:  # a peer outside allowed_cidrs: the peer guard's 404
        outside = await r.get("/api/tags")
    assert outside.status_code == 404 and outside.json() == {"error": "Not Found"}, outside.text
    async with at(svc.settings.server.port) as r:  # the main listener is as it was
        assert (await r.get("/v1/models")).status_code == 200


def test_a_taken_port_is_a_clear_start_up_error(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        served = Served(tmp_path, {"DGXMM_OLLAMA__LISTEN": f"127.0.0.1:{port}"}).start(wait=False)
        assert served.wait(60) == 2
    assert served.log().strip().splitlines() == [
        f"cannot listen on 127.0.0.1:{port} (ollama.listen): Address already in use"
    ]
    assert not (served.data_dir / "dgxmm.db").exists(), "nothing touched"


@pytest.mark.parametrize("listen", ["11434", "127.0.0.1:", "127.0.0.1:70000", ":11434"])
def test_a_listen_that_is_no_address_is_refused(tmp_path: Path, listen: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        gateway_settings(tmp_path, ollama={"listen": listen})


def test_its_port_is_its_own_and_it_needs_ollamas_api_served(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="main listener"):
        gateway_settings(tmp_path, ollama={"listen": "127.0.0.1:8111"}, server={"port": 8111})
    with pytest.raises(ValueError, match="needs ollama.enabled"):
        gateway_settings(tmp_path, ollama={"listen": "127.0.0.1:11434", "enabled": False})
