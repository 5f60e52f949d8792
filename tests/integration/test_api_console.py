"""The admin API's parts for the operator's console, through real sockets with real engines:
changing a stopped deployment (PATCH), the honest status in views, the history endpoints, the
log follower, the host's start time, audit rows of one deployment, memory errors by name."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from conftest import caller, engine_command, gateway_settings, make_settings, sse_events, wait_until

pytestmark = pytest.mark.timeout(90)


async def test_patch_changes_a_stopped_deployment_with_the_checks_of_a_create(serve) -> None:
    svc = await serve()
    od = await svc.create(name="od", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    await svc.create(name="other", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    path = f"/api/deployments/{od['id']}"

    resp = await svc.client.patch(
        path,
        json={
            "memory_gib": 3,
            "env": {"A": "1"},
            "health_path": "/health",
            "command": [*engine_command(), "--reply", "hi"],
        },
    )
    assert resp.status_code == 200, resp.text
    view = resp.json()
    assert (view["memory_gib"], view["env"], view["health_path"]) == (3, {"A": "1"}, "/health")
    assert view["command"][-2:] == ["--reply", "hi"]
    assert view["mode"] == "on_demand" and view["state"] == "stopped"
    row = (await svc.client.get("/api/audit", params={"deployment_id": od["id"], "limit": 1})).json()[0]
    assert row["action"] == "update" and row["user"] == "admin"
    assert row["old"]["memory_gib"] == 2 and row["new"]["memory_gib"] == 3
    assert row["new"]["env"] == ["A"], "only variable names are audited"
    events = (await svc.client.get("/api/events/history", params={"deployment_id": od["id"]})).json()
    assert events[-1]["text"] == "Settings changed: command, env, health_path, memory_gib"

    # The same checks as a create, naming the field; nothing is half-changed.
    for body, status, field in (
        ({"memory_gib": 0}, 422, "memory_gib"),
        ({"engine": "llamacpp"}, 422, "model"),
        ({"name": "bad name"}, 422, "name"),
        ({"name": "other"}, 409, "name"),
        ({"health_path": "ready"}, 422, "health_path"),
        ({"colour": "red"}, 422, "colour"),
        ({"mode": "always_on"}, 422, "mode"),
        ({"role": "system"}, 422, "mode"),  # an on-demand system deployment cannot exist
    ):
        resp = await svc.client.patch(path, json=body)
        assert resp.status_code == status, (body, resp.text)
        assert resp.json()["error"]["field"] == field, body
    assert (await svc.view(od["id"]))["memory_gib"] == 3

    # Nothing that differs: nothing written, no audit row.
    before = len((await svc.client.get("/api/audit")).json())
    assert (await svc.client.patch(path, json={"memory_gib": 3})).status_code == 200
    assert len((await svc.client.get("/api/audit")).json()) == before

    # A running engine is not reconfigured under it.
    await svc.client.post(f"{path}/start")
    await svc.wait_state(od["id"], "ready")
    resp = await svc.client.patch(path, json={"memory_gib": 4})
    assert resp.status_code == 409 and "stop it before" in resp.json()["error"]["message"]
    assert (await svc.client.patch("/api/deployments/nope", json={"memory_gib": 4})).status_code == 404


async def test_views_carry_the_status_and_the_command_line(serve, tmp_path) -> None:
    svc = await serve(make_settings(tmp_path, engines={"llamacpp_bin": "/opt/llama-server"}))
    od = await svc.create(name="od", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    assert od["status"]["code"] == "cold" and od["status"]["label"] == "Cold"
    assert od["command_line"][-4:] == ["--port", "{port}", "--served-name", "od"]
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")  # the create checks the magic only (the estimate reads the rest)
    lc = await svc.create(
        name="lc", engine="llamacpp", model=str(gguf), memory_gib=1, mode="on_demand", args=["-c", "4096"]
    )
    assert lc["command_line"][:3] == ["/opt/llama-server", "-m", str(gguf)]
    assert lc["command_line"][-2:] == ["-c", "4096"]
    await svc.client.post(f"/api/deployments/{od['id']}/start")
    view = await svc.wait_state(od["id"], "ready")
    assert view["status"]["code"] == "idle" and view["status"]["until"] > view["state_changed_at"]
    port = view["command_line"][view["command_line"].index("--port") + 1]
    assert view["base_url"].endswith(f":{port}")


async def test_history_counts_requests_and_cold_starts(serve, tmp_path) -> None:
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 10}))
    od = await svc.create(
        name="od", engine="command", memory_gib=4, mode="on_demand", command=engine_command("--start-delay", "0.5")
    )
    body = {"model": "od", "messages": [{"role": "user", "content": "hi"}]}
    async with caller(svc) as gw:
        for _ in range(2):
            assert (await gw.post(f"/{od['id']}/v1/chat/completions", json=body)).status_code == 200
    history = (await svc.client.get(f"/api/deployments/{od['id']}/history")).json()
    assert len(history["minutes"]) == 60 and sum(m["requests"] for m in history["minutes"]) == 2
    (start,) = history["starts"]
    assert start["kind"] == "start" and start["outcome"] == "ready" and start["duration_s"] >= 0.5
    assert history["last_request_at"] is not None
    view = await svc.view(od["id"])
    assert view["status"]["last_cold_start_s"] == start["duration_s"]

    async def held() -> bool:
        points = (await svc.client.get("/api/host/history")).json()["points"]
        return bool(points) and points[-1]["held"] == {od["id"]: 4} and points[-1]["usable_gib"] == 10

    await wait_until(held, timeout=5)
    host = (await svc.client.get("/api/host/history")).json()
    assert host["names"][od["id"]] == "od" and host["window_s"] == 3600
    assert (await svc.client.get("/api/deployments/nope/history")).status_code == 404


async def test_history_counts_refusals_waits_and_failed_starts(serve, tmp_path) -> None:
    """Every minute says how many requests were refused and how many waited; a failed start is
    a start record with its reason (the rest of issue 13's history, through the gateway)."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 10}))
    slow = await svc.create(
        name="slow", engine="command", memory_gib=2, mode="on_demand", command=engine_command("--start-delay", "3")
    )
    broken = await svc.create(
        name="broken", engine="command", memory_gib=2, mode="on_demand", command=engine_command("--fail-start")
    )
    always = await svc.create(name="always", engine="command", memory_gib=2, command=engine_command())
    await svc.wait_state(always["id"], "ready")
    assert (await svc.client.post(f"/api/deployments/{always['id']}/stop")).status_code == 200
    await svc.wait_state(always["id"], "stopped")

    async def minutes(dep: dict[str, Any]) -> list[dict[str, Any]]:
        return (await svc.client.get(f"/api/deployments/{dep['id']}/history")).json()["minutes"]

    body = {"messages": [{"role": "user", "content": "hi"}]}
    async with caller(svc) as gw:
        waiting = asyncio.create_task(gw.post(f"/{slow['id']}/v1/chat/completions", json=body))

        async def seen_waiting() -> bool:  # the live status feeds the history every 0.5 s
            return (await minutes(slow))[-1]["queued_max"] == 1

        await wait_until(seen_waiting, timeout=10)
        failed = await gw.post(f"/{broken['id']}/v1/chat/completions", json=body)
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "start_failed"
        refused = await gw.post(f"/{always['id']}/v1/chat/completions", json=body)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_on_demand"
        assert (await waiting).status_code == 200
    for dep, requests, refusals in ((slow, 1, 0), (broken, 1, 1), (always, 1, 1)):
        counts = [(m["requests"], m["refusals"]) for m in await minutes(dep)]
        assert (sum(r for r, _ in counts), sum(f for _, f in counts)) == (requests, refusals), dep["name"]
    (start,) = (await svc.client.get(f"/api/deployments/{broken['id']}/history")).json()["starts"]
    assert start["outcome"] == "failed" and "simulated start failure" in start["reason"]
    assert start["duration_s"] is not None


async def test_follow_streams_lines_as_the_engine_writes_them(serve) -> None:
    svc = await serve()
    script = "import time\nfor i in range(600):\n    print('line', i, flush=True)\n    time.sleep(0.1)"
    dep = await svc.create(
        name="chatty", engine="command", memory_gib=1, mode="on_demand", command=[sys.executable, "-c", script]
    )
    await svc.client.post(f"/api/deployments/{dep['id']}/start")  # never healthy: it stays starting
    await wait_until(lambda: svc.ctx.deployer.runtime.log_path(dep["id"]).read_text().count("line") >= 3)
    batches: list[list[str]] = []

    async def read() -> None:
        async with svc.client.stream("GET", f"/api/deployments/{dep['id']}/logs/follow", params={"tail": 2}) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for _, data in sse_events(resp):
                batches.append(data["lines"])

    reader = asyncio.create_task(read())
    await wait_until(lambda: len(batches) >= 3, timeout=10)
    reader.cancel()
    first, *later = batches
    assert len(first) == 2 and all(line.startswith("line ") for line in first)
    numbers = [int(line.split()[1]) for batch in batches for line in batch if line.startswith("line ")]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), "no line lost or repeated"
    assert all(later), "later batches are sent only when there are new lines"
    assert (await svc.client.get("/api/deployments/nope/logs/follow")).status_code == 404


async def test_host_start_time_and_memory_errors_by_name(serve, tmp_path) -> None:
    svc = await serve(make_settings(tmp_path, memory={"capacity_gib": 10}))
    host = (await svc.client.get("/api/host")).json()
    assert host["started_at"] == svc.ctx.started_at and host["litellm"]["gateway_url"] is None
    await svc.create(name="fixed", engine="command", memory_gib=4, command=engine_command())
    resp = await svc.client.post(
        "/api/deployments", json={"name": "big", "engine": "command", "memory_gib": 8, "command": engine_command()}
    )
    assert resp.status_code == 409
    message = resp.json()["error"]["message"]
    assert (
        message == "big needs 8 GiB, 6.0 GiB free of 10.0 GiB usable, 4.0 GiB of it held by always-on "
        "and system deployments"
    )
    assert [v["name"] for v in (await svc.client.get("/api/deployments")).json()] == ["fixed"]


async def test_audit_rows_of_one_deployment(serve) -> None:
    svc = await serve()
    a = await svc.create(name="a", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    await svc.create(name="b", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    rows: list[dict[str, Any]] = (await svc.client.get("/api/audit", params={"deployment_id": a["id"]})).json()
    assert [(r["action"], r["deployment_id"]) for r in rows] == [("create", a["id"])]


async def test_joining_the_memory_queue_is_published_with_what_it_waits_for(serve, tmp_path) -> None:
    """The counts change when the request arrives, a moment before it joins the memory queue;
    that change of phase alone is published too (rate-limited with the counts)."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 10}))
    a = await svc.create(
        name="a", engine="command", memory_gib=6, mode="on_demand", command=engine_command("--start-delay", "3")
    )
    b = await svc.create(name="b", engine="command", memory_gib=6, mode="on_demand", command=engine_command())
    seen: list[dict[str, Any]] = []

    async def read() -> None:
        async with svc.client.stream("GET", "/api/events") as resp:
            async for event, data in sse_events(resp):
                if event == "deployment" and data["id"] == b["id"]:
                    seen.append(data)

    reader = asyncio.create_task(read())
    await wait_until(lambda: seen)
    body = {"model": "x", "messages": []}
    async with caller(svc) as gw:
        first = asyncio.create_task(gw.post(f"/{a['id']}/v1/chat/completions", json=body))
        await svc.wait_state(a["id"], "starting")
        second = asyncio.create_task(gw.post(f"/{b['id']}/v1/chat/completions", json=body))
        queued = await wait_until(lambda: next((v for v in seen if v["ondemand"]["phase"] == "queued"), None))
        assert queued["status"]["code"] == "queued" and queued["status"]["label"] == "Queued 1"
        assert queued["status"]["waits_for"]["kind"] == "start"
        assert [d["name"] for d in queued["status"]["waits_for"]["deployments"]] == ["a"]
        earlier = seen[: seen.index(queued)]
        assert any(v["ondemand"]["queued"] == 1 and v["ondemand"]["phase"] != "queued" for v in earlier), (
            "the count changed first, without the phase"
        )
        second.cancel()
        await asyncio.gather(first, second, return_exceptions=True)
    reader.cancel()


async def test_a_failure_reason_holds_the_failed_run_only(serve) -> None:
    """The engine's log keeps every run; the reason of a failed start quotes only the last."""
    svc = await serve()
    dep = await svc.create(
        name="broken", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--fail-start")
    )
    for _ in range(3):
        assert (await svc.client.post(f"/api/deployments/{dep['id']}/start")).status_code == 200
        failed = await svc.wait_state(dep["id"], "failed")
    reason = failed["state_reason"]
    assert reason.startswith("engine exited during start-up (exit code 1)\n")
    assert reason.count("simulated start failure") == 1 and "--- dgxmm: starting" not in reason
    lines = (await svc.client.get(f"/api/deployments/{dep['id']}/logs", params={"tail": 100})).json()["lines"]
    assert sum("simulated start failure" in line for line in lines) == 3, "the log itself keeps them all"


async def test_patch_works_out_a_vllm_memory_limit_again_with_the_checks_of_a_create(serve, tmp_path) -> None:
    svc = await serve(make_settings(tmp_path, memory={"capacity_gib": 128}, engines={"vllm_python": sys.executable}))
    dep = await svc.create(name="v", engine="vllm", model="org/model", memory_gib=32, mode="on_demand")
    assert dep["memory_limit"]["value"] == "0.25"
    path = f"/api/deployments/{dep['id']}"
    resp = await svc.client.patch(path, json={"memory_gib": 64})
    assert resp.status_code == 200 and resp.json()["memory_limit"]["value"] == "0.5"
    resp = await svc.client.patch(path, json={"args": ["--gpu-memory-utilization", "0.9"]})
    assert resp.status_code == 422 and resp.json()["error"]["field"] == "args"
    view = await svc.view(dep["id"])
    assert (view["args"], view["memory_gib"], view["memory_limit"]["value"]) == ([], 64, "0.5")
