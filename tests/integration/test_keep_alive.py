"""A caller's ``keep_alive`` or ``ttl`` in a ``/v1`` body (issue 53 item 2): the model's idle
timer for its next idle period, within ``[ondemand]``'s bounds (the answer's header says what
was kept, and when it was held to one), never forwarded; and a caller key without the right is
refused on ``/v1`` and on Ollama's ``/api/*`` before anything starts or reaches an engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ollama
import pytest
from conftest import caller, engine_command, gateway_settings, wait_until
from integration.test_ollama import client, raw
from integration.test_router import code_of, engine_bodies, router

MESSAGES = [{"role": "user", "content": "hi"}]


async def one_model(serve: Any, tmp_path: Path, **ondemand: Any) -> tuple[Any, dict[str, Any]]:
    svc = await serve(gateway_settings(tmp_path, ondemand={"idle_timeout_max_s": 7200, **ondemand}))
    view = await svc.create(name="chat", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    return svc, view


def idle_timeout(svc: Any, view: dict[str, Any]) -> float:
    return float(svc.ctx.ondemand.idle_timeout_of(svc.ctx.deployer.peek(view["id"])))


async def test_keep_alive_sets_the_next_idle_period_and_never_reaches_the_engine(serve, tmp_path: Path) -> None:
    svc, view = await one_model(serve, tmp_path)
    async with router(svc) as r:
        hour = await r.post("/chat/completions", json={"model": "chat", "messages": MESSAGES, "keep_alive": "1h"})
        assert hour.status_code == 200, hour.text
        assert hour.headers["x-dgxmm-keep-alive"] == "3600"
        assert idle_timeout(svc, view) == 3600, "an hour past its last request, not the deployment's 60 s"
        long = await r.post("/chat/completions", json={"model": "chat", "messages": MESSAGES, "ttl": 86400})
        assert long.headers["x-dgxmm-keep-alive"] == "7200; held to the maximum"
        assert idle_timeout(svc, view) == 7200
        streamed = await r.post(
            "/chat/completions", json={"model": "chat", "messages": MESSAGES, "stream": True, "keep_alive": 0}
        )
        assert streamed.headers["x-dgxmm-keep-alive"] == "0.5; held to the minimum" and "[DONE]" in streamed.text
        plain = await r.post("/chat/completions", json={"model": "chat", "messages": MESSAGES})
        assert "x-dgxmm-keep-alive" not in plain.headers
        assert idle_timeout(svc, view) == 60, "a request that asks nothing: the deployment's own again"
        never = await r.post("/completions", json={"model": "chat", "prompt": "x", "keep_alive": -1, "ttl": 5})
        assert never.headers["x-dgxmm-keep-alive"] == "never" and idle_timeout(svc, view) == 0
    async with caller(svc) as g:  # the per-deployment gateway takes it out too
        direct = await g.post(f"/{view['id']}/v1/chat/completions", json={"model": "chat", "ttl": 120})
    assert direct.headers["x-dgxmm-keep-alive"] == "120" and idle_timeout(svc, view) == 120
    sent = [json.loads(body) for body in await engine_bodies(await svc.view(view["id"]))]
    assert len(sent) == 6 and not any({"keep_alive", "ttl"} & set(body) for body in sent), sent
    assert sent[0] == {"model": "chat", "messages": MESSAGES}


async def test_the_reaper_keeps_to_the_callers_timer(serve, tmp_path: Path) -> None:
    svc, view = await one_model(serve, tmp_path, reaper_interval_s=0.2)
    async with router(svc) as r:
        resp = await r.post("/chat/completions", json={"model": "chat", "messages": MESSAGES, "ttl": 1})
    assert resp.status_code == 200, resp.text
    await svc.wait_state(view["id"], "stopped", timeout=60)
    texts = [e["text"] for e in svc.ctx.store.list_events(20, view["id"])]
    assert "Stopped after 1 s idle" in texts, texts  # the reaper's own word: the ttl, not the 60 s


async def test_a_bad_value_is_refused_and_nothing_starts(serve, tmp_path: Path) -> None:
    svc, view = await one_model(serve, tmp_path)
    async with router(svc) as r:
        for extra in ({"keep_alive": "soon"}, {"ttl": "1h"}, {"keep_alive": [1]}):
            resp = await r.post("/chat/completions", json={"model": "chat", "messages": MESSAGES, **extra})
            assert resp.status_code == 400 and code_of(resp) == "invalid_request", resp.text
    assert (await svc.view(view["id"]))["state"] == "stopped"


async def test_a_key_without_the_right_is_refused_on_v1_and_on_ollamas_api(serve, tmp_path: Path) -> None:
    svc, view = await one_model(serve, tmp_path)
    made = await svc.client.post("/api/keys", json={"name": "batch", "keep_alive": False})
    assert made.status_code == 201 and made.json()["keep_alive"] is False, made.text
    secret, key_id = made.json()["key"], made.json()["id"]
    async with router(svc, key=secret) as r:
        refused = await r.post("/chat/completions", json={"model": "chat", "messages": MESSAGES, "ttl": 600})
    assert refused.status_code == 403 and code_of(refused) == "keep_alive_not_allowed", refused.text
    assert "batch" in refused.json()["error"]["message"]
    c = client(svc, secret)
    for ask in (c.chat("chat", MESSAGES, keep_alive="1h"), c.generate("chat", "", keep_alive=0)):
        with pytest.raises(ollama.ResponseError) as caught:
            await ask
        assert caught.value.status_code == 403 and "keep_alive" in caught.value.error
    assert (await svc.view(view["id"]))["state"] == "stopped", "nothing started, nothing reached an engine"

    async with router(svc, key=secret) as r:  # the same key, asking nothing of the timer
        served = await r.post("/chat/completions", json={"model": "chat", "messages": MESSAGES})
    assert served.status_code == 200, served.text
    assert len(await engine_bodies(await svc.view(view["id"]))) == 1, "only the request that asked nothing"

    allowed = await svc.client.patch(f"/api/keys/{key_id}", json={"keep_alive": True})
    assert allowed.status_code == 200 and allowed.json()["keep_alive"] is True
    assert (await c.chat("chat", MESSAGES, keep_alive="1h")).message.content
    assert idle_timeout(svc, view) == 3600
    bad = await svc.client.patch(f"/api/keys/{key_id}", json={"keep_alive": None})
    assert bad.status_code == 422, bad.text


async def test_while_requests_overlap_the_longest_asked_wins(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path, ondemand={"idle_timeout_max_s": 7200}))
    view = await svc.create(
        name="chat", engine="command", memory_gib=1, mode="on_demand", command=engine_command("--chunk-delay", "0.3")
    )

    def in_flight() -> int:
        track = svc.ctx.ondemand.state.tracks.get(view["id"])
        return 0 if track is None else int(track.inflight)

    async with router(svc) as r:
        assert (await r.post("/chat/completions", json={"model": "chat", "messages": MESSAGES})).status_code == 200
        body = {"model": "chat", "messages": MESSAGES, "stream": True, "keep_alive": "2h"}
        async with r.stream("POST", "/chat/completions", json=body) as long:  # in flight until read to its end
            assert long.headers["x-dgxmm-keep-alive"] == "7200"
            await wait_until(lambda: in_flight() == 1)
            short = await r.post("/chat/completions", json={"model": "chat", "messages": MESSAGES, "ttl": 60})
            assert short.headers["x-dgxmm-keep-alive"] == "60"
            assert idle_timeout(svc, view) == 7200, "the shorter one, asked while the longer was in flight, loses"
            assert "[DONE]" in (await long.aread()).decode()
    assert idle_timeout(svc, view) == 7200


async def test_ollamas_api_says_what_it_kept_too(serve, tmp_path: Path) -> None:
    svc, view = await one_model(serve, tmp_path)
    async with raw(svc) as r:
        chat = await r.post("/api/chat", json={"model": "chat", "messages": MESSAGES, "keep_alive": "48h"})
        assert chat.status_code == 200 and chat.headers["x-dgxmm-keep-alive"] == "7200; held to the maximum"
        load = await r.post("/api/generate", json={"model": "chat", "prompt": "", "keep_alive": -1})
        assert load.json()["done_reason"] == "load" and load.headers["x-dgxmm-keep-alive"] == "never"
    assert idle_timeout(svc, view) == 0, "never for idleness"
