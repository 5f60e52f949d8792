"""The queued notice and hang-ups, with a real queue for memory: one slot-holding model fills the
host, so a request for another model waits until the first is idle and can be stopped."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import KEY, caller, engine_command, gateway_settings, wait_until

from dgxmm.gateway.notice import NOTICE

pytestmark = pytest.mark.timeout(60)


async def crowded(serve, tmp_path: Path, *flags: str, **ondemand: Any):
    """Capacity 2 GiB: "a" (2 GiB) is ready and holds a slot; "b" (2 GiB) has to queue."""
    svc = await serve(
        gateway_settings(tmp_path, memory={"capacity_gib": 2}, ondemand={"idle_timeout_s": 0.5, **ondemand})
    )
    a = await svc.create(name="a", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    b = await svc.create(name="b", engine="command", memory_gib=2, mode="on_demand", command=engine_command(*flags))
    await svc.client.post(f"/api/deployments/{a['id']}/start")
    await svc.wait_state(a["id"], "ready")
    slot = await svc.ctx.ondemand.acquire(a["id"])
    return svc, a, b, slot


async def queued(svc, dep_id: str) -> None:
    await wait_until(lambda: svc.ctx.ondemand.status(dep_id)["phase"] == "queued", timeout=10)


def sse_data(lines: list[str]) -> list[Any]:
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]" for line in lines if line.startswith("data: ")]


@pytest.mark.parametrize(
    "endpoint,obj", [("chat/completions", "chat.completion.chunk"), ("completions", "text_completion")]
)
async def test_streaming_request_that_queues_gets_the_notice_first(serve, tmp_path: Path, endpoint, obj) -> None:
    svc, a, b, slot = await crowded(serve, tmp_path)
    body = {"model": "b", "stream": True, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    async with caller(svc) as g, g.stream("POST", f"/{b['id']}/v1/{endpoint}", json=body) as resp:
        lines = resp.aiter_lines()
        first = await asyncio.wait_for(anext(lines), 10)  # arrives while still queued
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        assert svc.ctx.ondemand.status(b["id"])["phase"] == "queued"
        chunk = json.loads(first[6:])
        assert chunk["id"] == "ondemand-queued" and chunk["object"] == obj and chunk["model"] == "b"
        text = chunk["choices"][0]["delta"]["content"] if obj.startswith("chat") else chunk["choices"][0]["text"]
        assert text == NOTICE
        slot.release()  # "a" goes idle, is stopped to make room, "b" starts
        rest = sse_data([line async for line in lines])
    assert rest[-1] == "[DONE]" and rest[0]["id"].startswith(("chatcmpl-", "cmpl-"))
    assert (await svc.view(a["id"]))["state"] == "stopped"
    events = [e["text"] for e in svc.ctx.store.list_events(50, a["id"])]
    assert "Stopped to make room for b" in events


async def test_non_streaming_answer_gets_the_notice_prepended(serve, tmp_path: Path) -> None:
    svc, a, b, slot = await crowded(serve, tmp_path)
    async with caller(svc) as g:
        task = asyncio.create_task(g.post(f"/{b['id']}/v1/chat/completions", json={"model": "b", "messages": []}))
        await queued(svc, b["id"])
        slot.release()
        resp = await task
    assert resp.status_code == 200
    assert int(resp.headers["content-length"]) == len(resp.content)
    assert resp.json()["choices"][0]["message"]["content"] == NOTICE + "Hello from the test engine"


async def test_responses_stream_never_gets_a_notice(serve, tmp_path: Path) -> None:
    svc, a, b, slot = await crowded(serve, tmp_path)
    async with caller(svc) as g:

        async def read() -> list[str]:
            async with g.stream(
                "POST", f"/{b['id']}/v1/responses", json={"model": "b", "input": "hi", "stream": True}
            ) as resp:
                return [line async for line in resp.aiter_lines() if line]

        task = asyncio.create_task(read())
        await queued(svc, b["id"])
        slot.release()
        lines = await task
    assert lines[0] == "event: response.created"


async def test_structured_output_request_gets_no_notice(serve, tmp_path: Path) -> None:
    svc, a, b, slot = await crowded(serve, tmp_path)
    body = {"model": "b", "stream": True, "messages": [], "response_format": {"type": "json_object"}}
    async with caller(svc) as g:

        async def read() -> list[str]:
            async with g.stream("POST", f"/{b['id']}/v1/chat/completions", json=body) as resp:
                return [line async for line in resp.aiter_lines() if line]

        task = asyncio.create_task(read())
        await queued(svc, b["id"])
        slot.release()
        lines = await task
    assert "ondemand-queued" not in lines[0]


async def test_error_after_the_notice_is_an_sse_error(serve, tmp_path: Path) -> None:
    svc, a, b, slot = await crowded(serve, tmp_path, queue_timeout_s=1.5)
    async with (
        caller(svc) as g,
        g.stream(
            "POST", f"/{b['id']}/v1/chat/completions", json={"model": "b", "stream": True, "messages": []}
        ) as resp,
    ):
        data = sse_data([line async for line in resp.aiter_lines()])
    assert data[0]["id"] == "ondemand-queued"
    assert data[1]["error"]["code"] == "ondemand_queue_timeout" and data[2] == "[DONE]"
    slot.release()


async def test_responses_timeout_is_a_plain_503(serve, tmp_path: Path) -> None:
    svc, a, b, slot = await crowded(serve, tmp_path, queue_timeout_s=1)
    async with caller(svc) as g:
        resp = await g.post(f"/{b['id']}/v1/responses", json={"model": "b", "input": "x", "stream": True})
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "ondemand_queue_timeout"
    slot.release()


async def test_openai_sdk_reads_the_notice_stream_and_the_plain_answer(serve, tmp_path: Path) -> None:
    svc, a, b, slot = await crowded(serve, tmp_path)
    client = openai.AsyncOpenAI(
        api_key=KEY,
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/dgxmm/ondemand/{b['id']}/v1",
        http_client=httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")),
    )

    async def stream() -> str:
        out = await client.chat.completions.create(model="b", messages=[{"role": "user", "content": "hi"}], stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in out if c.choices])

    task = asyncio.create_task(stream())
    await queued(svc, b["id"])
    slot.release()
    assert await task == NOTICE + "Hello from the test engine"
    plain = await client.chat.completions.create(model="b", messages=[{"role": "user", "content": "hi"}])
    assert plain.choices[0].message.content == "Hello from the test engine"
    await client.close()


async def test_hang_up_while_queued_gives_everything_back(serve, tmp_path: Path) -> None:
    svc, a, b, slot = await crowded(serve, tmp_path)
    async with caller(svc) as g:
        task = asyncio.create_task(g.post(f"/{b['id']}/v1/chat/completions", json={"model": "b", "messages": []}))
        await queued(svc, b["id"])
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await wait_until(lambda: svc.ctx.ondemand.total_waiting == 0, timeout=5)
    assert svc.ctx.ondemand.queue_ids() == []
    assert svc.ctx.ondemand.status(b["id"])["queued"] == 0
    slot.release()


async def test_hang_up_while_starting_leaves_the_start_running(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="s", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--start-delay", "1")
    )
    async with caller(svc) as g:
        task = asyncio.create_task(g.post(f"/{view['id']}/v1/chat/completions", json={"messages": []}))
        await wait_until(lambda: svc.ctx.ondemand.status(view["id"])["phase"] == "starting_for_request")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await wait_until(lambda: svc.ctx.ondemand.total_waiting == 0, timeout=5)
    await svc.wait_state(view["id"], "ready")
    assert svc.ctx.ondemand.status(view["id"])["inflight"] == 0


async def test_hang_up_while_streaming_releases_the_slot_and_closes_the_engine_connection(
    serve, tmp_path: Path
) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(
        name="s", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--chunk-delay", "0.3")
    )
    await svc.client.post(f"/api/deployments/{view['id']}/start")
    ready = await svc.wait_state(view["id"], "ready")
    async with (
        caller(svc) as g,
        g.stream("POST", f"/{view['id']}/v1/chat/completions", json={"stream": True, "messages": []}) as resp,
    ):
        lines = resp.aiter_lines()
        await anext(lines)
        assert svc.ctx.ondemand.status(view["id"])["inflight"] == 1
    # The client is gone: the slot comes back and the engine's connection is closed.
    await wait_until(lambda: svc.ctx.ondemand.status(view["id"])["inflight"] == 0, timeout=5)
    async with httpx.AsyncClient() as c:

        async def closed() -> bool:
            return (await c.get(ready["base_url"] + "/_test/connections")).json()["open"] == 0

        await wait_until(closed, timeout=5)
