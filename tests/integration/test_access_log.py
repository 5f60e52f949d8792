"""Access lines and failure lines of the served gateway and admin API (issue 13): one line per
request with the request's fields; never a query string or a key."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import KEY, caller, engine_command, gateway_settings
from integration.test_gateway_checks import CHAT, od_service

SECRET = "sk-in-the-query"


def lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger]


async def test_gateway_lines_carry_the_request_and_never_a_key(serve, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="dgxmm")
    svc, view = await od_service(serve, tmp_path, state="ready")
    async with caller(svc) as g:
        ok = await g.post(
            f"/{view['id']}/v1/chat/completions?api_key={SECRET}", json=CHAT, headers={"X-Request-Id": "r-ok"}
        )
    async with caller(svc, "127.0.0.3", key=SECRET) as bad:
        refused = await bad.post(f"/{view['id']}/v1/chat/completions?key={SECRET}", json=CHAT)
    await svc.client.get("/api/deployments", params={"token": SECRET})
    assert ok.status_code == 200 and refused.status_code == 401
    access = lines(caplog, "dgxmm.access")
    texts = [r.getMessage() for r in access]
    path = f"/dgxmm/ondemand/{view['id']}/v1/chat/completions"
    assert any(t.startswith(f"POST {path} 200 ") for t in texts), texts
    assert any(t.startswith(f"POST {path} 401 invalid_api_key ") for t in texts), texts
    assert any(t.startswith("GET /dgxmm/api/deployments 200 ") for t in texts), texts
    served = next(r for r in access if r.getMessage().startswith(f"POST {path} 200"))
    assert (served.request_id, served.peer, served.deployment, served.served_name) == (
        "r-ok",
        "127.0.0.2",
        view["id"],
        "m",
    )
    denied = next(r for r in access if " 401 " in r.getMessage())
    assert denied.request_id == refused.headers["x-request-id"] and denied.peer == "127.0.0.3"
    # What the server logged (dgxmm's and uvicorn's loggers), not the test's own HTTP client: httpx
    # logs its requests' URLs at INFO, which a test run earlier in the process may have let through.
    server = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    everything = "\n".join(r.getMessage() + repr(r.__dict__) for r in server)
    assert SECRET not in everything and KEY not in everything and "?" not in "\n".join(texts)


async def test_a_failed_request_is_a_warning_with_its_request_id(serve, tmp_path: Path, caplog) -> None:
    svc = await serve(gateway_settings(tmp_path, ondemand={"max_queued": 0}))
    view = await svc.create(name="q", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    async with caller(svc) as g:
        resp = await g.post(f"/{view['id']}/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "r-full"})
    assert resp.status_code == 503 and resp.headers["x-request-id"] == "r-full"
    warning = next(r for r in lines(caplog, "dgxmm.gateway.refusal") if r.levelno == logging.WARNING)
    assert warning.getMessage().startswith("request failed: ondemand_queue_full")
    assert (warning.request_id, warning.deployment, warning.served_name, warning.peer) == (
        "r-full",
        view["id"],
        "q",
        "127.0.0.2",
    )


async def test_a_control_character_in_a_path_is_logged_escaped(serve, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="dgxmm.access")
    svc, view = await od_service(serve, tmp_path)
    async with caller(svc) as g:
        resp = await g.get(f"/{view['id']}/v1/models%0a2026-01-01 fake line")
    assert resp.status_code == 400
    text = next(r.getMessage() for r in lines(caplog, "dgxmm.access") if " 400 " in r.getMessage())
    assert "\n" not in text and "\\x0a2026-01-01 fake line" in text
