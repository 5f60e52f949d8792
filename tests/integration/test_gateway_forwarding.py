"""Forwarding through the gateway: headers, byte-exact unbuffered streams, errors, health checks."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from conftest import caller, engine_command, wait_until
from integration.test_gateway_checks import CHAT, clear_requests, engine_requests, error_of, od_service

TRAFFIC = [
    "chat/completions",
    "completions",
    "embeddings",
    "responses",
    "messages",
    "chat/completions/batch",
    "audio/transcriptions",
    "audio/translations",
    "rerank",
    "score",
]


async def test_every_traffic_endpoint_is_forwarded_with_a_slot(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    async with caller(svc) as g:
        for endpoint in TRAFFIC:
            resp = await g.post(f"/{view['id']}/v1/{endpoint}?x=1", json={**CHAT, "input": "hi"})
            assert resp.status_code == 200, (endpoint, resp.text)
    seen = await engine_requests(view)
    assert [r["path"] for r in seen] == [f"/v1/{e}" for e in TRAFFIC]
    assert all(r["query"] == "x=1" for r in seen)
    assert svc.ctx.ondemand.status(view["id"])["last_request_at"] is not None


async def test_headers_removed_and_added(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    async with caller(svc) as g:
        resp = await g.post(
            f"/{view['id']}/v1/chat/completions",
            json=CHAT,
            headers={
                "Cookie": "session=1",
                "Connection": "keep-alive, X-Hop",
                "X-Hop": "secret",
                "Keep-Alive": "timeout=5",
                "TE": "trailers",
                "Accept-Encoding": "gzip, br",
                "X-Request-Id": "abc",
                "OpenAI-Beta": "assistants=v2",
                "Proxy-Authorization": "p",
                "x-dgxmm-health-check": "0",
            },
        )  # (not "1": forwarded, but the marker is removed)
    assert resp.status_code == 200
    headers = (await engine_requests(view))[0]["headers"]
    for gone in (
        "authorization",
        "cookie",
        "x-hop",
        "keep-alive",
        "te",
        "proxy-authorization",
        "x-dgxmm-health-check",
        "x-forwarded-for",
    ):
        assert gone not in headers, gone
    assert headers["accept-encoding"] == "identity"
    assert headers["x-request-id"] == "abc" and headers["openai-beta"] == "assistants=v2"
    assert headers["host"] == view["base_url"].removeprefix("http://")
    assert "server" not in resp.headers or resp.headers["server"] != "Python/3.11 aiohttp/3.14.5"
    assert not any(v.startswith(("Python", "aiohttp")) for k, v in resp.headers.items() if k == "server")


async def test_streams_are_byte_exact_and_unbuffered(serve, tmp_path: Path) -> None:
    svc, view = await od_service(
        serve, tmp_path, "--chunk-delay", "0.2", "--reply", "one two three four five", state="ready"
    )
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}

    async def read(client: httpx.AsyncClient, url: str) -> tuple[bytes, float, float]:
        start = time.monotonic()
        first = None
        data = b""
        async with client.stream("POST", url, json=body) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for chunk in resp.aiter_raw():
                first = first or time.monotonic() - start
                data += chunk
        return data, first or 0.0, time.monotonic() - start

    async with httpx.AsyncClient(timeout=30) as direct, caller(svc) as g:
        direct_bytes, _, _ = await read(direct, view["base_url"] + "/v1/chat/completions")
        via, first, total = await read(g, f"/{view['id']}/v1/chat/completions")
    normalise = lambda b: b.replace(b'"id": "chatcmpl-', b"").split(b"\n")  # noqa: E731
    assert len(via) == len(direct_bytes)
    assert [line[:40] for line in normalise(via) if b"created" not in line] == [
        line[:40] for line in normalise(direct_bytes) if b"created" not in line
    ]
    assert via.endswith(b"data: [DONE]\n\n")
    assert first < total / 2, f"first byte after {first:.2f}s of {total:.2f}s: buffered"


async def test_engine_errors_pass_through_unchanged(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    async with httpx.AsyncClient() as c:
        await c.post(view["base_url"] + "/_test/config", json={"status": 429})
        direct = await c.post(view["base_url"] + "/v1/chat/completions", json=CHAT)
    async with caller(svc) as g:
        via = await g.post(f"/{view['id']}/v1/chat/completions", json=CHAT)
    assert via.status_code == direct.status_code == 429
    assert via.content == direct.content
    assert svc.ctx.ondemand.status(view["id"])["inflight"] == 0


async def test_engine_unreachable_is_502(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    dep = svc.ctx.deployer._deps[view["id"]]
    dead = dep.runtime_handle.model_copy(update={"base_url": "http://127.0.0.1:9"})
    svc.ctx.deployer._deps[view["id"]] = dep.model_copy(update={"runtime_handle": dead})
    async with caller(svc) as g:
        resp = await g.post(f"/{view['id']}/v1/chat/completions", json=CHAT)
    assert resp.status_code == 502 and error_of(resp)["code"] == "ondemand_upstream_error"
    assert svc.ctx.ondemand.status(view["id"])["inflight"] == 0


@pytest.mark.parametrize(
    "endpoint,key",
    [
        ("chat/completions", "choices"),
        ("completions", "choices"),
        ("embeddings", "data"),
        ("responses", "output"),
        ("messages", "content"),
    ],
)
async def test_health_checks_are_answered_without_waking(serve, tmp_path: Path, endpoint: str, key: str) -> None:
    svc, view = await od_service(serve, tmp_path)
    async with caller(svc) as g:
        resp = await g.post(f"/{view['id']}/v1/{endpoint}", json=CHAT, headers={"x-dgxmm-health-check": "1"})
        assert resp.status_code == 200 and key in resp.json()
        assert resp.headers["x-dgxmm-ondemand-state"] == "stopped"
        other = await g.post(f"/{view['id']}/v1/rerank", json={}, headers={"x-dgxmm-health-check": "1"})
        assert other.status_code == 503 and error_of(other)["code"] == "ondemand_health_unsupported"
    assert (await svc.view(view["id"]))["state"] == "stopped"
    assert svc.ctx.ondemand.status(view["id"]) == {
        "inflight": 0,
        "queued": 0,
        "last_request_at": None,
        "phase": "sleeping",
    }


async def test_health_checks_are_never_forwarded_and_need_the_key(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    always = await svc.create(name="always", engine="command", memory_gib=1, command=engine_command())
    ready = await svc.wait_state(always["id"], "ready")
    await clear_requests(ready)
    async with caller(svc) as g:
        for dep in (view, always):
            resp = await g.post(f"/{dep['id']}/v1/chat/completions", json=CHAT, headers={"x-dgxmm-health-check": "1"})
            assert resp.status_code == 200 and resp.json()["id"] == "ondemand-health"
            assert resp.headers["x-dgxmm-ondemand-state"] == "ready"
    async with caller(svc, key=None) as g:
        resp = await g.post(f"/{view['id']}/v1/chat/completions", json=CHAT, headers={"x-dgxmm-health-check": "1"})
        assert resp.status_code == 401
    assert await engine_requests(view) == [] and await engine_requests(ready) == []
    assert svc.ctx.ondemand.status(view["id"])["last_request_at"] is None


async def test_health_check_of_a_failed_deployment(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, "--fail-start")
    await svc.client.post(f"/api/deployments/{view['id']}/start")
    await svc.wait_state(view["id"], "failed")
    async with caller(svc) as g:
        resp = await g.post(f"/{view['id']}/v1/chat/completions", json=CHAT, headers={"x-dgxmm-health-check": "1"})
    assert resp.status_code == 503 and error_of(resp)["code"] == "ondemand_not_ready"


async def test_cold_start_answer_is_exactly_the_engines(serve, tmp_path: Path) -> None:
    """A request that only waits for a start sends nothing until the engine answers."""
    svc, view = await od_service(serve, tmp_path, "--start-delay", "0.5")
    async with caller(svc) as g:
        async with g.stream("POST", f"/{view['id']}/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
            lines = [line async for line in resp.aiter_lines() if line]
    assert resp.status_code == 200
    assert "ondemand-queued" not in lines[0] and lines[0].startswith('data: {"id": "chatcmpl-')
    assert lines[-1] == "data: [DONE]"


async def test_queue_full_is_503_with_retry_after(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, "--start-delay", "2", ondemand={"max_queued": 1})
    async with caller(svc) as g:
        first = asyncio.create_task(g.post(f"/{view['id']}/v1/chat/completions", json=CHAT))
        while svc.ctx.ondemand.total_waiting < 1:
            await asyncio.sleep(0.02)
        resp = await g.post(f"/{view['id']}/v1/chat/completions", json=CHAT)
        assert resp.status_code == 503 and resp.headers["retry-after"] == "60"
        assert error_of(resp)["code"] == "ondemand_queue_full"
        assert (await first).status_code == 200


async def test_removed_while_waiting(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, "--start-delay", "5")
    async with caller(svc) as g:
        waiting = asyncio.create_task(g.post(f"/{view['id']}/v1/chat/completions", json=CHAT))
        while (await svc.view(view["id"]))["state"] != "starting":
            await asyncio.sleep(0.02)
        await svc.client.delete(f"/api/deployments/{view['id']}")
        resp = await waiting
    assert resp.status_code == 503 and error_of(resp)["code"] == "ondemand_stopped"


async def test_an_engine_that_dies_mid_stream_ends_the_stream_with_an_error_and_one_warning(
    serve, tmp_path: Path, caplog
) -> None:
    """The engine died between two events: the caller's stream ends with the gateway's error event
    and [DONE] (SSE clients raise it), and the log has one warning line with the request id, not
    the server's traceback of an app error."""
    svc, view = await od_service(serve, tmp_path, "--chunk-delay", "0.3", state="ready")
    caplog.set_level(logging.WARNING)
    pid = int(svc.ctx.deployer.peek(view["id"]).runtime_handle.ref)  # the process runtime's ref
    async with caller(svc) as g:
        async with g.stream(
            "POST",
            f"/{view['id']}/v1/chat/completions",
            json={**CHAT, "stream": True},
            headers={"x-request-id": "cut-1"},
        ) as resp:
            assert resp.status_code == 200
            lines = []
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    if len(lines) == 1:
                        os.kill(pid, signal.SIGKILL)
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2].removeprefix("data: "))["error"]
    assert error["code"] == "ondemand_upstream_error" and error["message"] == "the engine broke off its answer: m"
    await wait_until(lambda: svc.app.budget.gateway_requests == 0, 10)
    broke = [r for r in caplog.records if "the engine broke off its answer" in r.getMessage()]
    assert len(broke) == 1 and broke[0].request_id == "cut-1"
    assert not any("Exception in ASGI application" in r.getMessage() for r in caplog.records)
