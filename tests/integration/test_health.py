"""``GET`` and ``HEAD /health`` on the listener's root (issue 42): what load balancers, uptime
checks and guidellm ask before they send anything. Open to any peer without credentials, it says
only whether dgxmm serves, and 503 once a shutdown began."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from conftest import gateway_settings

from dgxmm.settings import Settings


async def test_health_answers_any_peer_without_a_key_and_tells_nothing_else(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    root = f"http://127.0.0.1:{svc.settings.server.port}"
    async with httpx.AsyncClient(
        base_url=root,
        timeout=10,  # 127.0.0.20 is no allowed caller of the gateway
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.20"),
    ) as c:
        got = await c.get("/health")
        head = await c.head("/health")
        posted = await c.post("/health", json={})
        under_base = await c.get("/dgxmm/health")
        metrics = await c.get("/dgxmm/metrics")
    assert got.status_code == 200 and got.json() == {"status": "ok"}
    assert got.headers["content-type"] == "application/json" and got.headers["cache-control"] == "no-store"
    assert head.status_code == 200 and head.content == b"" and head.headers["content-length"] == str(len(got.content))
    assert posted.status_code == 405 and posted.headers["allow"] == "GET, HEAD"
    assert posted.json()["error"]["code"] == "method_not_allowed"
    assert under_base.status_code == 404 and metrics.status_code == 401  # only the root's, and no more


async def test_health_is_503_once_a_shutdown_began(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    svc.app.begin_shutdown()  # what SIGTERM does first, before the server stops accepting
    async with httpx.AsyncClient(timeout=10) as c:
        resp = await c.get(f"http://127.0.0.1:{svc.settings.server.port}/health")
    assert resp.status_code == 503
    assert resp.json() == {
        "status": "shutting_down",
        "error": {"message": "dgxmm is shutting down", "type": "server_error", "code": "shutting_down"},
    }


@pytest.mark.parametrize("sections", [{"server": {"base_path": "/health"}}, {"router": {"path": "health"}}])
def test_neither_the_base_path_nor_the_router_may_take_health(sections: dict) -> None:
    with pytest.raises(ValueError, match="/health is dgxmm's health check"):
        Settings(**sections)
