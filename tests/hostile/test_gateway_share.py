"""With the gateway's share of connections full, the gateway answers 503 and the admin API
still answers: a dgxmm with an open files limit of 256 (64 connections, 16 kept for the admin
API), 48 slow streams in flight."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from conftest import KEY, engine_command
from integration.test_metrics_endpoint import samples, value
from served import Served, until

pytestmark = pytest.mark.hostile


def test_the_admin_api_stays_reachable_when_the_gateway_share_is_full(tmp_path: Path) -> None:
    served = Served(tmp_path, {"DGXMM_SERVER__LOG_LEVEL": "warning"}, open_files=256).start()
    release = threading.Event()
    try:
        with served.admin() as admin:
            view = admin.post(
                "/deployments",
                json={
                    "name": "m",
                    "engine": "command",
                    "memory_gib": 1,
                    "mode": "on_demand",
                    "idle_timeout_s": 3600,
                    "command": engine_command("--reply", " ".join(["word"] * 100)),
                },
            ).json()
            with served.gateway() as g:
                assert g.post(f"/{view['id']}/v1/chat/completions", json={"model": "m", "messages": []}).is_success
            engine = admin.get(f"/deployments/{view['id']}").json()["base_url"]
            server = admin.get("/host").json()["server"]
        assert (server["max_connections"], server["admin_reserve"], server["gateway_share"]) == (64, 16, 48)
        httpx.post(engine + "/_test/config", json={"chunk_delay": 0.5})  # every stream takes about 50 s

        def stream() -> None:
            with (
                httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=120) as c,
                c.stream(
                    "POST",
                    f"{served.base}/ondemand/{view['id']}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {KEY}"},
                    json={"model": "m", "stream": True, "messages": []},
                ) as resp,
            ):
                for _ in resp.iter_bytes():
                    if release.is_set():
                        return

        streams = [threading.Thread(target=stream, daemon=True) for _ in range(48)]
        for thread in streams:
            thread.start()
        with served.admin() as admin:
            until(lambda: admin.get("/host").json()["server"]["gateway_requests"] == 48, timeout=60)
            with served.gateway() as g:
                resp = g.get(f"/{view['id']}/v1/models")
            assert resp.status_code == 503 and resp.json()["error"]["code"] == "server_busy"
            assert resp.headers["connection"] == "close" and resp.headers["x-request-id"]
            page = samples(httpx.get(served.base + "/metrics", headers=admin.headers).text)
            assert value(page, "dgxmm_gateway_refusals_total", deployment="", reason="server_busy") == 1
            for _ in range(10):  # each on a new connection
                with served.admin() as fresh:
                    assert fresh.get("/host").status_code == 200
            assert admin.get(f"/deployments/{view['id']}").json()["state"] == "ready"
        release.set()
        httpx.post(engine + "/_test/config", json={"chunk_delay": 0})
        for thread in streams:
            thread.join(60)
        with served.gateway() as g:
            until(lambda: g.get(f"/{view['id']}/v1/models").status_code == 200, timeout=30)
    finally:
        release.set()
        served.stop()
