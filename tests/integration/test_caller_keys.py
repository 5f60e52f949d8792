"""Caller keys (issue 37): made in the admin API, used at the gateway beside the key file, with
their models, expiry, requests in flight and tokens per day; their secrets nowhere but in the
answer that made them. Through real sockets, test engines as real processes."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, engine_command, gateway_settings, wait_until

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def router(svc: Any, key: str, address: str = "127.0.0.2", header: str = "authorization") -> httpx.AsyncClient:
    auth = {"Authorization": f"Bearer {key}"} if header == "authorization" else {"x-api-key": key}
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address=address),
        headers=auth,
        timeout=30,
    )


def code_of(resp: httpx.Response) -> str:
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    return str(error["code"])


async def models(svc: Any, *names: str, flags: tuple[str, ...] = ()) -> dict[str, dict]:
    views = {}
    for name in names:
        views[name] = await svc.create(
            name=name, engine="command", memory_gib=1, mode="on_demand", command=engine_command(*flags)
        )
    return views


async def new_key(svc: Any, **body: Any) -> dict[str, Any]:
    resp = await svc.client.post("/api/keys", json=body)
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


async def test_a_key_for_some_models(serve, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    svc = await serve(gateway_settings(tmp_path))
    views = await models(svc, "a-1", "b-1")
    made = await new_key(svc, name="alice", models=["a-*"])
    secret = made["key"]
    assert made["prefix"] and secret.startswith(made["prefix"]) and made["models"] == ["a-*"]
    async with router(svc, secret) as r:
        ok = await r.post("/chat/completions", json={**CHAT, "model": "a-1"})
        assert ok.status_code == 200, ok.text
        refused = await r.post("/chat/completions", json={**CHAT, "model": "b-1"})
        assert refused.status_code == 404 and code_of(refused) == "model_not_found"
        listed = await r.get("/models")
        assert [m["id"] for m in listed.json()["data"]] == ["a-1"]
        assert (await r.get("/models/b-1")).status_code == 404
    async with router(svc, KEY) as r:  # the key file: every model
        assert {m["id"] for m in (await r.get("/models")).json()["data"]} == {"a-1", "b-1"}
    base = f"http://127.0.0.1:{svc.settings.server.port}/dgxmm/ondemand"
    async with httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"), headers={"x-api-key": secret}
    ) as g:  # the per-deployment routes too, and x-api-key
        own = await g.post(f"{base}/{views['a-1']['id']}/v1/chat/completions", json={**CHAT, "model": "a-1"})
        assert own.status_code == 200
        other = await g.post(f"{base}/{views['b-1']['id']}/v1/chat/completions", json={**CHAT, "model": "b-1"})
        assert other.status_code == 404 and code_of(other) == "model_not_found"
    assert (await svc.view(views["b-1"]["id"]))["state"] == "stopped", "nothing started for b-1"

    [listed_key] = (await svc.client.get("/api/keys")).json()
    assert "key" not in listed_key and listed_key["usage"]["total"]["requests"] == 6
    assert listed_key["usage"]["total"]["completion_tokens"] > 0 and listed_key["usage"]["last_used_at"]
    activity = (await svc.client.get("/api/activity", params={"limit": 100})).json()
    assert {row["key"] for row in activity} == {"alice", "key-file"}
    assert len((await svc.client.get("/api/activity", params={"key": "alice"})).json()) == 6
    audit = svc.ctx.store.list_audit(100)
    assert [row["action"] for row in audit if row["action"].startswith("key_")] == ["key_created"]
    metrics = (await svc.client.get("/metrics")).text
    assert 'key="alice"' in metrics

    delete = await svc.client.delete(f"/api/keys/{made['id']}")
    assert delete.status_code == 204
    async with router(svc, secret) as r:
        gone = await r.post("/chat/completions", json={**CHAT, "model": "a-1"})
        assert gone.status_code == 401 and code_of(gone) == "invalid_api_key"
    audit, events = svc.ctx.store.list_audit(1000), svc.ctx.store.list_events(1000)
    await svc.shutdown()
    seen = [
        repr(activity),
        repr(audit),
        repr(events),
        metrics,
        "\n".join(r.getMessage() for r in caplog.records),
        (tmp_path / "data" / "dgxmm.db").read_bytes().decode("latin-1"),
    ]
    assert all(secret not in text for text in seen)


async def test_an_expired_key_is_401_key_expired(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await models(svc, "a-1")
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1.5)).isoformat()
    secret = (await new_key(svc, name="brief", expires_at=soon))["key"]
    async with router(svc, secret) as r:

        async def expired() -> bool:
            resp = await r.get("/models")
            return resp.status_code == 401 and code_of(resp) == "key_expired"

        await wait_until(expired, timeout=10, interval=0.2)


async def test_max_concurrent_refuses_a_second_stream(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await models(svc, "a-1", flags=("--chunk-delay", "0.3"))
    secret = (await new_key(svc, name="one", max_concurrent=1))["key"]
    async with router(svc, secret) as r, router(svc, secret) as second:
        body = {**CHAT, "model": "a-1", "stream": True}
        async with r.stream("POST", "/chat/completions", json=body) as first:
            assert first.status_code == 200
            chunks = first.aiter_bytes()
            await anext(chunks)  # the first is streaming now
            refused = await second.post("/chat/completions", json=body)
            assert refused.status_code == 429 and code_of(refused) == "concurrency_limit"
            assert refused.headers["retry-after"] == "1"
            rest = b"".join([chunk async for chunk in chunks])
        assert b"[DONE]" in rest, "the first one completes"
        again = await second.post("/chat/completions", json={**CHAT, "model": "a-1"})
        assert again.status_code == 200


async def test_tokens_per_day_then_429_until_tomorrow(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await models(svc, "a-1")
    secret = (await new_key(svc, name="small", tokens_per_day=1))["key"]
    async with router(svc, secret) as r:
        first = await r.post("/chat/completions", json={**CHAT, "model": "a-1"})
        assert first.status_code == 200 and first.json()["usage"]["total_tokens"] > 1  # it goes over, and ends
        refused = await r.post("/chat/completions", json={**CHAT, "model": "a-1"})
        assert refused.status_code == 429 and code_of(refused) == "quota_exceeded"
        assert 1 <= int(refused.headers["retry-after"]) <= 86400


async def test_the_peer_guard_the_rate_limit_and_the_body_limit_apply_to_keys(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path, ondemand={"rate_limit_failures": 2, "max_body_bytes": 1000}))
    await models(svc, "a-1")
    secret = (await new_key(svc, name="alice"))["key"]
    async with router(svc, secret, address="127.0.0.1") as outside:
        assert (await outside.get("/models")).status_code == 404  # not an allowed peer: as if no route
    async with router(svc, secret + "x", address="127.0.0.3") as wrong:
        assert [(await wrong.get("/models")).status_code for _ in range(3)] == [401, 401, 429]
    async with router(svc, secret, address="127.0.0.3") as right:
        assert (await right.get("/models")).status_code == 200
        big = await right.post("/chat/completions", json={**CHAT, "model": "a-1", "pad": "x" * 2000})
        assert big.status_code == 413 and code_of(big) == "request_too_large"
    assert (await svc.client.get("/api/keys")).json()[0]["in_flight"] == 0


async def test_bad_input_is_422_naming_the_field(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await new_key(svc, name="taken")
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).isoformat()
    cases = [
        ({"name": "x", "colour": "red"}, "colour"),
        ({"name": ""}, "name"),
        ({"name": "taken"}, "name"),
        ({"name": "key-file"}, "name"),
        ({"name": "x", "models": ["a["]}, "models"),
        ({"name": "x", "models": [""]}, "models"),
        ({"name": "x", "max_concurrent": -1}, "max_concurrent"),
        ({"name": "x", "tokens_per_day": -5}, "tokens_per_day"),
        ({"name": "x", "expires_at": past}, "expires_at"),
        ({"name": "x", "expires_at": "tomorrow"}, "expires_at"),
        ({"name": "x", "progress": "dots"}, "progress"),
    ]
    for body, field in cases:
        resp = await svc.client.post("/api/keys", json=body)
        assert resp.status_code == 422, (body, resp.text)
        assert resp.json()["error"]["field"] == field, (body, resp.json())
    several = await svc.client.post("/api/keys", json={"name": "", "models": ["a["], "tokens_per_day": 0})
    error = several.json()["error"]
    assert several.status_code == 422 and error["field"] == error["errors"][0]["field"]
    assert sorted(e["field"] for e in error["errors"]) == ["models", "name", "tokens_per_day"]
    assert [k["name"] for k in (await svc.client.get("/api/keys")).json()] == ["taken"], "nothing created"
    [taken] = (await svc.client.get("/api/keys")).json()
    patch = await svc.client.patch(f"/api/keys/{taken['id']}", json={"max_concurrent": 0})
    assert patch.status_code == 422 and patch.json()["error"]["field"] == "max_concurrent"
    assert (await svc.client.get("/api/keys/key-nope")).status_code == 404


async def test_a_restart_keeps_keys_and_usage(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await models(svc, "a-1")
    made = await new_key(svc, name="alice", models=["a-*"], max_concurrent=2, progress="reasoning")
    assert made["progress"] == "reasoning" and (await new_key(svc, name="bob"))["progress"] == "off"
    async with router(svc, made["key"]) as r:
        assert (await r.post("/chat/completions", json={**CHAT, "model": "a-1"})).status_code == 200
    await svc.shutdown()
    again = await serve(gateway_settings(tmp_path))
    kept, bob = (await again.client.get("/api/keys")).json()
    assert kept["id"] == made["id"] and kept["usage"]["total"]["requests"] == 1 and kept["max_concurrent"] == 2
    assert (kept["progress"], bob["progress"]) == ("reasoning", "off")
    changed = await again.client.patch(f"/api/keys/{made['id']}", json={"models": ["b-*"], "progress": "off"})
    assert changed.status_code == 200 and changed.json()["models"] == ["b-*"] and changed.json()["progress"] == "off"
    async with router(again, made["key"]) as r:
        resp = await r.post("/chat/completions", json={**CHAT, "model": "a-1"})
        assert resp.status_code == 404 and code_of(resp) == "model_not_found"
