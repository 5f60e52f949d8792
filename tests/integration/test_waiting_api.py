"""The requests waiting now and their cancel (issue 41 item 12), through the real service: a
request waiting for its turn and one queued for memory are listed with what they wait for; a
cancel answers the caller 503 ``ondemand_cancelled`` (inside the stream after a queued notice:
an SSE error line, then [DONE]), is audited, and is 404 for a request not waiting; a viewer
token reads the list and may not cancel."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import caller, engine_command, gateway_settings, one_slot_taken, wait_until

pytestmark = pytest.mark.timeout(60)

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def sse_data(lines: list[str]) -> list[Any]:
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]" for line in lines if line.startswith("data: ")]


async def rows_of(svc: Any, count: int, deployment: str | None = None) -> list[dict[str, Any]]:
    async def listed() -> list[dict[str, Any]] | None:
        params = {"deployment": deployment} if deployment else {}
        rows = (await svc.client.get("/api/waiting", params=params)).json()
        return rows if len(rows) == count else None

    return list(await wait_until(listed, timeout=15))


async def test_a_request_waiting_for_its_turn_is_listed_and_cancelled(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view, held = await one_slot_taken(svc)  # the one request in flight
    async with caller(svc) as g:
        body = {**CHAT, "model": "m", "stream": True}
        waiting = asyncio.create_task(
            g.post(f"/{view['id']}/v1/chat/completions", json=body, headers={"x-request-id": "turn-1"})
        )
        [row] = await rows_of(svc, 1)
        assert (row["request_id"], row["deployment_id"], row["name"], row["waits_for"], row["place"]) == (
            "turn-1",
            view["id"],
            "m",
            "turn",
            1,
        )
        assert row["since"] < row["until"] and row["queued_notice"] is False
        assert (await svc.client.get(f"/api/deployments/{view['id']}/waiting")).json() == [row]
        done = await svc.client.post(f"/api/waiting/{row['id']}/cancel")
        assert done.status_code == 200 and done.json()["cancelled"]["request_id"] == "turn-1", done.text
        resp = await waiting
    assert resp.status_code == 503, resp.text  # no notice for a turn: a plain error
    assert resp.json()["error"]["code"] == "ondemand_cancelled"
    again = await svc.client.post(f"/api/waiting/{row['id']}/cancel")
    assert again.status_code == 404 and again.json()["error"]["code"] == "not_found"
    assert (await svc.client.post("/api/waiting/w999999/cancel")).status_code == 404
    assert (await svc.client.get("/api/deployments/nosuch/waiting")).status_code == 404
    [audit] = [a for a in (await svc.client.get("/api/audit")).json() if a["action"] == "cancel_request"]
    assert audit["deployment_id"] == view["id"] and "turn-1" in audit["text"] and audit["user"]
    held.release()


async def test_a_queued_stream_gets_the_cancel_as_an_sse_error(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 2}, ondemand={"idle_timeout_s": 60}))
    a = await svc.create(name="a", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    b = await svc.create(name="b", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    await svc.client.post(f"/api/deployments/{a['id']}/start")
    await svc.wait_state(a["id"], "ready")
    held = await svc.ctx.ondemand.acquire(a["id"])  # "a" is busy: "b" queues for memory
    body = {**CHAT, "model": "b", "stream": True}
    async with caller(svc) as g, g.stream("POST", f"/{b['id']}/v1/chat/completions", json=body) as resp:
        lines = resp.aiter_lines()
        first = await asyncio.wait_for(anext(lines), 10)
        assert json.loads(first[6:])["id"] == "ondemand-queued"
        [row] = await rows_of(svc, 1, b["id"])
        assert row["waits_for"] == "memory" and row["queued_notice"] is True
        assert (await svc.client.post(f"/api/waiting/{row['id']}/cancel")).status_code == 200
        rest = sse_data([line async for line in lines])
    assert rest[0]["error"]["code"] == "ondemand_cancelled" and rest[1] == "[DONE]", rest
    assert svc.ctx.ondemand.queue_ids() == [] and (await svc.view(b["id"]))["state"] == "stopped"
    held.release()


async def test_a_viewer_lists_and_may_not_cancel(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view, held = await one_slot_taken(svc)
    token = (await svc.client.post("/api/tokens", json={"name": "watch", "role": "viewer"})).json()["token"]
    async with caller(svc) as g:
        waiting = asyncio.create_task(g.post(f"/{view['id']}/v1/chat/completions", json={**CHAT, "model": "m"}))
        [row] = await rows_of(svc, 1)
        async with httpx.AsyncClient(base_url=svc.url, headers={"Authorization": f"Bearer {token}"}) as v:
            assert (await v.get("/api/waiting")).json() == [row]
            refused = await v.post(f"/api/waiting/{row['id']}/cancel")
            assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
        held.release()  # its turn: it is answered
        assert (await waiting).status_code == 200
