"""The whole path with a real LiteLLM proxy: registration, SDK calls through LiteLLM to the
gateway, health checks, key rotation and a mode switch.

The proxy comes from litellm_proxy.py (DGXMM_TEST_LITELLM_URL and DGXMM_TEST_LITELLM_KEY).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from conftest import engine_command, gateway_settings, wait_until
from integration.test_metrics_endpoint import samples, value
from litellm_proxy import MASTER, URL, litellm_section, model_info, needs_litellm, proxy_client, purge_instances

from dgxmm.store.db import Store

pytestmark = [pytest.mark.timeout(240), needs_litellm]


@pytest.fixture(autouse=True)
async def leave_no_entries(tmp_path: Path) -> AsyncIterator[None]:
    """The service a test started is gone afterwards: so are its entries."""
    yield
    db = tmp_path / "data" / "dgxmm.db"
    if db.exists():
        store = Store(db)
        instance = store.instance_id()
        store.close()
        await purge_instances(tmp_path, instance)


async def litellm_service(serve, tmp_path: Path):
    settings = gateway_settings(tmp_path, ondemand={"allowed_cidrs": ["127.0.0.1/32"]})
    port = settings.server.port
    settings = settings.model_copy(
        update={
            "litellm": settings.litellm.model_copy(
                update={
                    **litellm_section(tmp_path),
                    "sync_interval_s": 5,
                    "internal_url": f"http://127.0.0.1:{port}/dgxmm",
                }
            )
        }
    )
    return await serve(settings)


async def on_demand(svc, *flags: str) -> dict[str, Any]:
    name = f"od-{uuid.uuid4().hex[:8]}"
    view = await svc.create(name=name, engine="command", memory_gib=1, mode="on_demand", command=engine_command(*flags))
    await registered(svc, view["id"])
    return view


async def registered(svc, deployment_id: str) -> None:
    async def check() -> bool:
        return (await svc.view(deployment_id))["litellm"]["status"] == "registered"

    await wait_until(check, timeout=60, interval=0.5)


async def test_registration_read_back(serve, tmp_path: Path) -> None:
    svc = await litellm_service(serve, tmp_path)
    view = await on_demand(svc)
    [entry] = [e for e in await model_info() if e["model_name"] == view["served_name"]]
    params, info = entry["litellm_params"], entry["model_info"]
    assert params["api_base"] == f"{svc.url}/ondemand/{view['id']}/v1"
    assert "api_key" not in params  # LiteLLM never returns it: hence the key fingerprint
    assert params["num_retries"] == 0 and float(params["timeout"]) == 1500
    assert info["dgxmm_id"] == view["id"] and len(info["dgxmm_key_fp"]) == 12
    assert info["dgxmm_instance"] == (await svc.client.get("/api/host")).json()["instance_id"]
    assert info["health_check_params"] == {"extra_headers": {"x-dgxmm-health-check": "1"}}
    host = (await svc.client.get("/api/host")).json()
    assert host["ondemand"]["litellm_ready"] is True


async def test_openai_sdk_cold_start_through_litellm(serve, tmp_path: Path) -> None:
    svc = await litellm_service(serve, tmp_path)
    view = await on_demand(svc, "--start-delay", "1")
    assert (await svc.view(view["id"]))["state"] == "stopped"
    client = proxy_client()
    stream = await client.chat.completions.create(
        model=view["served_name"], messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Hello from the test engine"
    plain = await client.chat.completions.create(
        model=view["served_name"], messages=[{"role": "user", "content": "hi"}]
    )
    assert plain.choices[0].message.content == "Hello from the test engine"
    assert (await svc.view(view["id"]))["state"] == "ready"
    await client.close()
    # dgxmm's metrics saw one cold start and two answered requests, and its own sync's writes
    page = samples((await svc.client.get("/metrics")).text)
    mine = {"served_name": view["served_name"]}
    assert value(page, "dgxmm_ondemand_cold_start_seconds_count", **mine) == 1
    assert value(page, "dgxmm_gateway_requests_total", **mine, route="chat/completions", status_class="2xx") == 2
    assert value(page, "dgxmm_litellm_entries_written_total", operation="add") >= 1
    assert value(page, "dgxmm_litellm_last_success_timestamp_seconds") > 1.7e9
    assert value(page, "dgxmm_litellm_ready") == 1


async def test_anthropic_messages_reach_the_responses_route(serve, tmp_path: Path) -> None:
    svc = await litellm_service(serve, tmp_path)
    view = await on_demand(svc)
    client = anthropic.AsyncAnthropic(api_key=MASTER, base_url=URL, max_retries=0, timeout=120)
    kinds = []
    async with client.messages.stream(
        model=view["served_name"], max_tokens=16, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        async for event in stream:
            kinds.append(event.type)
        final = await stream.get_final_message()
    assert kinds[0] == "message_start"
    text = "".join(block.text for block in final.content if block.type == "text")
    assert "Hello" in text and "loaded on demand" not in text
    ready = await svc.view(view["id"])
    async with httpx.AsyncClient() as c:
        paths = [r["path"] for r in (await c.get(ready["base_url"] + "/_test/requests")).json()]
    assert "/v1/responses" in paths


async def test_litellm_health_does_not_wake_the_model(serve, tmp_path: Path) -> None:
    svc = await litellm_service(serve, tmp_path)
    view = await on_demand(svc)
    async with httpx.AsyncClient(timeout=120) as c:
        resp = await c.get(
            f"{URL}/health", params={"model": view["served_name"]}, headers={"Authorization": f"Bearer {MASTER}"}
        )
    assert resp.status_code == 200, resp.text
    healthy = [e.get("model") for e in resp.json()["healthy_endpoints"]]
    assert any(view["served_name"] in (m or "") for m in healthy), resp.json()
    after = await svc.view(view["id"])
    assert after["state"] == "stopped" and after["ondemand"]["last_request_at"] is None
    page = samples((await svc.client.get("/metrics")).text)
    mine = {"served_name": view["served_name"]}
    assert value(page, "dgxmm_gateway_requests_total", **mine, route="health_check", status_class="2xx") >= 1
    assert value(page, "dgxmm_ondemand_starts_total", **mine) == 0


async def test_key_rotation_re_registers_and_requests_keep_working(serve, tmp_path: Path) -> None:
    svc = await litellm_service(serve, tmp_path)
    view = await on_demand(svc)
    client = proxy_client()
    messages = [{"role": "user", "content": "hi"}]
    assert (await client.chat.completions.create(model=view["served_name"], messages=messages)).choices
    (tmp_path / "ondemand.key").write_text("sk-rotated-key\n")
    from dgxmm.gateway.keys import fingerprint

    async def rotated() -> bool:
        entries = [e for e in await model_info() if e["model_name"] == view["served_name"]]
        return [e["model_info"]["dgxmm_key_fp"] for e in entries] == [fingerprint("sk-rotated-key")]

    await wait_until(rotated, timeout=60, interval=0.5)
    for _ in range(3):
        answer = await client.chat.completions.create(model=view["served_name"], messages=messages)
        assert answer.choices[0].message.content == "Hello from the test engine"
    await client.close()


async def test_mode_switch_keeps_the_name_answering(serve, tmp_path: Path) -> None:
    svc = await litellm_service(serve, tmp_path)
    view = await on_demand(svc, "--start-delay", "1")
    client = proxy_client()
    messages = [{"role": "user", "content": "hi"}]
    failures: list[str] = []
    stop = asyncio.Event()

    async def keep_calling() -> int:
        done = 0
        while not stop.is_set():
            try:
                await client.chat.completions.create(model=view["served_name"], messages=messages)
                done += 1
            except openai.APIError as exc:
                failures.append(repr(exc))
            await asyncio.sleep(0.1)
        return done

    caller = asyncio.create_task(keep_calling())
    await asyncio.sleep(1)
    resp = await svc.client.patch(f"/api/deployments/{view['id']}/mode", json={"mode": "always_on"})
    assert resp.status_code == 200

    async def direct() -> bool:
        entries = [e for e in await model_info() if e["model_name"] == view["served_name"]]
        return [e["litellm_params"]["api_base"] for e in entries] == [(await svc.view(view["id"]))["base_url"] + "/v1"]

    await wait_until(direct, timeout=60, interval=0.5)
    await asyncio.sleep(1)
    stop.set()
    assert await caller > 0
    assert failures == []
    await client.close()
