"""Gateway requests through raw sockets: what an HTTP/1.1 server owes a client that the gateway's
own tests do not reach, held on the one request path (uvicorn's ASGI cycle, the gateway reading
it through ``AsgiRequest``). ``Expect: 100-continue`` is answered only once the key passed, pipelined requests are
answered in order, a body may come in pieces, a target in absolute form takes the ASGI way and
gets the same answer, a HEAD gets no body, and a failure of the gateway itself is a plain 500."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx

from conftest import KEY
from integration.test_gateway_checks import CHAT, engine_requests, od_service

BODY = json.dumps(CHAT).encode()


async def connect(svc) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", svc.settings.server.port, local_addr=("127.0.0.2", 0))


def head(target: str, *lines: str, length: int = len(BODY), method: str = "POST", key: str = KEY) -> bytes:
    fields = ["Host: dgxmm:8090", f"Authorization: Bearer {key}", "Content-Type: application/json", *lines]
    if method == "POST":
        fields.append(f"Content-Length: {length}")
    return (f"{method} {target} HTTP/1.1\r\n" + "".join(f"{f}\r\n" for f in fields) + "\r\n").encode("latin-1")


async def answer(reader: asyncio.StreamReader, method: str = "POST") -> tuple[int, dict[str, str], bytes]:
    """One answer: status, headers (lowercase names), the body by its Content-Length or chunks."""
    raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    lines = raw.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    status = int(lines[0].split()[1])
    if method == "HEAD" or status in (100, 204, 304):
        return status, headers, b""
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
        body += await reader.readexactly(size)
        await reader.readexactly(2)
    await reader.readexactly(2)
    return status, headers, body


async def test_expect_100_continue_is_answered_only_once_the_key_passed(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    target = f"/dgxmm/ondemand/{view['id']}/v1/chat/completions"
    reader, writer = await connect(svc)
    writer.write(head(target, "Expect: 100-continue"))
    status, _, _ = await answer(reader)
    assert status == 100
    writer.write(BODY)
    status, _, body = await answer(reader)
    assert status == 200 and json.loads(body)["object"] == "chat.completion"
    # A wrong key: refused on the head, no 100 Continue first, and the body never asked for.
    writer.write(head(target, "Expect: 100-continue", key="sk-wrong"))
    status, _, body = await answer(reader)
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    writer.close()


async def test_pipelined_requests_are_answered_in_order(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    target = f"/dgxmm/ondemand/{view['id']}/v1/chat/completions"
    reader, writer = await connect(svc)
    writer.write(
        b"".join(head(target, f"X-Request-Id: pipelined-{i}") + BODY for i in range(3))
        + head(f"/dgxmm/ondemand/{view['id']}/v1/models", method="GET", key=KEY)
    )
    for i in range(3):
        status, headers, body = await answer(reader)
        assert (status, headers["x-request-id"]) == (200, f"pipelined-{i}")
        assert json.loads(body)["object"] == "chat.completion"
    status, _, body = await answer(reader)
    assert status == 200 and json.loads(body)["object"] == "list"
    writer.close()
    assert [r["headers"]["x-request-id"] for r in await engine_requests(view)] == [f"pipelined-{i}" for i in range(3)]


async def test_a_body_in_pieces_reaches_the_engine_whole(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * 300_000}]}).encode()
    reader, writer = await connect(svc)
    writer.write(head(f"/dgxmm/ondemand/{view['id']}/v1/chat/completions", length=len(big)))
    for start in range(0, len(big), 70_000):
        writer.write(big[start : start + 70_000])
        await writer.drain()
        await asyncio.sleep(0.05)
    status, _, _ = await answer(reader)
    writer.close()
    assert status == 200
    [seen] = await engine_requests(view)
    assert seen["body"].encode() == big  # byte for byte


async def test_a_target_in_absolute_form_gets_the_same_answer(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    port = svc.settings.server.port
    reader, writer = await connect(svc)
    for target in (
        f"http://127.0.0.1:{port}/dgxmm/ondemand/{view['id']}/v1/chat/completions",
        f"/dgxmm/ondemand/{view['id']}/v1/chat/completions",
    ):
        writer.write(head(target, "X-Request-Id: form") + BODY)
        status, headers, body = await answer(reader)
        assert (status, headers["x-request-id"]) == (200, "form") and json.loads(body)["object"] == "chat.completion"
        writer.write(head(target, key="sk-wrong") + BODY)
        status, _, body = await answer(reader)
        assert (status, json.loads(body)["error"]["code"]) == (401, "invalid_api_key")
    writer.close()
    assert len(await engine_requests(view)) == 2


async def test_a_head_request_for_a_model_gets_its_headers_and_no_body(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    reader, writer = await connect(svc)
    writer.write(head(f"/dgxmm/ondemand/{view['id']}/v1/models/m", method="HEAD"))
    status, headers, _ = await answer(reader, "HEAD")
    assert status == 200 and headers["content-type"].startswith("application/json")
    # The connection goes on: no stray body bytes came before the next answer.
    writer.write(head(f"/dgxmm/ondemand/{view['id']}/v1/models", method="GET"))
    status, _, body = await answer(reader)
    assert status == 200 and json.loads(body)["data"][0]["owned_by"] == "dgxmm"
    writer.close()


async def test_a_failure_of_the_gateway_itself_is_a_plain_500_and_a_logged_error(
    serve, tmp_path: Path, caplog, monkeypatch
) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")

    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug in the gateway")

    monkeypatch.setattr(svc.ctx.entrance.guard.inner._forwarder, "forward", broken)
    caplog.set_level(logging.ERROR, logger="uvicorn.error")
    reader, writer = await connect(svc)
    writer.write(head(f"/dgxmm/ondemand/{view['id']}/v1/chat/completions") + BODY)
    status, headers, body = await answer(reader)
    assert (status, body, headers["connection"]) == (500, b"Internal Server Error", "close")
    assert await reader.read() == b""  # closed after it
    writer.close()
    [record] = [r for r in caplog.records if r.name == "uvicorn.error" and r.levelno == logging.ERROR]
    assert record.getMessage() == "Exception in ASGI application\n" and "a bug in the gateway" in str(
        record.exc_info[1]
    )
    # The slot it held was released: the deployment is idle again.
    assert svc.ctx.ondemand.status(view["id"])["inflight"] == 0


async def test_an_answer_that_spans_reads_keeps_the_engines_length(serve, tmp_path: Path) -> None:
    """Not whole in the engine's first read: relayed as it comes, with the engine's own
    Content-Length (not turned into chunks), and every byte of it."""
    svc, view = await od_service(serve, tmp_path, state="ready")
    async with httpx.AsyncClient() as engine:  # (an argument that long could not start a process)
        await engine.post(view["base_url"] + "/_test/config", json={"reply": " ".join(["word"] * 60_000)})
    reader, writer = await connect(svc)
    writer.write(head(f"/dgxmm/ondemand/{view['id']}/v1/chat/completions") + BODY)
    status, headers, body = await answer(reader)
    writer.close()
    assert status == 200 and "transfer-encoding" not in headers and int(headers["content-length"]) == len(body)
    assert len(body) > 300_000 and json.loads(body)["choices"][0]["message"]["content"].count("word") == 60_000
