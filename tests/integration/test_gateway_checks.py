"""Gateway checks in the spec's order, through real sockets, callers bound to distinct addresses."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from conftest import KEY, caller, engine_command, gateway_settings, wait_until

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def od_service(serve, tmp_path: Path, *flags: str, state: str = "stopped", **sections):
    svc = await serve(gateway_settings(tmp_path, **sections))
    view = await svc.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command(*flags))
    if state == "ready":
        await svc.client.post(f"/api/deployments/{view['id']}/start")
        view = await svc.wait_state(view["id"], "ready")
        await clear_requests(view)
    return svc, view


async def clear_requests(view: dict) -> None:
    """Forget what the engine saw so far (the deployer's readiness probe lists its models)."""
    async with httpx.AsyncClient() as c:
        await c.delete(view["base_url"] + "/_test/requests")


async def engine_requests(view: dict) -> list[dict]:
    async with httpx.AsyncClient() as c:
        return list((await c.get(view["base_url"] + "/_test/requests")).json())


async def raw_request(port: int, target: str, address: str = "127.0.0.2", headers: str = "") -> tuple[int, bytes]:
    """Send a request line exactly as given (clients normalise paths; attackers do not)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
    writer.write(
        f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n{headers}Connection: close\r\n\r\n".encode(
            "latin-1"
        )
    )
    await writer.drain()
    data = await reader.read()
    writer.close()
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


def error_of(resp: httpx.Response) -> dict:
    body = resp.json()
    assert set(body["error"]) >= {"message", "type", "code"}
    return dict(body["error"])


async def test_models_list_from_the_record_never_wakes(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path)
    async with caller(svc) as g:
        resp = await g.get(f"/{view['id']}/v1/models")
    assert resp.status_code == 200
    assert resp.json()["object"] == "list"
    assert resp.json()["data"][0]["id"] == "m" and resp.json()["data"][0]["owned_by"] == "dgxmm"
    assert (await svc.view(view["id"]))["state"] == "stopped"


async def test_model_detail_only_while_ready(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path)
    async with caller(svc) as g:
        resp = await g.get(f"/{view['id']}/v1/models/m")
        assert resp.status_code == 503 and error_of(resp)["code"] == "ondemand_not_ready"
        await svc.client.post(f"/api/deployments/{view['id']}/start")
        ready = await svc.wait_state(view["id"], "ready")
        await clear_requests(ready)
        resp = await g.get(f"/{view['id']}/v1/models/m")
        assert resp.status_code == 200 and resp.json()["id"] == "m"
        assert (await g.head(f"/{view['id']}/v1/models/m")).status_code == 200
    assert svc.ctx.ondemand.status(view["id"])["last_request_at"] is None, "no slot was taken"
    assert [r["path"] for r in await engine_requests(ready)] == ["/v1/models/m", "/v1/models/m"]


@pytest.mark.parametrize(
    "method,path",
    [
        ("POST", "v1/tokenize"),
        ("POST", "v1/detokenize"),
        ("POST", "v1/messages/count_tokens"),
        ("POST", "v1/load_lora_adapter"),
        ("GET", "v1/responses/resp_1"),
        ("POST", "v1/responses/resp_1/cancel"),
        ("POST", "v1/chat/completions/render"),
        ("POST", "sleep"),
        ("POST", "wake_up"),
        ("GET", "metrics"),
        ("GET", "health"),
        ("POST", "collective_rpc"),
        ("POST", "reset_prefix_cache"),
        ("GET", "v1/chat/completions"),
        ("PUT", "v1/completions"),
        ("GET", "v1"),
    ],
)
async def test_everything_else_is_404_and_never_reaches_the_engine(
    serve, tmp_path: Path, method: str, path: str
) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    async with caller(svc) as g:
        resp = await g.request(method, f"/{view['id']}/{path}", json={})
    assert resp.status_code == 404 and error_of(resp)["code"] == "not_found"
    assert await engine_requests(view) == []


async def test_gateway_routes_are_not_in_the_openapi_schema(serve, tmp_path: Path) -> None:
    svc, _ = await od_service(serve, tmp_path)
    schema = (await svc.client.get("/api/openapi.json")).json()
    assert not [p for p in schema["paths"] if "ondemand" in p]


@pytest.mark.parametrize(
    "headers", [{"X-Forwarded-For": "127.0.0.2"}, {"Forwarded": "for=127.0.0.2"}, {"X-Real-IP": "127.0.0.2"}]
)
async def test_forwarding_headers_are_refused_as_404(serve, tmp_path: Path, headers: dict) -> None:
    svc, view = await od_service(serve, tmp_path)
    async with caller(svc) as g:
        resp = await g.get(f"/{view['id']}/v1/models", headers=headers)
    assert resp.status_code == 404 and error_of(resp)["code"] == "not_found"


async def test_peers_outside_the_policy_get_404(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path)
    for address, status in (("127.0.0.2", 200), ("127.0.0.9", 200), ("127.0.0.1", 404), ("127.0.0.10", 404)):
        async with caller(svc, address) as g:
            assert (await g.get(f"/{view['id']}/v1/models")).status_code == status, address
    # A refused peer is refused before anything else: even a bad path or no key is a 404.
    async with caller(svc, "127.0.0.1", key=None) as g:
        assert (await g.post(f"/{view['id']}/v1/chat/completions", json=CHAT)).status_code == 404


async def test_nobody_is_allowed_before_the_first_refresh(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path)
    from dgxmm.gateway.peers import NOBODY

    svc.ctx.peers.policy = NOBODY
    async with caller(svc) as g:
        assert (await g.get(f"/{view['id']}/v1/models")).status_code == 404
    await svc.ctx.peers.refresh()
    async with caller(svc) as g:
        assert (await g.get(f"/{view['id']}/v1/models")).status_code == 200


@pytest.mark.parametrize(
    "target",
    [
        "/{id}/v1/./chat/completions",
        "/{id}/v1/../v1/models",
        "/{id}/v1//models",
        "/{id}/v1/models/",
        "/{id}/v1/models/a%2Fb",
        "/{id}/v1/models/a%2fb",
        "/{id}/v1/models/a%5Cb",
        "/{id}/v1/models/a%23b",
        "/{id}/v1/models/a%3Fb",
        "/{id}/v1/models/a%00b",
        "/{id}/v1/models/a%0Ab",
        "/{id}/v1/models/a\\b",
        "/{id}/v1/%2e%2e/models",
        "/{id}/v1/models/a%7Fb",
    ],
)
async def test_path_checks(serve, tmp_path: Path, target: str) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    status, body = await raw_request(svc.settings.server.port, "/dgxmm/ondemand" + target.format(id=view["id"]))
    assert status == 400 and b'"invalid_path"' in body, (target, status, body)
    assert await engine_requests(view) == []


async def test_key_checks_and_rotation(serve, tmp_path: Path) -> None:
    key_file = tmp_path / "ondemand.key"
    svc, view = await od_service(serve, tmp_path, ondemand={"previous_key_grace_s": 300})
    url = f"/{view['id']}/v1/models"
    async with caller(svc, key=None) as g:
        assert error_of(await g.get(url))["code"] == "invalid_api_key"
    async with caller(svc, key="wrong") as g:
        resp = await g.get(url)
        assert resp.status_code == 401 and error_of(resp)["code"] == "invalid_api_key"
    async with caller(svc, "127.0.0.3", key=None) as g:
        assert (await g.get(url, headers={"Authorization": f"Basic {KEY}"})).status_code == 401

    key_file.write_text("sk-rotated\n")
    async with caller(svc, key="sk-rotated") as g:
        await wait_until(lambda: g.get(url), timeout=5)
        assert (await g.get(url)).status_code == 200
    # The previous key: 401, and never counted as a failure (no lock-out after 25 tries).
    async with caller(svc, "127.0.0.4") as old:
        for _ in range(25):
            assert (await old.get(url)).status_code == 401

    key_file.write_text("")  # empty: fail closed
    async with caller(svc, key="sk-rotated") as g:
        resp = await g.get(url)
        assert resp.status_code == 503 and error_of(resp)["code"] == "ondemand_not_configured"
    key_file.unlink()
    async with caller(svc, key="sk-rotated") as g:
        assert error_of(await g.get(url))["code"] == "ondemand_not_configured"


@pytest.mark.parametrize("configured", [False, True])
async def test_without_a_key_file_everything_is_503(serve, tmp_path: Path, configured: bool) -> None:
    """No key_file set, or the file gone after start-up (dgxmm creates a missing one only when it
    starts): the gateway fails closed."""
    key_file = tmp_path / "created.key"
    svc, view = await od_service(serve, tmp_path, ondemand={"key_file": key_file if configured else None})
    if configured:
        assert key_file.read_text().strip()
        key_file.unlink()
    async with caller(svc) as g:
        resp = await g.post(f"/{view['id']}/v1/chat/completions", json=CHAT)
    assert resp.status_code == 503 and error_of(resp)["code"] == "ondemand_not_configured"


async def test_rate_limit_per_peer_for_the_rest_of_the_window(serve, tmp_path: Path) -> None:
    """20 failed checks lock the peer out for wrong and missing keys; the right key from the
    same address is served throughout (issue 34: local users share 127.0.0.1)."""
    svc, view = await od_service(serve, tmp_path, ondemand={"rate_limit_window_s": 2})
    url = f"/{view['id']}/v1/models"
    async with (
        caller(svc, "127.0.0.5", key="wrong") as bad,
        caller(svc, "127.0.0.5") as good,
        caller(svc, "127.0.0.5", key=None) as keyless,
    ):
        for _ in range(20):
            assert (await bad.get(url)).status_code == 401
        for locked in (await bad.get(url), await keyless.get(url)):
            assert locked.status_code == 429 and locked.headers["retry-after"] == "60"
            assert error_of(locked)["code"] == "rate_limited"
        assert (await good.get(url)).status_code == 200  # the right key: served while others are locked out
        async with caller(svc, "127.0.0.6", key="wrong") as other:
            assert (await other.get(url)).status_code == 401  # another peer: not locked out
        await asyncio.sleep(2.1)  # past the lockout (a slow machine only waits longer)
        assert (await bad.get(url)).status_code == 401


async def test_requests_without_credentials_never_lock_out_the_right_key(serve, tmp_path: Path) -> None:
    """A no-cors POST from any web page the operator opens carries no credentials: 401, and not a
    failed key check, however many come (20 of them used to lock the peer out for a minute)."""
    svc, view = await od_service(serve, tmp_path)
    url = f"/{view['id']}/v1/chat/completions"
    async with caller(svc, "127.0.0.5", key=None) as keyless, caller(svc, "127.0.0.5") as good:
        for _ in range(50):
            resp = await keyless.post(url, content=b"{}", headers={"content-type": "text/plain"})
            assert resp.status_code == 401 and error_of(resp)["code"] == "invalid_api_key"
        assert error_of(resp)["message"] == "the on-demand key is missing (Authorization: Bearer, or x-api-key)"
        assert (await good.get(f"/{view['id']}/v1/models")).status_code == 200


async def test_keys_sent_beside_authorization_never_reach_the_engine(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    async with caller(svc) as g:
        resp = await g.post(
            f"/{view['id']}/v1/chat/completions",
            json=CHAT,
            headers={"x-api-key": KEY, "api-key": KEY, "x_api_key": KEY},
        )
    assert resp.status_code == 200
    [seen] = await engine_requests(view)
    assert not {"x-api-key", "api-key", "x_api_key"} & set(seen["headers"])


async def test_key_rotation_clears_failure_counts(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path)
    url = f"/{view['id']}/v1/models"
    async with caller(svc, "127.0.0.5", key="wrong") as bad:
        for _ in range(20):
            await bad.get(url)
        assert (await bad.get(url)).status_code == 429
        (tmp_path / "ondemand.key").write_text("sk-new\n")
        async with caller(svc, "127.0.0.5", key="sk-new") as good:
            assert (await good.get(url)).status_code == 200


async def test_body_limit(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, ondemand={"max_body_bytes": 1024}, state="ready")
    async with caller(svc) as g:
        resp = await g.post(
            f"/{view['id']}/v1/chat/completions", content=b"x" * 1025, headers={"content-type": "application/json"}
        )
        assert resp.status_code == 413 and error_of(resp)["code"] == "request_too_large"

        async def chunked():
            for _ in range(10):
                yield b"y" * 200

        resp = await g.post(f"/{view['id']}/v1/audio/transcriptions", content=chunked())
        assert resp.status_code == 413
        files = {"file": ("a.wav", b"z" * 2000, "audio/wav")}
        resp = await g.post(f"/{view['id']}/v1/audio/transcriptions", files=files, data={"model": "m"})
        assert resp.status_code == 413
        files = {"file": ("a.wav", b"z" * 500, "audio/wav")}
        resp = await g.post(f"/{view['id']}/v1/audio/transcriptions", files=files, data={"model": "m"})
        assert resp.status_code == 200 and resp.json()["path"] == "/v1/audio/transcriptions"
    assert [r["path"] for r in await engine_requests(view)] == ["/v1/audio/transcriptions"]


async def test_a_chunked_body_over_the_limit_that_arrives_whole_is_413(serve, tmp_path: Path) -> None:
    """No Content-Length, and the whole body in the same read as the head: the gateway takes it
    from the front door's cycle at once (no receive()), and the limit holds there too."""
    svc, view = await od_service(serve, tmp_path, ondemand={"max_body_bytes": 1024}, state="ready")
    port, base = svc.settings.server.port, svc.settings.server.base_path

    async def send_whole(size: int) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=("127.0.0.2", 0))
        body = b"x" * size
        writer.write(
            f"POST {base}/ondemand/{view['id']}/v1/chat/completions HTTP/1.1\r\nHost: a\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            f"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n{size:x}\r\n".encode()
            + body
            + b"\r\n0\r\n\r\n"
        )
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        return answer.split(b"\r\n", 1)[0]

    assert await send_whole(1025) == b"HTTP/1.1 413 Request Entity Too Large"
    assert await send_whole(1024) != b"HTTP/1.1 413 Request Entity Too Large"  # at the limit: forwarded
    assert [r for r in await engine_requests(view) if r["path"] == "/v1/chat/completions"]


async def test_deployment_checks(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path)
    decider = await svc.create(name="decider", engine="command", memory_gib=1, role="decider", command=engine_command())
    always = await svc.create(name="always", engine="command", memory_gib=1, command=engine_command())
    stopped = await svc.create(
        name="stopped", engine="command", memory_gib=1, mode="on_demand", command=engine_command()
    )
    await svc.client.patch(f"/api/deployments/{stopped['id']}/mode", json={"mode": "always_on"})
    await svc.client.post(f"/api/deployments/{stopped['id']}/stop")
    ready = await svc.wait_state(always["id"], "ready")
    await clear_requests(ready)
    async with caller(svc) as g:
        resp = await g.post("/nope/v1/chat/completions", json=CHAT)
        assert resp.status_code == 404 and error_of(resp)["code"] == "not_found"
        resp = await g.post(f"/{decider['id']}/v1/chat/completions", json=CHAT)
        assert resp.status_code == 503 and error_of(resp)["code"] == "not_on_demand"
        resp = await g.post(f"/{always['id']}/v1/chat/completions", json=CHAT)
        assert resp.status_code == 200 and resp.json()["object"] == "chat.completion"
        resp = await g.post(f"/{stopped['id']}/v1/chat/completions", json=CHAT)
        assert resp.status_code == 503 and error_of(resp)["code"] == "not_on_demand"
    assert (await svc.view(stopped["id"]))["state"] == "stopped", "never started by the gateway"
    assert len(await engine_requests(ready)) == 1
