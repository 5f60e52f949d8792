"""The router's image, speech and reranking routes (issue 50 item 5): each reaches the engine by the body's
or the form's ``model``, through a cold start, and a binary answer of several MiB arrives byte for
byte and unbuffered (the client holds the first bytes while the engine has not written the rest).
Real sockets, the test engine as a real process."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import httpx
from conftest import KEY, engine_command, gateway_settings
from engines.testengine_media import CHUNK, speech_bytes


SIZE = 5 * 1024 * 1024


def router(svc: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),  # an allowed peer
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    )


async def engine_requests(svc: Any, dep: dict[str, Any]) -> list[dict[str, Any]]:
    view = await svc.view(dep["id"])
    async with httpx.AsyncClient() as c:
        return [r for r in (await c.get(view["base_url"] + "/_test/requests")).json() if r["method"] == "POST"]


async def test_images_reach_the_engine_by_the_body_s_and_the_form_s_model_through_a_cold_start(
    serve, tmp_path: Path
) -> None:
    svc = await serve(gateway_settings(tmp_path))
    dep = await svc.create(name="painter", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    image = bytes(range(256)) * 4096  # 1 MiB, every byte value
    async with router(svc) as r:
        generated = await r.post("/images/generations", json={"model": "painter", "prompt": "a cat", "n": 1})
        edited = await r.post(
            "/images/edits",
            data={"model": "painter", "prompt": "add a hat"},
            files={"image": ("cat.png", image, "image/png")},
        )
    assert generated.status_code == 200, generated.text
    assert generated.json()["path"] == "/v1/images/generations"
    assert edited.status_code == 200, edited.text
    assert edited.json()["path"] == "/v1/images/edits" and edited.json()["content_type"].startswith("multipart/")
    sent = await engine_requests(svc, dep)
    assert [s["path"] for s in sent] == ["/v1/images/generations", "/v1/images/edits"]
    assert json.loads(sent[0]["body"]) == {"model": "painter", "prompt": "a cat", "n": 1}
    assert image in base64.b64decode(sent[1]["body_b64"])  # the upload byte for byte


async def test_reranking_llama_server_s_name_for_rerank_reaches_the_engine_under_it(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    dep = await svc.create(name="ranker", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    body = {"model": "ranker", "query": "cats", "documents": ["a cat", "a car"]}
    async with router(svc) as r:
        answer = await r.post("/reranking", json=body)
    assert answer.status_code == 200, answer.text
    assert [(s["path"], json.loads(s["body"])) for s in await engine_requests(svc, dep)] == [("/v1/reranking", body)]


async def test_speech_streams_a_5_mib_binary_answer_byte_exact_and_unbuffered(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    dep = await svc.create(name="voice", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    body = {"model": "voice", "input": "Hello there", "voice": "alloy", "bytes": SIZE, "hold": True}
    got = bytearray()
    async with router(svc) as r, r.stream("POST", "/audio/speech", json=body) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"] == "audio/wav"
        chunks = resp.aiter_raw()
        while len(got) < CHUNK:  # the engine holds the rest until released: these came unbuffered
            got += await asyncio.wait_for(anext(chunks), timeout=30)
        view = await svc.view(dep["id"])
        async with httpx.AsyncClient() as c:
            assert (await c.post(view["base_url"] + "/_test/release")).status_code == 200
        async for chunk in chunks:
            got += chunk
    assert len(got) == SIZE and bytes(got) == speech_bytes("Hello there", SIZE)
