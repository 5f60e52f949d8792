"""Priority through the real gateway (issue 53 item 3), the test engine a real process: two
caller keys, priority 10 and 0; 50 requests of the low one wait behind a model's
``max_concurrent = 1``, the high one's next request gets the next slot, and the low ones follow
in exact arrival order. The waiting list shows each request's priority, the engine never sees
dgxmm's ``priority`` member, a request can lower its priority and never raise it, and the
activity row records it. The aging bound is the controller's, driven on its clock in
tests/unit/test_priority.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, gateway_settings, one_slot_taken, wait_until

pytestmark = pytest.mark.timeout(120)

LOW = 50


def router(svc: Any, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


async def new_key(svc: Any, name: str, priority: int) -> str:
    resp = await svc.client.post("/api/keys", json={"name": name, "priority": priority})
    assert resp.status_code == 201, resp.text
    assert resp.json()["priority"] == priority
    return str(resp.json()["key"])


def chat(n: str, **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": n}], **extra}


async def test_the_high_keys_next_request_gets_the_next_slot_past_fifty_low_ones(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view, held = await one_slot_taken(svc)
    dep_id = view["id"]
    high_key, low_key = await new_key(svc, "batch-boss", 10), await new_key(svc, "batch", 0)
    controller = svc.ctx.ondemand
    async with router(svc, high_key) as high, router(svc, low_key) as low:
        calls: dict[str, asyncio.Task[httpx.Response]] = {}
        for n in range(LOW):  # one after the other: their arrival order is known
            asked = {"priority": 5} if n == 0 else {}  # more than its key's: held to 0
            calls[f"low-{n}"] = asyncio.create_task(
                low.post("/chat/completions", json=chat(f"low {n}", **asked), headers={"x-request-id": f"low-{n}"})
            )
            await wait_until(lambda n=n: controller.total_waiting == n + 1, timeout=30)
        calls["high"] = asyncio.create_task(
            high.post(
                "/chat/completions",
                json=chat("high", priority=20),  # asks for more than its key's: 10
                headers={"x-request-id": "high"},
            )
        )
        await wait_until(lambda: controller.total_waiting == LOW + 1, timeout=30)
        rows = {r["request_id"]: r for r in (await svc.client.get(f"/api/deployments/{dep_id}/waiting")).json()}
        assert (rows["high"]["priority"], rows["high"]["place"]) == (10, 1)
        assert (rows["low-0"]["priority"], rows["low-0"]["place"]) == (0, 2)
        assert rows[f"low-{LOW - 1}"]["place"] == LOW + 1
        base = (await svc.view(dep_id))["base_url"]
        async with httpx.AsyncClient(base_url=base, timeout=10) as engine:
            await engine.delete("/_test/requests")
            held.release()
            answers = await asyncio.gather(*calls.values())
            assert [a.status_code for a in answers] == [200] * (LOW + 1)
            seen = (await engine.get("/_test/requests")).json()
    order = [entry["headers"]["x-request-id"] for entry in seen]
    assert order == ["high"] + [f"low-{n}" for n in range(LOW)]
    assert all("priority" not in json.loads(entry["body"]) for entry in seen), "dgxmm's member is stripped"
    records = {r["request_id"]: r for r in (await svc.client.get("/api/activity")).json()}
    assert (records["high"]["priority"], records["low-0"]["priority"], records["low-1"]["priority"]) == (10, 0, 0)


async def test_the_header_lowers_a_keys_priority_and_a_bad_value_is_refused(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view, held = await one_slot_taken(svc)
    key = await new_key(svc, "alice", 10)
    controller = svc.ctx.ondemand
    async with router(svc, key) as r:
        bad = await r.post("/chat/completions", json=chat("x", priority="high"))
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_request"
        assert "priority" in bad.json()["error"]["message"]
        lowered = asyncio.create_task(
            r.post("/chat/completions", json=chat("x"), headers={"x-dgxmm-priority": "3", "x-request-id": "h3"})
        )
        await wait_until(lambda: controller.total_waiting == 1, timeout=30)
        [row] = (await svc.client.get(f"/api/deployments/{view['id']}/waiting")).json()
        assert (row["request_id"], row["priority"]) == ("h3", 3)
        base = (await svc.view(view["id"]))["base_url"]
        async with httpx.AsyncClient(base_url=base, timeout=10) as engine:
            await engine.delete("/_test/requests")
            held.release()
            assert (await lowered).status_code == 200
            [seen] = (await engine.get("/_test/requests")).json()
        assert "x-dgxmm-priority" not in seen["headers"], "dgxmm's header is dgxmm's"
    async with router(svc, KEY) as r, httpx.AsyncClient(base_url=base, timeout=10) as engine:
        # The key file's (priority 0), a body past 64 KiB (looked at in a worker thread): stripped too.
        big = chat("x" * 100_000, priority=-1)
        assert (await r.post("/chat/completions", json=big, headers={"x-request-id": "big"})).status_code == 200
        seen = (await engine.get("/_test/requests")).json()[-1]
        assert seen["headers"]["x-request-id"] == "big" and "priority" not in json.loads(seen["body"])
    records = {rec["request_id"]: rec for rec in (await svc.client.get("/api/activity")).json()}
    assert records["h3"]["priority"] == 3
