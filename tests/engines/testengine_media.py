"""The test engine's routes outside OpenAI's text API: a binary answer, ``POST /v1/audio/speech``
as OpenAI-compatible speech servers answer it (Kokoro, Orpheus behind one), so a gateway's
streaming of a large binary body can be checked byte for byte and for buffering; and
llama-server's own ``/infill`` and ``/completion`` at the root.

    POST /v1/audio/speech  {"input", "bytes"?: n}  -> n bytes (default 5 MiB) of audio/wav,
                           speech_bytes(input, n); written in 64 KiB chunks. With "hold": true
                           the first chunk is written and flushed, then the rest waits for
                           POST /_test/release: a client that holds the first bytes while the
                           engine has not finished proves nothing between them buffered.
    POST /_test/release    lets the held answers go on
    POST /infill, /completion  {"stream"?: true, ...} -> {"path", "content"}, or with "stream"
                           three SSE events {"content", "stop"} as llama-server sends them
    GET /props             llama-server's shape: {"default_generation_settings": {"n_ctx", ...},
                           "total_slots", "model_path" (-m), "model_alias", "build_info":
                           "testengine", "query"}: the context is -c, or --max-model-len for -c 0
"""

from __future__ import annotations

import asyncio
import hashlib
import json

from aiohttp import web

CHUNK = 64 * 1024
DEFAULT_BYTES = 5 * 1024 * 1024


def speech_bytes(text: str, size: int) -> bytes:
    """The answer for ``text``: SHA-256 blocks of the text and a counter, ``size`` bytes (what a
    test computes to compare byte for byte)."""
    seed = text.encode()
    blocks = (hashlib.sha256(seed + i.to_bytes(8, "big")).digest() for i in range(-(-size // 32)))
    return b"".join(blocks)[:size]


async def speech(request: web.Request) -> web.StreamResponse:
    body = json.loads(await request.read() or b"{}")
    data = speech_bytes(str(body.get("input", "")), int(body.get("bytes", DEFAULT_BYTES)))
    resp = web.StreamResponse(headers={"Content-Type": "audio/wav"})
    await resp.prepare(request)
    await resp.write(data[:CHUNK])
    if body.get("hold"):
        await request.app["released"].wait()
    for at in range(CHUNK, len(data), CHUNK):
        await resp.write(data[at : at + CHUNK])
    await resp.write_eof()
    return resp


async def native(request: web.Request) -> web.StreamResponse:
    body = json.loads(await request.read() or b"{}")
    if not body.get("stream"):
        return web.json_response({"path": request.path, "content": "one two three", "stop": True})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i, word in enumerate(("one", " two", " three")):
        await resp.write(b"data: " + json.dumps({"content": word, "stop": i == 2}).encode() + b"\n\n")
    await resp.write_eof()
    return resp


async def release(request: web.Request) -> web.Response:
    request.app["released"].set()
    return web.json_response({"released": True})


async def props(request: web.Request) -> web.Response:
    args = request.app["engine"].args
    settings = {"n_ctx": args.ctx_size or args.max_model_len, "params": {"temperature": 0.8}}
    return web.json_response(
        {
            "default_generation_settings": settings,
            "total_slots": args.max_num_seqs,
            "model_path": args.model_path,
            "model_alias": args.served_name,
            "build_info": "testengine",
            "query": request.query_string,
        }
    )


def add_media(app: web.Application) -> None:
    """Before the catch-all /v1 route (aiohttp matches in the order routes were added)."""
    app["released"] = asyncio.Event()
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_post("/_test/release", release)
    app.router.add_post("/infill", native)
    app.router.add_post("/completion", native)
    app.router.add_get("/props", props)
