"""Issue 47, findings 5 and 9, replayed against a served dgxmm (``dgxmm serve`` as a child
process): revoking a key on a full data disk answered 503 and left the key working, and a
revoked, expired or narrowed key's open stream ran to its end with nothing to end it. Now the
revocation holds at once and is written once the disk has room (a restart keeps it revoked),
and every such stream ends with the error event, its engine's request cancelled, even when
its caller stops reading."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import engine_command
from served import Served, until

from integration.test_full_disk import Filler

pytestmark = pytest.mark.hostile

STREAMS = 50  # open streams of one key, ended at once
BOUND_S = 15  # only bounds a hang: each end below comes at once


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, dict[str, Any]]]:
    """A served dgxmm with an always-on test engine ``m`` (aliases ``m-alias``) that streams an
    event a minute: nothing after a stream's first event is the engine's own end."""
    served = Served(tmp_path_factory.mktemp("revocation")).start()
    try:
        with served.admin() as admin:
            view = admin.post(
                "/deployments",
                json={
                    "name": "m",
                    "aliases": ["m-alias"],
                    "engine": "command",
                    "memory_gib": 1,
                    "command": engine_command("--chunk-delay", "60"),
                },
            ).json()
            until(lambda: admin.get(f"/deployments/{view['id']}").json()["state"] == "ready")
            view = admin.get(f"/deployments/{view['id']}").json()
        yield served, view
    finally:
        served.stop()


def new_key(served: Served, **body: Any) -> dict[str, Any]:
    with served.admin() as admin:
        made = admin.post("/keys", json={"name": f"k{os.urandom(4).hex()}", **body})
    assert made.status_code == 201, made.text
    return dict(made.json())


def running(served: Served, view: dict[str, Any]) -> int:
    """The requests the engine runs now."""
    return int(httpx.get(view["base_url"] + "/_test/seats", timeout=10).json()["running"])


def open_stream(served: Served, view: dict[str, Any], secret: str, model: str = "m") -> socket.socket:
    """A streamed chat request with ``secret`` on a raw socket, its head and first event read:
    under way at the engine. The caller reads nothing more unless it wants to."""
    body = json.dumps({"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=BOUND_S, source_address=("127.0.0.2", 0))
    sock.sendall(
        f"POST /dgxmm/ondemand/{view['id']}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {secret}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    seen = b""
    while b"data:" not in seen.partition(b"\r\n\r\n")[2]:
        piece = sock.recv(65536)
        assert piece, seen
        seen += piece
    assert seen.startswith(b"HTTP/1.1 200"), seen
    return sock


def rest_of(sock: socket.socket) -> bytes:
    """Everything the stream still sends, to its end (the connection stays open after it)."""
    seen = b""
    while b"\r\n0\r\n\r\n" not in seen:
        piece = sock.recv(65536)
        if not piece:
            break
        seen += piece
    return seen


def ended_with(rest: bytes, code: str) -> None:
    events = [line[5:].strip() for line in rest.split(b"\n") if line.startswith(b"data:")]
    assert len(events) == 2 and events[1] == b"[DONE]", rest
    assert json.loads(events[0])["error"]["code"] == code, rest


def test_fifty_streams_of_a_revoked_key_end_at_once_with_the_error_and_their_engine_requests(
    slow: tuple[Served, dict[str, Any]],
) -> None:
    served, view = slow
    made = new_key(served)
    with ThreadPoolExecutor(STREAMS) as pool:
        socks = list(pool.map(lambda _: open_stream(served, view, made["key"]), range(STREAMS)))
    try:
        with served.admin() as admin:
            assert admin.delete(f"/keys/{made['id']}").status_code == 204
        with ThreadPoolExecutor(STREAMS) as pool:
            rests = list(pool.map(rest_of, socks))
        for rest in rests:
            ended_with(rest, "key_revoked")
        until(lambda: running(served, view) == 0, BOUND_S)
    finally:
        for sock in socks:
            sock.close()


def test_end_requests_frees_the_key_and_the_engine_before_its_callers_read_anything(
    slow: tuple[Served, dict[str, Any]],
) -> None:
    served, view = slow
    made = new_key(served)
    socks = [open_stream(served, view, made["key"]) for _ in range(3)]
    try:
        with served.admin() as admin:
            ended = admin.post(f"/keys/{made['id']}/end-requests")
            assert ended.status_code == 200 and ended.json()["ended"] == 3
            until(lambda: admin.get(f"/keys/{made['id']}").json()["in_flight"] == 0, BOUND_S)
        until(lambda: running(served, view) == 0, BOUND_S)
        ended_with(rest_of(socks[0]), "request_ended")  # read only now: it was waiting
    finally:
        for sock in socks:
            sock.close()


def test_an_expired_or_narrowed_keys_stream_ends(slow: tuple[Served, dict[str, Any]]) -> None:
    served, view = slow
    expiring, narrowed = new_key(served), new_key(served, models=["m-alias", "other"])
    to_expire, to_narrow = open_stream(served, view, expiring["key"]), open_stream(served, view, narrowed["key"])
    try:
        soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).isoformat()
        with served.admin() as admin:
            assert admin.patch(f"/keys/{expiring['id']}", json={"expires_at": soon}).status_code == 200
            assert admin.patch(f"/keys/{narrowed['id']}", json={"models": ["other"]}).status_code == 200
        ended_with(rest_of(to_narrow), "model_not_allowed")
        ended_with(rest_of(to_expire), "key_expired")
    finally:
        to_expire.close()
        to_narrow.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_key_revoked_on_a_full_disk_is_refused_at_once_and_after_a_restart(tmp_path: Path) -> None:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)], check=True)
    served = Served(tmp_path, data_dir=mount / "data").start()
    try:
        with served.admin() as admin:
            view = admin.post(
                "/deployments", json={"name": "m", "engine": "command", "memory_gib": 1, "command": engine_command()}
            ).json()
            until(lambda: admin.get(f"/deployments/{view['id']}").json()["state"] == "ready")
        made = new_key(served)
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        url = f"/{view['id']}/v1/chat/completions"
        auth = {"Authorization": f"Bearer {made['key']}"}
        filler = Filler(mount)
        with served.gateway() as g, served.admin() as admin:
            assert g.post(url, json=chat, headers=auth).status_code == 200
            filler.fill()
            revoked = admin.delete(f"/keys/{made['id']}")
            assert revoked.status_code == 202 and revoked.json()["persisted"] is False, revoked.text  # was 503
            assert g.post(url, json=chat, headers=auth).status_code == 401  # was 200
            filler.free()
            written = f"wrote the revocation of key {made['name']}, kept in memory while the database"
            until(lambda: written in served.log(), BOUND_S)  # by the next usage flush, no request needed
        served.stop()
        served = Served(tmp_path, data_dir=mount / "data").start()
        with served.gateway() as g:
            assert g.post(url, json=chat, headers=auth).status_code == 401
    finally:
        served.stop()
        subprocess.run(["umount", "-l", str(mount)], check=False)
