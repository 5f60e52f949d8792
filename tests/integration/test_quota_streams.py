"""A caller key's tokens of the day against the test engine over real sockets (issue 47): its
streams are counted whatever the client asked, with the engine's own count, the usage chunk it
did not ask for never reaching it; a caller that hangs up is charged its reservation; the key
file's requests reach the engine as they came."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
from conftest import KEY, gateway_settings, wait_until

from integration.test_caller_keys import models, new_key, router

STREAM = {"model": "a-1", "messages": [{"role": "user", "content": "hi there"}], "stream": True}


async def engine_tokens(svc: Any, deployment_id: str) -> int:
    """Prompt and generation tokens the engine counted (its /metrics), all callers together."""
    view = await svc.view(deployment_id)
    async with httpx.AsyncClient(headers=svc.engine_auth(deployment_id)) as engine:
        text = (await engine.get(view["base_url"] + "/metrics")).text
    return sum(
        int(float(v)) for v in re.findall(r"^vllm:(?:prompt|generation)_tokens_total\{[^}]*\} (\S+)$", text, re.M)
    )


async def engine_bodies(svc: Any, deployment_id: str) -> list[dict[str, Any]]:
    view = await svc.view(deployment_id)
    async with httpx.AsyncClient(headers=svc.engine_auth(deployment_id)) as engine:
        seen = (await engine.get(view["base_url"] + "/_test/requests")).json()
    return [json.loads(entry["body"]) for entry in seen if entry["path"] == "/v1/chat/completions"]


async def key_usage(svc: Any, key_id: str) -> dict[str, Any]:
    return dict((await svc.client.get(f"/api/keys/{key_id}")).json()["usage"]["today"])


async def test_a_quota_keys_stream_is_counted_without_the_client_asking(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    views = await models(svc, "a-1")
    made = await new_key(svc, name="small", tokens_per_day=1000)
    async with router(svc, made["key"]) as r:
        plain = await r.post("/chat/completions", json=STREAM)
        asked = await r.post("/chat/completions", json={**STREAM, "stream_options": {"include_usage": True}})
    assert plain.status_code == asked.status_code == 200
    assert b'"usage"' not in plain.content and plain.content.endswith(b"data: [DONE]\n\n")
    assert asked.content.count(b'"usage"') == 1  # asked for: it gets it, once
    engine_got = await engine_bodies(svc, views["a-1"]["id"])
    assert [body["stream_options"] for body in engine_got] == [{"include_usage": True}] * 2
    usage = await key_usage(svc, made["id"])
    assert usage["requests"] == 2 and usage["prompt_tokens"] + usage["completion_tokens"] == await engine_tokens(
        svc, views["a-1"]["id"]
    )
    activity = (await svc.client.get("/api/activity", params={"key": "small"})).json()
    assert sum(row["prompt_tokens"] + row["completion_tokens"] for row in activity) == await engine_tokens(
        svc, views["a-1"]["id"]
    ), "the activity log counts as the key does"


async def test_the_key_files_stream_reaches_the_engine_as_it_came(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    views = await models(svc, "a-1")
    no_quota = await new_key(svc, name="free")
    for secret in (KEY, no_quota["key"]):
        async with router(svc, secret) as r:
            assert (await r.post("/chat/completions", json=STREAM)).status_code == 200
    assert [body.get("stream_options") for body in await engine_bodies(svc, views["a-1"]["id"])] == [None, None]


async def test_a_caller_that_hangs_up_is_charged_its_reservation(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    await models(svc, "a-1", flags=("--chunk-delay", "5"))  # the usage would come 30 s on
    made = await new_key(svc, name="quitter", tokens_per_day=100_000)
    raw = json.dumps({**STREAM, "max_tokens": 4}).encode()
    async with router(svc, made["key"]) as r:
        async with r.stream("POST", "/chat/completions", content=raw) as resp:
            assert resp.status_code == 200
            await anext(resp.aiter_bytes())  # the first chunk, then away before the usage

    async def settled() -> dict[str, Any] | None:
        key = (await svc.client.get(f"/api/keys/{made['id']}")).json()
        return key if key["in_flight"] == 0 and key["usage"]["today"]["requests"] == 1 else None

    key = await wait_until(settled, timeout=20)
    today = key["usage"]["today"]
    assert (today["prompt_tokens"], today["completion_tokens"]) == (len(raw), 4)  # the most it could have cost
