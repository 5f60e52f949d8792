"""Bad input gets a clear error, never a 500, and nothing refused reaches the engine (issue 11's
smaller findings, one test each). Admin API bodies and the front door have their own files."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest
from conftest import KEY, caller, engine_command, gateway_settings, make_settings
from test_gateway_checks import clear_requests, engine_requests, od_service, raw_request

pytestmark = pytest.mark.hostile  # issue 11's attacks: also run by `pytest -m hostile`

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_deeply_nested_json_to_the_gateway_is_400_and_never_forwarded(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    async with caller(svc) as g:
        resp = await g.post(f"/{view['id']}/v1/chat/completions", content=b"[" * 200_000 + b"]" * 200_000)
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
        assert await engine_requests(view) == []
        resp = await g.post(f"/{view['id']}/v1/chat/completions", json=CHAT)  # still serving
        assert resp.status_code == 200, resp.text


@pytest.mark.parametrize("part", ["{port[x]}", "{port.x}", "{port:>100000000}", "{port!r}", "{0}", "{}", "{", "a}b"])
async def test_a_command_placeholder_that_is_not_a_plain_name_is_422(serve, part: str) -> None:
    svc = await serve()
    for field, body in (("command", {"command": ["x", part]}), ("args", {"command": ["x"], "args": [part]})):
        resp = await svc.client.post(
            "/api/deployments", json={"name": "p", "engine": "command", "memory_gib": 1, "mode": "on_demand", **body}
        )
        error = resp.json()["error"]
        assert resp.status_code == 422 and error["field"] == field, resp.text
        assert "{port}" in error["message"] and len(resp.content) < 1000
    assert (await svc.client.get("/api/deployments")).json() == []


async def test_literal_braces_still_work(serve) -> None:
    svc = await serve()
    view = await svc.create(
        name="b",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        command=[*engine_command(), "--reply", "{{x}} {port}"],
    )
    assert view["command"][-1] == "{{x}} {port}"


@pytest.mark.parametrize("name", ["abc\n", "abc\r\n", "abc\x00", "a" * 65, "-abc", "abc def"])
async def test_a_name_with_a_trailing_newline_or_other_junk_is_422(serve, name: str) -> None:
    svc = await serve()
    resp = await svc.client.post(
        "/api/deployments",
        json={"name": name, "engine": "command", "memory_gib": 1, "mode": "on_demand", "command": ["x"]},
    )
    assert resp.status_code == 422 and resp.json()["error"]["field"] == "name"


@pytest.mark.parametrize("header", ["X_Forwarded_For", "x_forwarded_for", "X-Forwarded_For", "X_Real_IP", "FORWARDED"])
async def test_forwarding_headers_in_any_spelling_are_refused(serve, tmp_path: Path, header: str) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    status, body = await raw_request(
        svc.settings.server.port, f"/dgxmm/ondemand/{view['id']}/v1/models/m", headers=f"{header}: 127.0.0.2\r\n"
    )
    assert status == 404 and b"Not Found" in body
    assert await engine_requests(view) == []


async def test_forwarding_and_auth_headers_spelled_with_underscores_are_not_forwarded(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    status, _ = await raw_request(
        svc.settings.server.port,
        f"/dgxmm/ondemand/{view['id']}/v1/models/m",
        headers="X_Forwarded_Host: evil\r\nProxy_Authorization: x\r\nX-Keep: 1\r\n",
    )
    assert status == 200
    [seen] = await engine_requests(view)
    names = set(seen["headers"])
    assert "x-keep" in names and not names & {"x_forwarded_host", "proxy_authorization", "authorization"}


@pytest.mark.parametrize("target", ["/v1/models#x", "/v1/models/m#", "/v1/chat#/completions"])
async def test_a_raw_fragment_is_refused(serve, tmp_path: Path, target: str) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    status, body = await raw_request(svc.settings.server.port, f"/dgxmm/ondemand/{view['id']}{target}")
    assert status == 400 and b"invalid_path" in body
    assert await engine_requests(view) == []


@pytest.mark.parametrize(
    "encoded",
    ["%C2%85", "%C2%9B", "%E2%80%AE", "%E2%80%8F", "%E2%81%A6", "%E2%80%8B", "%E2%80%A8", "%EF%BB%BF", "%1B", "%7F"],
)
async def test_encoded_c1_and_bidi_controls_in_the_path_are_refused(serve, tmp_path: Path, encoded: str) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    status, body = await raw_request(svc.settings.server.port, f"/dgxmm/ondemand/{view['id']}/v1/models/m{encoded}x")
    assert status == 400 and b"invalid_path" in body, body
    assert await engine_requests(view) == []


async def test_files_and_folders_dgxmm_creates_are_private(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    data = svc.settings.server.data_dir
    await clear_requests(view)

    def mode(path: Path) -> int:
        return stat.S_IMODE(os.stat(path).st_mode)

    assert mode(data) == 0o700 and mode(data / "logs") == 0o700
    files = [
        data / "dgxmm.db",
        data / "dgxmm.db-wal",
        data / "admin-token",
        data / "dgxmm.lock",
        data / "logs" / f"{view['id']}.log",
    ]
    assert {path.name: mode(path) for path in files} == {path.name: 0o600 for path in files}
    assert not (data / "dgxmm.db-shm").exists()  # (exclusive locking mode: the WAL index is in memory)


async def test_files_left_readable_by_an_older_dgxmm_are_tightened(serve, tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "logs").mkdir(parents=True)
    for path in (data, data / "logs"):
        path.chmod(0o755)
    (data / "logs" / "old.log").write_text("x")
    svc = await serve(make_settings(tmp_path))
    view = await svc.create(name="o", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(data / "logs").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(data / "dgxmm.db").st_mode) == 0o600
    assert view["state"] == "stopped"


async def test_a_key_or_token_file_readable_by_others_is_warned_about(
    serve, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = gateway_settings(tmp_path)
    settings.ondemand.key_file.chmod(0o644)
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o640)
    settings.server.admin_token_file = token
    with caplog.at_level(logging.WARNING, logger="dgxmm.datadir"):
        await serve(settings)
    text = caplog.text
    assert f"on-demand key file {settings.ondemand.key_file} is readable by other users (mode 0644)" in text
    assert f"admin token file {token} is readable by other users (mode 0640)" in text
    assert KEY not in text and "t0ken" not in text


async def test_private_key_and_token_files_are_not_warned_about(
    serve, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = gateway_settings(tmp_path)
    settings.ondemand.key_file.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="dgxmm.datadir"):
        await serve(settings)
    assert "readable by other users" not in caplog.text


@pytest.mark.parametrize("name", ["User-Agent", "Host", "Content-Type", "Authorization"])
async def test_a_repeated_single_value_header_is_refused_before_the_engine(serve, tmp_path: Path, name: str) -> None:
    """Found by the fuzz: a HEAD with two User-Agent headers made the (aiohttp) engine answer 400
    with a body, which broke its HEAD answer and gave a 502. Which copy counts is ambiguous, so
    the gateway refuses the request."""
    svc, view = await od_service(serve, tmp_path, state="ready")
    extra = f"{name}: a\r\n{name}: b\r\n" if name != "Authorization" else f"Authorization: Bearer {KEY}\r\n"
    status, body = await raw_request(
        svc.settings.server.port, f"/dgxmm/ondemand/{view['id']}/v1/models/m", headers=extra
    )
    assert status == 400 and b"invalid_header" in body and name.lower().encode() in body
    assert await engine_requests(view) == []


async def test_deeply_nested_json_to_an_always_on_deployment_is_400_too(serve, tmp_path: Path) -> None:
    svc = await serve(gateway_settings(tmp_path))
    view = await svc.create(name="a", engine="command", memory_gib=1, command=engine_command())
    ready = await svc.wait_state(view["id"], "ready")
    await clear_requests(ready)
    async with caller(svc) as g:
        resp = await g.post(f"/{view['id']}/v1/chat/completions", content=b"[" * 200_000 + b"]" * 200_000)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    assert await engine_requests(ready) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"served_name": "m\nINFO forged line"}, "served_name"),
        ({"served_name": "m\x1b[31m"}, "served_name"),
        ({"env": {"A-B": "1"}}, "env"),
        ({"env": {"1A": "1"}}, "env"),
        ({"env": {"A": "x\x00y"}}, "env"),
        ({"env": {"A=B": "1"}}, "env"),
        ({"args": ["--x", "a\x00b"]}, "args"),
        ({"command": ["prog\x00", "x"]}, "command"),
    ],
)
async def test_what_would_not_run_as_stored_or_would_forge_a_log_line_is_422(serve, body: dict, field: str) -> None:
    """Issue 26's smaller items: environment names and NUL bytes (what runs would differ from what
    is stored), and a served name with a line break (it forged log lines)."""
    svc = await serve()
    resp = await svc.client.post(
        "/api/deployments",
        json={"name": "v", "engine": "command", "memory_gib": 1, "mode": "on_demand", "command": ["x"], **body},
    )
    assert resp.status_code == 422 and resp.json()["error"]["field"] == field, resp.text
    assert (await svc.client.get("/api/deployments")).json() == []
    view = await svc.create(
        name="ok",
        engine="command",
        memory_gib=1,
        mode="on_demand",
        command=["x"],
        served_name="org/Model-7B.Q4",
        env={"_OK_1": "a b=c"},
    )
    resp = await svc.client.patch(f"/api/deployments/{view['id']}", json=body)  # a change is checked the same
    assert resp.status_code == 422 and resp.json()["error"]["field"] == field, resp.text
