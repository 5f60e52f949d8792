"""The model router (issue 27): one OpenAI endpoint, ``/v1``, for every model on the host, the
deployment picked by the request's ``model`` (its served name or an alias). Through real sockets,
callers bound to distinct loopback addresses, test engines as real processes."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from conftest import KEY, caller, engine_command, gateway_settings, wait_until

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def router(svc: Any, address: str = "127.0.0.2", key: str | None = KEY, **headers: str) -> httpx.AsyncClient:
    """A caller of the router from ``address``, with the key as a bearer token (or none)."""
    auth = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address=address),
        headers={**auth, **headers},
        timeout=30,
    )


async def two_models(serve: Any, tmp_path: Path, *flags: str, **sections: Any) -> tuple[Any, dict, dict]:
    """A dgxmm with two on-demand deployments: ``chat``, and ``coder`` also called ``code``."""
    svc = await serve(gateway_settings(tmp_path, **sections))
    chat = await svc.create(
        name="chat", engine="command", memory_gib=1, mode="on_demand", command=engine_command(*flags)
    )
    coder = await svc.create(
        name="coder", engine="command", memory_gib=1, mode="on_demand", aliases=["code"], command=engine_command(*flags)
    )
    return svc, chat, coder


async def states(svc: Any, *views: dict) -> list[str]:
    return [(await svc.view(view["id"]))["state"] for view in views]


async def engine_bodies(view: dict) -> list[str]:
    async with httpx.AsyncClient() as c:
        return [r["body"] for r in (await c.get(view["base_url"] + "/_test/requests")).json() if r["method"] == "POST"]


def code_of(resp: httpx.Response) -> str:
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    return str(error["code"])


async def test_the_list_names_every_model_and_alias_and_starts_nothing(serve, tmp_path: Path) -> None:
    svc, chat, coder = await two_models(serve, tmp_path)
    async with router(svc) as r:
        listed = await r.get("/models")
        one = await r.get("/models/code")
        head = await r.head("/models/code")
        unknown = await r.get("/models/nope")
    assert listed.status_code == 200 and listed.json()["object"] == "list"
    entries = {entry["id"]: entry for entry in listed.json()["data"]}
    assert list(entries) == ["chat", "code", "coder"]
    assert entries["code"]["dgxmm"] == {
        "deployment_id": coder["id"],
        "deployment": "coder",
        "served_name": "coder",
        "alias": True,
        "state": "stopped",
        "mode": "on_demand",
        "phase": "sleeping",
    }
    assert entries["code"]["status"] == {"value": "unloaded"}  # llama.cpp's word for a stopped model
    assert entries["chat"]["object"] == "model" and entries["chat"]["owned_by"] == "dgxmm"
    assert entries["chat"]["dgxmm"]["alias"] is False and entries["chat"]["dgxmm"]["deployment_id"] == chat["id"]
    assert one.status_code == 200 and one.json() == entries["code"]
    assert head.status_code == 200 and head.content == b""
    assert unknown.status_code == 404 and code_of(unknown) == "model_not_found"
    assert await states(svc, chat, coder) == ["stopped", "stopped"]


async def test_a_chat_by_name_cold_starts_that_model_only(serve, tmp_path: Path) -> None:
    svc, chat, coder = await two_models(serve, tmp_path)
    async with router(svc) as r:
        resp = await r.post("/chat/completions", json={**CHAT, "model": "coder"}, headers={"x-request-id": "r-1"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["content"] and resp.headers["x-request-id"] == "r-1"
    assert await states(svc, chat, coder) == ["stopped", "ready"]


async def test_an_alias_reaches_the_engine_under_the_served_name(serve, tmp_path: Path) -> None:
    """An engine that checks the name (vLLM) must see the one it serves; a form's field is
    replaced in place and the file around it arrives byte for byte."""
    svc, _, coder = await two_models(serve, tmp_path)
    audio = bytes(range(256)) * 64 + b"\r\n--not-the-boundary\r\n"
    async with router(svc, key=None, **{"x-api-key": KEY}) as r:  # the key as Anthropic clients send it
        chat = await r.post("/chat/completions", json={"model": "code", "n": 12345678901234567890123, **CHAT})
        heard = await r.post(
            "/audio/transcriptions",
            files={"file": ("a.wav", audio, "audio/wav")},
            data={"model": "code", "language": "en"},
        )
    assert chat.status_code == 200 and heard.status_code == 200, (chat.text, heard.text)
    ready = await svc.view(coder["id"])
    sent_chat, _ = await engine_bodies(ready)
    assert json.loads(sent_chat) == {"model": "coder", "n": 12345678901234567890123, **CHAT}
    async with httpx.AsyncClient() as c:
        [form] = [
            r
            for r in (await c.get(ready["base_url"] + "/_test/requests")).json()
            if r["path"] == "/v1/audio/transcriptions"
        ]
    import base64

    raw = base64.b64decode(form["body_b64"])
    assert b'name="model"\r\n\r\ncoder\r\n' in raw and audio in raw and b"code\r\n" not in raw.replace(b"coder", b"")


async def test_a_stream_through_the_router_is_the_engines_byte_for_byte(serve, tmp_path: Path) -> None:
    svc, _, coder = await two_models(serve, tmp_path, "--reply", "one two three four five")
    body = {**CHAT, "model": "coder", "stream": True, "stream_options": {"include_usage": True}}

    async def read(client: httpx.AsyncClient, url: str) -> bytes:
        async with client.stream("POST", url, json=body) as resp:
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            return b"".join([chunk async for chunk in resp.aiter_raw()])

    async with router(svc) as r:
        await r.post("/chat/completions", json={**CHAT, "model": "coder"})  # started: no queued notice below
        via = await read(r, "/chat/completions")
    async with httpx.AsyncClient(timeout=30) as direct:
        straight = await read(direct, (await svc.view(coder["id"]))["base_url"] + "/v1/chat/completions")
    unique = re.compile(rb'"(id|created)": ("[^"]*"|\d+)')  # per answer: its id and its time
    assert unique.sub(b"", via) == unique.sub(b"", straight) and via.endswith(b"data: [DONE]\n\n")


async def test_a_token_count_by_alias_cold_starts_its_model_and_stays_off_the_per_deployment_routes(
    serve, tmp_path: Path
) -> None:
    """Anthropic's ``messages/count_tokens`` (issue 42) is router traffic: a slot, a start when
    stopped, the served name for an alias; by deployment id it stays unreachable, as the spec says."""
    svc, chat, coder = await two_models(serve, tmp_path)
    count = {"model": "code", "messages": [{"role": "user", "content": "hi"}]}
    async with router(svc, key=None, **{"x-api-key": KEY}) as r:  # the key as Anthropic's clients send it
        counted = await r.post("/messages/count_tokens", json=count)
        fetched = await r.get("/messages/count_tokens")
    async with caller(svc) as g:
        by_id = await g.post(f"/{coder['id']}/v1/messages/count_tokens", json=count)
    assert counted.status_code == 200, counted.text
    assert counted.json()["path"] == "/v1/messages/count_tokens"
    assert [json.loads(body) for body in await engine_bodies(await svc.view(coder["id"]))] == [
        {**count, "model": "coder"}
    ]
    assert (fetched.status_code, code_of(fetched)) == (404, "not_found")
    assert (by_id.status_code, code_of(by_id)) == (404, "not_found")
    assert await states(svc, chat, coder) == ["stopped", "ready"]


async def test_refusals_come_in_the_openai_envelope_and_start_nothing(serve, tmp_path: Path) -> None:
    svc, chat, coder = await two_models(serve, tmp_path)
    async with router(svc) as r:
        unknown = await r.post("/chat/completions", json={**CHAT, "model": "gpt-4o"})
        nameless = await r.post("/chat/completions", json=CHAT)
        not_json = await r.post("/chat/completions", content=b"{oops", headers={"content-type": "application/json"})
        formless = await r.post("/audio/transcriptions", files={"file": ("a.wav", b"x", "audio/wav")})
        no_route = await r.post("/fine_tuning/jobs", json={**CHAT, "model": "chat"})
    async with router(svc, key="wrong") as r:
        wrong = await r.post("/chat/completions", json={**CHAT, "model": "chat"})
    async with router(svc, key=None) as r:
        keyless = await r.get("/models")
    async with router(svc, address="127.0.0.20") as r:  # not an allowed peer
        refused = await r.post("/chat/completions", json={**CHAT, "model": "chat"})
    assert (unknown.status_code, code_of(unknown)) == (404, "model_not_found") and "gpt-4o" in unknown.text
    assert (nameless.status_code, code_of(nameless)) == (400, "missing_model")
    assert (not_json.status_code, code_of(not_json)) == (400, "invalid_json")
    assert (formless.status_code, code_of(formless)) == (400, "missing_model")
    assert (no_route.status_code, code_of(no_route)) == (404, "not_found")
    assert (wrong.status_code, code_of(wrong)) == (401, "invalid_api_key")
    assert (keyless.status_code, code_of(keyless)) == (401, "invalid_api_key")
    assert (refused.status_code, code_of(refused)) == (404, "not_found") and "x-request-id" not in refused.headers
    assert await states(svc, chat, coder) == ["stopped", "stopped"]


async def test_an_always_on_model_is_forwarded_when_ready_and_refused_with_retry_after_when_not(
    serve, tmp_path: Path
) -> None:
    svc = await serve(gateway_settings(tmp_path))
    always = await svc.create(name="always", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(always["id"], "ready")
    async with router(svc) as r:
        served = await r.post("/chat/completions", json={**CHAT, "model": "always"})
        await svc.client.post(f"/api/deployments/{always['id']}/stop")
        stopped = await r.post("/chat/completions", json={**CHAT, "model": "always"})
        listed = (await r.get("/models")).json()["data"]
    assert served.status_code == 200
    assert stopped.status_code == 503 and code_of(stopped) == "not_on_demand" and stopped.headers["retry-after"]
    assert listed[0]["dgxmm"]["mode"] == "always_on" and listed[0]["dgxmm"]["phase"] is None


async def test_a_system_deployment_is_served_like_an_always_on_one_and_the_decider_never(serve, tmp_path: Path) -> None:
    """What docs/api.md's ``role`` says: a ``system`` deployment is listed and forwarded (by name
    and by id) while ready, as the spec's always-on rule has it; only the decision model is
    refused, and never listed."""
    svc = await serve(gateway_settings(tmp_path))
    system = await svc.create(name="guard", engine="command", memory_gib=1, role="system", command=engine_command())
    decider = await svc.create(name="decider", engine="command", memory_gib=1, role="decider", command=engine_command())
    await svc.wait_state(system["id"], "ready")
    await svc.wait_state(decider["id"], "ready")
    async with router(svc) as r, caller(svc) as g:
        listed = [entry["id"] for entry in (await r.get("/models")).json()["data"]]
        by_name = await r.post("/chat/completions", json={**CHAT, "model": "guard"})
        by_id = await g.post(f"/{system['id']}/v1/chat/completions", json={**CHAT, "model": "guard"})
        decided = await r.post("/chat/completions", json={**CHAT, "model": "decider"})
        await svc.client.post(f"/api/deployments/{system['id']}/stop")
        stopped = await r.post("/chat/completions", json={**CHAT, "model": "guard"})
    assert listed == ["guard"]
    assert by_name.status_code == 200 and by_id.status_code == 200
    assert decided.status_code == 404 and code_of(decided) == "model_not_found"
    assert stopped.status_code == 503 and code_of(stopped) == "not_on_demand"
    assert (await svc.view(system["id"]))["state"] == "stopped", "never started by the gateway"


async def test_the_openai_sdk_lists_chats_streams_and_embeds_through_the_router(serve, tmp_path: Path) -> None:
    svc, _, _ = await two_models(serve, tmp_path, "--reply", "hello there")
    http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"))
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1", api_key=KEY, http_client=http, max_retries=0
    )
    async with client:
        names = sorted([model.id async for model in client.models.list()])
        answer = await client.chat.completions.create(model="chat", messages=CHAT["messages"])  # type: ignore[arg-type]
        stream = await client.chat.completions.create(model="code", messages=CHAT["messages"], stream=True)  # type: ignore[arg-type]
        words = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
        vectors = await client.embeddings.create(model="chat", input=["a", "b"])
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(model="nope", messages=CHAT["messages"])  # type: ignore[arg-type]
    assert missing.value.code == "model_not_found"
    assert names == ["chat", "code", "coder"]
    assert answer.choices[0].message.content and "hello" in answer.choices[0].message.content
    assert "hello" in words
    assert len(vectors.data) == 2 and vectors.data[0].embedding


async def test_names_are_unique_on_a_host_and_a_clash_leaves_nothing_behind(serve, tmp_path: Path) -> None:
    svc, chat, coder = await two_models(serve, tmp_path)
    before = (await svc.client.get("/api/deployments")).json()
    clashes = [
        await svc.client.post(
            "/api/deployments",
            json={
                "name": "third",
                "served_name": "code",
                "engine": "command",
                "memory_gib": 1,
                "command": engine_command(),
            },
        ),
        await svc.client.post(
            "/api/deployments",
            json={
                "name": "fourth",
                "aliases": ["chat"],
                "engine": "command",
                "memory_gib": 1,
                "command": engine_command(),
            },
        ),
        await svc.client.patch(f"/api/deployments/{chat['id']}", json={"aliases": ["x", "coder"]}),
        await svc.client.patch(f"/api/deployments/{chat['id']}", json={"served_name": "code"}),
    ]
    expected = [("served_name", coder), ("aliases", chat), ("aliases", coder), ("served_name", coder)]
    for resp, (field, other) in zip(clashes, expected, strict=True):
        assert resp.status_code == 422, resp.text
        error = resp.json()["error"]
        assert error["field"] == field and f"{other['name']} (id {other['id']})" in error["message"]
    own = await svc.client.post(
        "/api/deployments",
        json={"name": "fifth", "aliases": ["fifth"], "engine": "command", "memory_gib": 1, "command": engine_command()},
    )
    assert own.status_code == 422 and own.json()["error"]["field"] == "aliases"
    assert (await svc.client.get("/api/deployments")).json() == before
    assert (await svc.client.get("/api/audit")).json()[0]["action"] == "create"  # no change was recorded


async def test_aliases_change_while_the_model_runs_and_route_at_once(serve, tmp_path: Path) -> None:
    svc, chat, _ = await two_models(serve, tmp_path)
    async with router(svc) as r:
        assert (await r.post("/chat/completions", json={**CHAT, "model": "chat"})).status_code == 200
        changed = await svc.client.patch(f"/api/deployments/{chat['id']}", json={"aliases": ["talk"]})
        assert changed.status_code == 200 and changed.json()["aliases"] == ["talk"]
        assert changed.json()["state"] == "ready"  # the engine was not touched
        assert (await r.post("/chat/completions", json={**CHAT, "model": "talk"})).status_code == 200
        renamed = await svc.client.patch(f"/api/deployments/{chat['id']}", json={"served_name": "talker"})
        assert renamed.status_code == 409  # the engine serves its served name: stop it first
        await svc.client.patch(f"/api/deployments/{chat['id']}", json={"aliases": []})
        gone = await r.post("/chat/completions", json={**CHAT, "model": "talk"})
    assert gone.status_code == 404 and code_of(gone) == "model_not_found"


async def test_the_router_can_be_moved_or_turned_off(serve, tmp_path: Path) -> None:
    for part in ("a", "b"):
        (tmp_path / part).mkdir()
    svc = await serve(gateway_settings(tmp_path / "a", router={"path": "/openai/v1"}))
    await svc.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}",
        timeout=30,
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
    ) as c:
        moved = await c.get("/openai/v1/models")
        old = await c.get("/v1/models")
    assert moved.status_code == 200 and [m["id"] for m in moved.json()["data"]] == ["m"]
    assert old.status_code == 404
    off = await serve(gateway_settings(tmp_path / "b", router={"enabled": False}))
    async with router(off) as r:
        assert (await r.get("/models")).status_code == 404


async def test_the_list_tells_each_model_load_state_as_llama_cpp_s_router_does(serve, tmp_path: Path) -> None:
    """Issue 50 item 1: ``unloaded`` while stopped, ``loading`` from the moment a request waits
    for its start, ``loaded`` once it serves, ``unloaded`` with ``failed: true`` after a start
    that failed; reading the list starts nothing."""
    svc = await serve(gateway_settings(tmp_path))
    slow = await svc.create(
        name="slow", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--start-delay", "4")
    )
    broken = await svc.create(
        name="broken", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--fail-start")
    )

    async with router(svc) as r:

        async def status_of(name: str) -> dict[str, Any]:
            return dict((await r.get(f"/models/{name}")).json()["status"])

        assert await status_of("slow") == {"value": "unloaded"}
        first = asyncio.create_task(r.post("/chat/completions", json={**CHAT, "model": "slow"}))

        async def loading() -> bool:
            return (await status_of("slow"))["value"] == "loading"

        await wait_until(loading, timeout=20)
        assert (await first).status_code == 200
        assert await status_of("slow") == {"value": "loaded"}
        failed = await r.post("/chat/completions", json={**CHAT, "model": "broken"})
        assert failed.status_code >= 500
        await svc.wait_state(broken["id"], "failed")
        listed = {entry["id"]: entry["status"] for entry in (await r.get("/models")).json()["data"]}
    assert listed == {"slow": {"value": "loaded"}, "broken": {"value": "unloaded", "failed": True}}
    assert await states(svc, slow) == ["ready"]
