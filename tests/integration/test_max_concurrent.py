"""A deployment's ``max_concurrent`` (issue 37 item 2) through the real gateway and the test
engine as a real process: ten callers at once through ``/v1``, never more than the limit at the
engine (its own count of the most requests it ran at once), all ten answered; the others are
listed as waiting for their turn and the honest status says so; the playground waits its turn
too. The field's bad values are 422 naming it, and it changes while the model runs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, engine_command, gateway_settings, one_slot_taken, wait_until

pytestmark = pytest.mark.timeout(90)

CALLERS = 10


def router(svc: Any, address: str = "127.0.0.2") -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address=address),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    )


async def engine(svc: Any, dep_id: str, path: str, body: dict[str, Any] | None = None) -> Any:
    base = (await svc.view(dep_id))["base_url"]
    async with httpx.AsyncClient(base_url=base, timeout=10) as e:
        resp = await (e.post(path, json=body) if body is not None else e.get(path))
        return resp.json()


async def chat(r: httpx.AsyncClient, n: int) -> str:
    """One streamed chat: its text, or the status it was refused with."""
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": f"caller {n}"}]}
    async with r.stream("POST", "/chat/completions", json=body, headers={"x-request-id": f"caller-{n}"}) as resp:
        if resp.status_code != 200:
            return f"refused {resp.status_code}"
        text = ""
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                text += delta.get("content") or ""
        return text


@pytest.mark.parametrize("mode", ["on_demand", "always_on"])
async def test_max_concurrent_2_under_10_callers(serve, tmp_path: Path, mode: str) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="m", engine="command", memory_gib=1, mode=mode, max_concurrent=2, command=engine_command()
    )
    assert view["max_concurrent"] == 2
    dep_id = view["id"]
    if mode == "on_demand":
        await svc.client.post(f"/api/deployments/{dep_id}/start")
    await svc.wait_state(dep_id, "ready")
    await engine(svc, dep_id, "/_test/config", {"chunk_delay": 0.5})  # the first two hold their slots
    async with router(svc) as r:
        calls = [asyncio.create_task(chat(r, n)) for n in range(CALLERS)]
        url = f"/api/deployments/{dep_id}/waiting"

        async def all_in_line() -> list[dict[str, Any]] | None:
            rows = (await svc.client.get(url)).json()
            return rows if len(rows) == CALLERS - 2 else None

        rows = await wait_until(all_in_line, timeout=30)
        assert {row["waits_for"] for row in rows} == {"turn"}
        assert [row["place"] for row in rows] == list(range(1, CALLERS - 1))
        assert (await engine(svc, dep_id, "/_test/seats"))["running"] == 2
        status = (await svc.view(dep_id))["status"]
        assert (status["code"], status["count"], status["waiting"]) == ("serving", 2, CALLERS - 2)
        assert status["label"] == f"Serving 2, {CALLERS - 2} waiting"
        await engine(svc, dep_id, "/_test/config", {"chunk_delay": 0.02})  # let them through
        answers = await asyncio.gather(*calls)
    assert answers == ["Hello from the test engine"] * CALLERS, "all ten answered"
    seats = await engine(svc, dep_id, "/_test/seats")
    assert seats["peak"] == 2, seats
    assert (await svc.client.get(url)).json() == []
    activity = (await svc.client.get("/api/activity", params={"limit": 20})).json()
    waited = [row for row in activity if row["queued_s"] > 0]
    assert len(waited) >= CALLERS - 2 and not any(row["cold_start"] for row in waited), "a turn is no cold start"


async def test_bad_values_are_422_naming_the_field_and_it_changes_while_running(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    base = {"engine": "command", "memory_gib": 1, "mode": "on_demand", "command": engine_command()}
    for n, bad in enumerate([0, -1, 2.5, "2", True, 100_000]):
        resp = await svc.client.post("/api/deployments", json={**base, "name": f"bad{n}", "max_concurrent": bad})
        assert resp.status_code == 422 and resp.json()["error"]["field"] == "max_concurrent", (bad, resp.text)
    assert (await svc.client.get("/api/deployments")).json() == [], "nothing created"
    view = await svc.create(name="m", **base)
    assert view["max_concurrent"] is None
    await svc.client.post(f"/api/deployments/{view['id']}/start")
    await svc.wait_state(view["id"], "ready")
    patched = await svc.client.patch(f"/api/deployments/{view['id']}", json={"max_concurrent": 3})
    assert patched.status_code == 200 and patched.json()["max_concurrent"] == 3, patched.text
    bad = await svc.client.patch(f"/api/deployments/{view['id']}", json={"max_concurrent": 0})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "max_concurrent"
    cleared = await svc.client.patch(f"/api/deployments/{view['id']}", json={"max_concurrent": None})
    assert cleared.json()["max_concurrent"] is None and cleared.json()["state"] == "ready"


async def test_the_playground_takes_its_turn_too(serve, tmp_path: Path) -> None:
    """The console's playground comes through the gateway: under max_concurrent it waits its turn."""
    svc = await serve(gateway_settings(tmp_path))
    view, held = await one_slot_taken(svc)
    chat = asyncio.create_task(
        svc.client.post(
            f"/api/deployments/{view['id']}/playground", json={"messages": [{"role": "user", "content": "hi"}]}
        )
    )
    url = f"/api/deployments/{view['id']}/waiting"
    [row] = await wait_until(lambda: _rows(svc, url), timeout=15)
    assert row["waits_for"] == "turn" and not chat.done()
    held.release()
    answer = await chat
    assert answer.status_code == 200 and "Hello from the test engine" in "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in answer.text.splitlines()
        if line.startswith("data: {") and json.loads(line[6:]).get("choices")
    )


async def _rows(svc: Any, url: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = (await svc.client.get(url)).json()
    return rows
