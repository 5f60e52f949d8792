"""The controller inside the service: views carry its status, PATCH /mode, live counter events."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from conftest import engine_command, make_settings, sse_events, wait_until


async def test_views_carry_the_ondemand_status(serve) -> None:
    svc = await serve()
    od = await svc.create(name="od", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    always = await svc.create(name="al", engine="command", memory_gib=1, command=engine_command())
    assert od["ondemand"] == {"inflight": 0, "queued": 0, "last_request_at": None, "phase": "sleeping"}
    assert always["ondemand"] is None


async def test_patch_mode_switches_and_is_audited(serve, tmp_path) -> None:
    svc = await serve()
    od = await svc.create(
        name="od", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--start-delay", "0.5")
    )
    resp = await svc.client.patch(f"/api/deployments/{od['id']}/mode", json={"mode": "always_on"})
    assert resp.status_code == 200, resp.text
    view = resp.json()
    assert (view["mode"], view["pending_mode"], view["state"]) == ("on_demand", "always_on", "starting")
    ready = await svc.wait_state(od["id"], "ready")
    assert (ready["mode"], ready["pending_mode"]) == ("always_on", None)
    resp = await svc.client.patch(
        f"/api/deployments/{od['id']}/mode", json={"mode": "on_demand", "idle_timeout_s": 300}
    )
    assert resp.json()["mode"] == "on_demand" and resp.json()["idle_timeout_s"] == 300
    rows = [r for r in (await svc.client.get("/api/audit")).json() if r["action"] == "ondemand_mode"]
    assert {(r["old"]["mode"], r["new"]["mode"]) for r in rows} == {
        ("on_demand", "always_on"),
        ("always_on", "on_demand"),
    }


async def test_patch_mode_validates(serve) -> None:
    svc = await serve()
    od = await svc.create(name="od", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    for body, field in (
        ({"mode": "on_demand", "idle_timeout_s": 59}, "idle_timeout_s"),
        ({"mode": "on_demand", "idle_timeout_s": 86401}, "idle_timeout_s"),
        ({"mode": "sometimes"}, "mode"),
    ):
        resp = await svc.client.patch(f"/api/deployments/{od['id']}/mode", json=body)
        assert resp.status_code == 422 and resp.json()["error"]["field"] == field
    resp = await svc.client.patch("/api/deployments/nope/mode", json={"mode": "on_demand"})
    assert resp.status_code == 404


async def test_counter_changes_are_published_live_at_most_once_a_second(serve, tmp_path) -> None:
    svc = await serve(make_settings(tmp_path, ondemand={"counters_publish_s": 1.0}))
    od = await svc.create(name="od", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    await svc.client.post(f"/api/deployments/{od['id']}/start")
    await svc.wait_state(od["id"], "ready")
    seen: list[tuple[float, dict[str, Any]]] = []

    async def read() -> None:
        async with svc.client.stream("GET", "/api/events") as resp:
            async for event, data in sse_events(resp):
                if event == "deployment" and data["id"] == od["id"]:
                    seen.append((asyncio.get_running_loop().time(), data["ondemand"]))

    reader = asyncio.create_task(read())
    await wait_until(lambda: seen)
    controller = svc.ctx.ondemand
    slots = [await controller.acquire(od["id"]) for _ in range(5)]  # five changes at once
    await wait_until(lambda: any(s["inflight"] == 5 for _, s in seen), timeout=5)
    for slot in slots:
        slot.release()
    await wait_until(lambda: seen[-1][1]["inflight"] == 0, timeout=5)
    reader.cancel()
    # Only the events that carry new counts: a view also goes out for other news (its status
    # becoming Serving, at once since issue 30), which is not what this folds.
    changes = [seen[0]]
    for when, status in seen[1:]:
        if status["inflight"] != changes[-1][1]["inflight"]:
            changes.append((when, status))
    seen = changes
    counts = [s["inflight"] for _, s in seen[1:]]
    assert counts[0] == 1, "the first change is published at once"
    assert counts[1] == 5 and counts[-1] == 0 and len(counts) <= 4, counts
    # Changes of the counts alone are folded a second apart; the last one is also a change of
    # phase (serving to idle), which reaches the page at once (issue 30).
    times = [t for t, s in seen[1:] if s["inflight"] != 0]
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(times)), times
