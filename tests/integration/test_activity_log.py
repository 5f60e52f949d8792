"""The activity log and token metrics through the real gateway (issue 30): two requests to a cold
model give two records with the caller's x-request-id, cold_start true then false and the
engine's token counts; a stream with include_usage counts its tokens; dgxmm_tokens_total adds
up; the console's live feed gets each record; the file has them."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import pytest
from conftest import KEY, caller, engine_command, gateway_settings, sse_events, wait_until

pytestmark = pytest.mark.timeout(60)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi there"}]}


def value(page: str, name: str, **labels: str) -> float:
    found = [
        line
        for line in page.splitlines()
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return float(found[0].split()[-1])


async def test_each_request_is_recorded_with_what_it_waited_for_and_cost(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path, activity={"file": True}))
    view = await svc.create(
        name="m",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        command=engine_command("--reply", "one two three four five", "--chunk-delay", "0.01"),
    )
    live: list[dict] = []

    subscribed = asyncio.Event()

    async def follow() -> None:
        async with svc.client.stream("GET", "/api/activity/stream") as resp:
            subscribed.set()  # (the endpoint subscribes before it answers)
            async for _, data in sse_events(resp):
                live.append(data)

    feed = asyncio.create_task(follow())
    await asyncio.wait_for(subscribed.wait(), 30)
    url = f"/{view['id']}/v1/chat/completions"
    async with caller(svc) as g:
        first = await g.post(url, json=CHAT, headers={"x-request-id": "cold-1"})
        second = await g.post(url, json=CHAT, headers={"x-request-id": "warm-2"})
        async with g.stream(
            "POST",
            url,
            headers={"x-request-id": "stream-3"},
            json={**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        ) as resp:
            streamed = b"".join([chunk async for chunk in resp.aiter_raw()])
        refused = await g.post(url, json=CHAT, headers={"Authorization": "Bearer wrong", "x-request-id": "bad-4"})
    assert first.status_code == second.status_code == 200 and b'"usage"' in streamed and refused.status_code == 401
    usage = first.json()["usage"]

    records = (await svc.client.get("/api/activity")).json()
    # The refused request is counted in the refusals' summary, not recorded one by one (issue 34).
    assert [r["request_id"] for r in records] == ["stream-3", "warm-2", "cold-1"]
    cold, warm, stream = records[2], records[1], records[0]
    [bad] = (await svc.client.get("/api/activity/refused")).json()["current"]
    assert (bad["peer"], bad["status"], bad["reason"], bad["count"]) == ("127.0.0.2", 401, "invalid_api_key", 1)
    assert bad["first_request_id"] == "bad-4"
    mine = (await svc.client.get("/api/activity", params={"deployment": view["id"]})).json()
    assert mine == records
    assert (cold["cold_start"], warm["cold_start"]) == (True, False)
    assert cold["queued_s"] > 0 and warm["queued_s"] == 0 and cold["ttfb_s"] >= cold["queued_s"]
    assert (cold["prompt_tokens"], cold["completion_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert (stream["stream"], stream["completion_tokens"], stream["outcome"]) == (True, 5, "answered")
    assert stream["tokens_per_s"] is not None and stream["tokens_per_s"] > 0
    # generation tokens over generation time: from the engine's first byte, never the request's
    assert stream["tokens_per_s"] >= stream["completion_tokens"] / (stream["duration_s"] - stream["ttft_s"]) * 0.99
    assert cold["tokens_per_s"] is None and warm["tokens_per_s"] is None  # sent whole: not known
    assert all(r["served_name"] == "m" for r in mine)
    assert all(r["client"] == "127.0.0.2" for r in records)
    assert [r["request_id"] for r in (await svc.client.get("/api/activity", params={"status": 200})).json()] == [
        "stream-3",
        "warm-2",
        "cold-1",
    ]
    # Each keeps where the engine's log was as it ended: the engine's lines up to there are the
    # ones of that request (the test engine writes one per request), not the later ones'.
    assert cold["engine_log_at"] < warm["engine_log_at"] < stream["engine_log_at"]
    until_cold = (
        await svc.client.get(
            f"/api/deployments/{view['id']}/logs", params={"tail": 50, "before": cold["engine_log_at"]}
        )
    ).json()["lines"]
    assert [line for line in until_cold if "POST" in line] == ["POST /v1/chat/completions"], until_cold

    await wait_until(lambda: len(live) == 3, timeout=10)
    feed.cancel()
    assert [r["request_id"] for r in live] == ["cold-1", "warm-2", "stream-3"]
    lines = (svc.settings.server.data_dir / "activity.jsonl").read_text().splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == ["cold-1", "warm-2", "stream-3"]

    page = (await svc.client.get("/metrics")).text
    labels = {"deployment": view["id"], "served_name": "m"}
    assert value(page, "dgxmm_tokens_total", kind="completion", **labels) == 3 * usage["completion_tokens"]
    assert value(page, "dgxmm_tokens_total", kind="prompt", **labels) == 3 * usage["prompt_tokens"]
    # Only the stream has a speed: an answer sent whole gives no time of generation (issue 41).
    assert value(page, "dgxmm_generation_tokens_per_second_count", **labels) == 1


async def test_the_playground_streams_a_cold_model_through_the_gateway(serve, tmp_path: Path) -> None:
    from conftest import KEY, make_settings

    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="m",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        command=engine_command("--reply", "hello from the playground", "--chunk-delay", "0.02"),
    )
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
    playground = f"/api/deployments/{view['id']}/playground"
    async with svc.client.stream("POST", playground, json=chat) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([chunk async for chunk in resp.aiter_raw()])
    assert KEY.encode() not in raw
    events = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert text.split() == ["hello", "from", "the", "playground"] and raw.endswith(b"data: [DONE]\n\n")
    assert any(e.get("usage") for e in events)  # include_usage: the page shows tokens per second
    [record] = (await svc.client.get("/api/activity")).json()
    assert (record["client"], record["cold_start"], record["completion_tokens"]) == ("console", True, 4)
    assert record["request_id"].startswith("playground-") and (await svc.view(view["id"]))["state"] == "ready"
    # a request the console sends is checked like any other
    bad = await svc.client.post(f"/api/deployments/{view['id']}/playground", json={"messages": []})
    assert bad.status_code == 422
    # the temperature goes to the engine as given (issue 41 item 15); OpenAI's range, 0 to 2
    engine = (await svc.view(view["id"]))["base_url"]
    await svc.client.delete(f"{engine}/_test/requests")
    for temperature in (0, 1.3, 2):
        answer = await svc.client.post(playground, json={**chat, "temperature": temperature})
        assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
    sent = [json.loads(r["body"]) for r in (await svc.client.get(f"{engine}/_test/requests")).json()]
    assert [(b["temperature"], b["max_tokens"], b["model"]) for b in sent] == [
        (0, 16, "m"),
        (1.3, 16, "m"),
        (2, 16, "m"),
    ]
    for temperature in (-0.1, 2.01, "warm", None):
        refused = await svc.client.post(playground, json={**chat, "temperature": temperature})
        if temperature is None:  # absent or null: the engine's own default, nothing sent
            assert refused.status_code == 200
            continue
        assert refused.status_code == 422, refused.text
        assert "temperature" in refused.text
    last = json.loads((await svc.client.get(f"{engine}/_test/requests")).json()[-1]["body"])
    assert "temperature" not in last

    keyless = await serve(make_settings(tmp_path / "keyless"))
    other = await keyless.create(name="k", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    refused = await keyless.client.post(f"/api/deployments/{other['id']}/playground", json=chat)
    assert refused.status_code == 409 and "no key" in refused.json()["error"]["message"]


async def test_a_stream_that_queued_times_the_engines_first_token_apart_from_the_notice(serve, tmp_path: Path) -> None:
    """Issue 41: the queued notice is the caller's first byte (ttfb_s), at once; the engine's
    first token (ttft_s) came after the wait, and the console shows both."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 2}, ondemand={"idle_timeout_s": 0.5}))
    a = await svc.create(name="a", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    b = await svc.create(name="b", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    await svc.client.post(f"/api/deployments/{a['id']}/start")
    await svc.wait_state(a["id"], "ready")
    slot = await svc.ctx.ondemand.acquire(a["id"])
    body = {"model": "b", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with caller(svc) as g, g.stream("POST", f"/{b['id']}/v1/chat/completions", json=body) as resp:
        lines = resp.aiter_lines()
        first = await asyncio.wait_for(anext(lines), 10)
        assert json.loads(first[6:])["id"] == "ondemand-queued"
        await asyncio.sleep(0.5)  # queued for a while (at least: a slow machine only makes it longer)
        slot.release()
        rest = [line async for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    [record] = [r for r in (await svc.client.get("/api/activity")).json() if r["served_name"] == "b"]
    # (the sleep sets a lower bound only, which a slow machine cannot break)
    assert record["queued_s"] >= 0.5 and record["ttfb_s"] < record["queued_s"] <= record["ttft_s"]
    assert record["ttft_s"] <= record["duration_s"]


async def test_requests_are_listed_by_arrival_and_an_unknown_model_is_named(serve, tmp_path: Path, caplog) -> None:
    """Issue 41: a long stream that came first and ended last is listed below the quick request
    that came after it; a request for a model no deployment has keeps the name the caller gave,
    in its record and in dgxmm's log line."""
    caplog.set_level(logging.INFO)  # dgxmm's default log_level
    svc = await serve(gateway_settings(tmp_path))
    slow = await svc.create(
        name="slow",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        command=engine_command("--reply", "a b c d e f", "--chunk-delay", "0.3"),
    )
    quick = await svc.create(name="quick", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    for view in (slow, quick):
        await svc.client.post(f"/api/deployments/{view['id']}/start")
        await svc.wait_state(view["id"], "ready")
    router = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    )
    async with caller(svc) as g, router as r:

        async def long() -> None:
            async with g.stream(
                "POST",
                f"/{slow['id']}/v1/chat/completions",
                headers={"x-request-id": "long-1"},
                json={**CHAT, "stream": True},
            ) as resp:
                async for _ in resp.aiter_raw():
                    pass

        task = asyncio.create_task(long())
        await wait_until(lambda: svc.ctx.ondemand.status(slow["id"])["inflight"] == 1, timeout=10)
        short = await g.post(f"/{quick['id']}/v1/chat/completions", json=CHAT, headers={"x-request-id": "short-2"})
        await task
        unknown = await r.post(
            "/chat/completions", json={**CHAT, "model": "no-such\nmodel"}, headers={"x-request-id": "unknown-3"}
        )
    assert short.status_code == 200 and unknown.status_code == 404
    records = (await svc.client.get("/api/activity")).json()
    assert [r["request_id"] for r in records] == ["unknown-3", "short-2", "long-1"]
    assert records[1]["time"] > records[2]["time"] and records[1]["time"] + records[1]["duration_s"] < (
        records[2]["time"] + records[2]["duration_s"]
    )
    missing = records[0]
    assert (missing["model"], missing["served_name"], missing["outcome"]) == ("no-such?model", None, "refused")
    assert records[1]["model"] is None  # a deployment's own route: the name is the deployment's
    [line] = (await svc.client.get("/api/log", params={"q": "unknown-3"})).json()
    assert "404 model_not_found (model 'no-such?model')" in line["message"]
