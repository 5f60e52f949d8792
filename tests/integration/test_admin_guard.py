"""The admin API checks the token before it reads a body byte, limits wrong tokens per peer
(never the right one), caps bodies, and never answers a body that cannot be parsed with a 500."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
from conftest import make_settings
from served import Served

from dgxmm.settings import ServerSettings

pytestmark = pytest.mark.hostile  # issue 11's attacks: also run by `pytest -m hostile`

BIG_BODY = 200 * 1024 * 1024


def raw_post(port: int, path: bytes, headers: bytes, body_start: bytes) -> tuple[int, bytes]:
    """Send a head (which may announce a large body) and only ``body_start``; read the answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + headers + b"\r\n" + body_start
    )
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "closed without an answer"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        body += sock.recv(65536)
    sock.close()
    return int(head.split()[1]), body


async def test_no_token_is_401_before_any_body_byte(serve) -> None:
    svc = await serve()
    port = svc.settings.server.port
    # 200 MiB announced, 1 MiB of nested brackets sent: the 401 comes without waiting for the rest.
    status, body = await asyncio.to_thread(
        raw_post, port, b"/dgxmm/api/deployments", b"Content-Length: %d\r\n" % BIG_BODY, b"[" * (1 << 20)
    )
    assert status == 401 and json.loads(body)["error"]["code"] == "unauthorized"
    status, body = await asyncio.to_thread(
        raw_post, port, b"/dgxmm/api/deployments", b"Authorization: Bearer wrong\r\nContent-Length: 9\r\n", b"{not json"
    )
    assert status == 401  # not 422: nothing about the body is looked at without the token
    resp = await svc.client.post("/api/deployments", headers={"Authorization": ""}, content=b"{not json")
    assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"


def test_wrong_tokens_get_429_after_the_limit_and_the_right_token_is_still_served(tmp_path) -> None:
    """Guesses replayed on one keep-alive connection against ``dgxmm serve`` with the default
    limit (20 a minute): 401 for the first 20, then 429 with ``Retry-After``; the right token
    from the same address is served meanwhile, a request without one is a plain 401, and another
    address is a peer of its own."""
    assert ServerSettings().admin_token_failures == 20 and ServerSettings().admin_token_window_s == 60
    served = Served(tmp_path).start()
    try:
        with httpx.Client(base_url=served.base + "/api", timeout=10) as guesser:
            answers = [guesser.get("/deployments", headers={"Authorization": f"Bearer guess-{i}"}) for i in range(200)]
            assert [a.status_code for a in answers] == [401] * 20 + [429] * 180
            locked = answers[-1]
            assert locked.json()["error"] == {
                "message": locked.json()["error"]["message"],
                "type": "rate_limit_error",
                "code": "rate_limited",
            }
            assert 1 <= int(locked.headers["retry-after"]) <= 60
            assert guesser.get("/deployments").status_code == 401  # no token: no guess, not a 429
            assert guesser.get("/deployments", headers={"Authorization": "Bearer guess"}).status_code == 429
        with served.admin() as admin:  # the right token, from the same 127.0.0.1
            assert admin.get("/deployments").status_code == 200
        other = httpx.Client(
            base_url=served.base + "/api", timeout=10, transport=httpx.HTTPTransport(local_address="127.0.0.2")
        )
        with other:
            assert other.get("/deployments", headers={"Authorization": "Bearer guess"}).status_code == 401
        assert served.log().count("127.0.0.1 sent 20 wrong admin tokens") == 1
    finally:
        served.stop()


async def test_a_body_over_the_cap_is_413_with_or_without_content_length(serve, tmp_path) -> None:
    svc = await serve(make_settings(tmp_path, server={"max_admin_body_bytes": 1000}))
    big = json.dumps({"name": "x" * 2000}).encode()
    resp = await svc.client.post("/api/deployments", content=big, headers={"content-type": "application/json"})
    assert resp.status_code == 413 and resp.json()["error"]["code"] == "request_too_large"

    async def chunked():
        yield big[:500]
        yield big[500:]

    resp = await svc.client.post("/api/deployments", content=chunked(), headers={"content-type": "application/json"})
    assert resp.status_code == 413
    # Under the cap the body reaches FastAPI as before.
    resp = await svc.client.post(
        "/api/deployments",
        json={"name": "ok", "engine": "command", "memory_gib": 1, "mode": "on_demand", "command": ["x"]},
    )
    assert resp.status_code == 201
    assert (await svc.client.get("/api/deployments")).status_code == 200  # the connection is still good


async def test_the_default_cap_is_one_mebibyte(serve) -> None:
    assert ServerSettings().max_admin_body_bytes == 1024 * 1024
    svc = await serve()
    status, _ = await asyncio.to_thread(
        raw_post,
        svc.settings.server.port,
        b"/dgxmm/api/deployments",
        b"Authorization: Bearer %s\r\nContent-Length: %d\r\n" % (svc.ctx.admin_token.encode(), 1024 * 1024 + 1),
        b"",
    )
    assert status == 413


async def test_deeply_nested_json_with_the_token_is_refused_not_a_500(serve) -> None:
    svc = await serve()
    resp = await svc.client.post(
        "/api/deployments", content=b"[" * 500_000 + b"]" * 500_000, headers={"content-type": "application/json"}
    )
    assert resp.status_code in (400, 422) and "error" in resp.json(), resp.text


async def test_schema_and_docs_need_no_token_but_only_for_get(serve) -> None:
    svc = await serve()
    async with httpx.AsyncClient(base_url=svc.url) as anon:
        assert (await anon.get("/api/openapi.json")).status_code == 200
        docs = await anon.get("/api/docs")
        assert docs.status_code == 307 and docs.headers["location"] == "/dgxmm/api.html"
        page = await anon.get("/api.html")  # dgxmm's own page, under the UI's policy: no script from elsewhere
        assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
        assert "://" not in page.text.replace("http://", "").replace("https://", "") and 'src="apidocs.js"' in page.text
        assert "cdn" not in page.text.lower()
        assert (await anon.post("/api/openapi.json", content=b"x" * 10)).status_code == 401
