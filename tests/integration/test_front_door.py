"""The HTTP server's own limits, through real sockets: head size and field count, the head's
deadline, idle keep-alive connections, a raw '#', unparsable requests. Each refusal is a JSON
error with ``Connection: close`` (see dgxmm/front/protocol.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import time

import httpx
import pytest
from conftest import make_settings

import dgxmm.app
from dgxmm.front.limits import KEEP_ALIVE_S, MAX_HEADER_BYTES, MAX_HEADERS

pytestmark = pytest.mark.hostile  # issue 11's attacks: also run by `pytest -m hostile`


def connect(svc) -> socket.socket:
    return socket.create_connection(("127.0.0.1", svc.settings.server.port), timeout=30)


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP answer with a Content-Length body: status, headers, body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers.get("content-length", 0)):
        body += sock.recv(65536)
    return int(lines[0].split()[1]), headers, body


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


async def in_thread(fn, *args):
    return await asyncio.to_thread(fn, *args)


def request(svc, raw: bytes) -> tuple[int, dict[str, str], bytes, socket.socket]:
    sock = connect(svc)
    sock.sendall(raw)
    status, headers, body = read_answer(sock)
    return status, headers, body, sock


def head_with(size: int, fields: int = 1) -> bytes:
    """A GET of the OpenAPI schema whose head is ``size`` bytes in ``fields`` extra fields."""
    start = b"GET /dgxmm/api/openapi.json HTTP/1.1\r\nHost: x\r\n"
    room = size - len(start) - 2 - fields * len(b"x-f-000: \r\n")
    value = b"v" * (room // fields)
    return start + b"".join(b"x-f-%03d: %s\r\n" % (i, value) for i in range(fields)) + b"\r\n"


async def test_a_head_up_to_the_limit_is_served_and_one_byte_more_is_431(serve) -> None:
    svc = await serve()
    ok = head_with(MAX_HEADER_BYTES - 200, fields=10)
    status, _, _, sock = await in_thread(request, svc, ok)
    assert status == 200
    sock.close()
    big = head_with(MAX_HEADER_BYTES + 10, fields=10)
    status, headers, body, sock = await in_thread(request, svc, big)
    assert status == 431 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "request_header_fields_too_large"
    assert await in_thread(closed, sock)


async def test_a_single_endless_header_line_is_cut_at_the_limit(serve) -> None:
    svc = await serve()

    def attack() -> tuple[int, int]:
        sock = connect(svc)
        sock.sendall(b"GET /dgxmm/api/host HTTP/1.1\r\nX-Long: ")
        sent = 0
        try:
            while sent < 64 * 1024 * 1024:
                sock.sendall(b"a" * 65536)
                sent += 65536
        except OSError:
            pass
        status, _, _ = read_answer(sock)
        return status, sent

    status, sent = await in_thread(attack)
    assert status == 431 and sent < 64 * 1024 * 1024  # the server stopped reading long before


async def test_more_than_the_allowed_header_fields_is_431(serve) -> None:
    svc = await serve()
    status, _, _, sock = await in_thread(request, svc, head_with(8000, fields=MAX_HEADERS - 1))
    assert status == 200  # Host plus 99 more
    sock.close()
    status, _, body, sock = await in_thread(request, svc, head_with(8000, fields=MAX_HEADERS))
    assert status == 431 and b"header fields" in body
    assert await in_thread(closed, sock)


async def test_a_head_that_does_not_arrive_in_time_is_408(serve, tmp_path) -> None:
    svc = await serve(make_settings(tmp_path, server={"header_timeout_s": 0.5}))

    def slow(first: bytes) -> tuple[int, bytes, bool]:
        sock = connect(svc)
        sock.sendall(first)
        status, _, body = read_answer(sock)
        return status, body, closed(sock)

    for first in (
        b"",
        b"POST /dgxmm/ondemand/x/v1/chat/completions HTTP/1.1\r\n",
        b"GET /dgxmm/api/host HTTP/1.1\r\nA: b",
    ):
        status, body, was_closed = await in_thread(slow, first)
        assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout" and was_closed, first


async def test_the_head_deadline_counts_again_for_each_keep_alive_request(serve, tmp_path) -> None:
    svc = await serve(make_settings(tmp_path, server={"header_timeout_s": 0.5}))

    def two() -> tuple[int, int]:
        sock = connect(svc)
        sock.sendall(b"GET /dgxmm/api/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
        first, _, _ = read_answer(sock)
        sock.sendall(b"GET /dgxmm/api/openapi.json HTTP/1.1\r\n")  # and never the rest
        second, _, _ = read_answer(sock)
        return first, second

    assert await in_thread(two) == (200, 408)


def test_a_client_drops_an_idle_connection_before_dgxmm_does(tmp_path) -> None:
    """A client reuses a pooled connection until its own idle expiry (httpx's, which the OpenAI
    and Anthropic SDKs use, 5 s): dgxmm keeps an idle one open longer, so a request is never
    sent on a connection dgxmm is closing (at uvicorn's 5 s both clocks ran out together, and a
    request sent at 4.99 s met a closed connection: "server disconnected"). That the idle close
    happens, and when, is the next test's."""
    made = dgxmm.app.front_limits(make_settings(tmp_path).server)
    assert made.keep_alive_s == KEEP_ALIVE_S
    expiry = httpx.Limits().keepalive_expiry
    assert expiry is not None and KEEP_ALIVE_S >= 2 * expiry


@pytest.mark.bounded
async def test_the_idle_clock_runs_from_the_last_answer(serve, monkeypatch) -> None:
    """The idle timer is armed once and moved lazily (protocol.py): a connection used more often
    than its keep-alive time stays open for as long as it is used, however long that is, and
    closes keep_alive_s after its last answer, not its first."""
    keep_alive = 1.0
    made = dgxmm.app.front_limits
    monkeypatch.setattr(
        dgxmm.app, "front_limits", lambda *a, **kw: dataclasses.replace(made(*a, **kw), keep_alive_s=keep_alive)
    )
    svc = await serve()

    def used_then_idle() -> float:
        sock = connect(svc)
        deadline = time.monotonic() + 4 * keep_alive
        while True:  # one request every 0.1 s, for four keep-alive times
            last = time.monotonic()  # before the request: the server's idle clock starts later still
            sock.sendall(b"GET /dgxmm/api/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(sock)[0] == 200  # the same connection every time
            if last > deadline:
                break
            time.sleep(0.1)
        assert closed(sock)  # blocks until the server closes it
        return time.monotonic() - last

    idle = await in_thread(used_then_idle)
    assert keep_alive <= idle < keep_alive + 10  # (the upper bound only bounds a hang)


async def test_a_raw_fragment_is_refused_not_dropped(serve) -> None:
    svc = await serve()
    for target in (b"/dgxmm/ondemand/x/v1/models#frag", b"/dgxmm/api/host#x", b"/dgxmm/#"):
        status, _, body, sock = await in_thread(request, svc, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 400 and json.loads(body)["error"]["code"] == "invalid_path", target
        sock.close()


async def test_an_unparsable_request_is_a_json_400(serve) -> None:
    svc = await serve()
    status, headers, body, sock = await in_thread(request, svc, b"GET / HTTP/1.1\r\nbad header\r\n\r\n")
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    assert headers["connection"] == "close" and await in_thread(closed, sock)
