"""Every attack of issue 11, replayed against the served dgxmm, each within its bound: RSS within
100 MiB of idle, open connections under the cap, a clear status, and the engine saw nothing."""

from __future__ import annotations

import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from conftest import KEY
from served import until

from hostile.harness import Front, Peak, bounded

pytestmark = pytest.mark.hostile

MB = 1024 * 1024


def answer(sock: socket.socket) -> tuple[int, bytes]:
    """Read one answer (status and body) from a socket, whatever was sent before."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed without an answer: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(head.split()[1]), body


def test_header_flood_on_four_connections(front: Front) -> None:
    """Four connections sending header lines without end (500 MB each, were 2.1 GB of RSS)."""
    target = f"/dgxmm/ondemand/{front.deployment['id']}/v1/chat/completions".encode()
    line = b"X-Flood: " + b"a" * 1000 + b"\r\n"

    def flood() -> tuple[int, int, bytes]:
        sock = front.connect("127.0.0.2")
        sent = 0
        try:
            sock.sendall(b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n")
            while sent < 500 * MB:
                sock.sendall(line * 64)
                sent += len(line) * 64
        except OSError:
            pass  # the server closed its side: the head was refused
        status, body = answer(sock)
        sock.close()
        return sent, status, body

    with Peak(front.served) as peak, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: flood(), range(4)))
    for sent, status, body in results:
        assert status == 431 and json.loads(body)["error"]["code"] == "request_header_fields_too_large"
        assert sent < 100 * MB  # read at most 64 KiB, then up to 1 MiB dropped while lingering
    bounded(front, "header flood: 4 connections x 500 MB of header lines", peak)
    assert front.engine_requests() == []
    front.settle()


def test_a_thousand_request_lines_that_never_finish(front: Front) -> None:
    """1000 connections send a request line and stall: they are capped, the admin API and the
    gateway still answer, and each is closed after the header timeout."""
    limit = front.host()["server"]["max_connections"]
    target = f"/dgxmm/ondemand/{front.deployment['id']}/v1/chat/completions".encode()
    socks: list[socket.socket] = []
    try:
        with Peak(front.served) as peak:
            for _ in range(1000):
                sock = front.connect("127.0.0.3")
                sock.sendall(b"POST " + target + b" HTTP/1.1\r\n")
                socks.append(sock)
            server = front.host()["server"]  # a new connection gets in: the oldest reader gave way
            assert server["connections"] <= limit and front.served.open_sockets() <= limit + 16
            with front.served.gateway() as g:
                resp = g.get(f"/{front.deployment['id']}/v1/models")
            assert resp.status_code == 200
        bounded(front, "1000 connections sending a request line, never finishing", peak)
        assert server["evicted"] >= 1000 - limit
        # Those still open get 408 once the header timeout is over, then are closed.
        until(lambda: front.host()["server"]["reading"] == 0, timeout=30)
    finally:
        for sock in socks:
            sock.close()
    assert front.engine_requests() == []
    front.settle()


def test_a_thousand_half_heads_of_60_kib(front: Front) -> None:
    """1000 connections each hold 60 KiB of an unfinished head: the head budget drops the
    biggest, so memory stays bounded however many connections read at once."""
    socks: list[socket.socket] = []
    chunk = b"GET /dgxmm/api/host HTTP/1.1\r\n" + b"".join(b"X-%02d: %s\r\n" % (i, b"v" * 1000) for i in range(59))
    try:
        with Peak(front.served) as peak:
            for _ in range(1000):
                sock = front.connect("127.0.0.4")
                try:
                    sock.sendall(chunk)
                except OSError:
                    pass  # dropped already
                socks.append(sock)
            server = front.host()["server"]
            assert server["head_bytes"] <= 16 * MB
        bounded(front, "1000 connections each holding a 60 KiB unfinished head", peak)
    finally:
        for sock in socks:
            sock.close()
    front.settle()


def test_unauthenticated_200_mib_admin_body(front: Front) -> None:
    """POST /api/deployments without a token and 200 MiB of JSON: 401 before the body is read
    (it was parsed first: 1.9 GB RSS and the gateway stalled), and the gateway keeps serving."""
    sock = front.connect()
    sock.sendall(
        b"POST /dgxmm/api/deployments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (200 * MB)
    )
    outcome: dict[str, object] = {}

    def upload() -> None:
        sent = 0
        try:
            block = b"[" * MB
            while sent < 200 * MB:
                sock.sendall(block)
                sent += MB
        except OSError as exc:
            outcome["error"] = exc
        outcome["sent"] = sent

    with Peak(front.served) as peak:
        uploader = threading.Thread(target=upload, daemon=True)
        uploader.start()
        status, body = answer(sock)
        assert status == 401 and json.loads(body)["error"]["code"] == "unauthorized"
        with front.served.gateway() as g:  # served while the upload goes on
            assert g.get(f"/{front.deployment['id']}/v1/models").status_code == 200
        uploader.join(120)
    bounded(front, "unauthenticated 200 MiB JSON body to POST /api/deployments", peak)
    sock.close()
    resp = httpx.post(
        front.served.base + "/api/deployments", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert resp.status_code == 401  # not 422
    front.settle()


REFUSED = [
    # (request head after the method, expected status, expected code): the smaller findings
    (b"POST /dgxmm/ondemand/{id}/v1/chat/completions", "[" * 100_000, 400, "invalid_json"),
    (b"GET /dgxmm/ondemand/{id}/v1/models#frag", "", 400, "invalid_path"),
    (b"GET /dgxmm/ondemand/{id}/v1/models/m%C2%85", "", 400, "invalid_path"),
    (b"GET /dgxmm/ondemand/{id}/v1/models/m%E2%80%AEx", "", 400, "invalid_path"),
    (b"GET /dgxmm/ondemand/{id}/v1/models/m%E2%81%A6x", "", 400, "invalid_path"),
]


@pytest.mark.parametrize(("line", "body", "status", "code"), REFUSED)
def test_smaller_findings_are_refused_and_never_forwarded(
    front: Front, line: bytes, body: str, status: int, code: str
) -> None:
    sock = front.connect("127.0.0.2")
    raw = body.encode()
    sock.sendall(
        line.replace(b"{id}", front.deployment["id"].encode())
        + b" HTTP/1.1\r\nHost: x\r\n"
        + b"Authorization: Bearer "
        + KEY.encode()
        + b"\r\nContent-Length: %d\r\n\r\n" % len(raw)
        + raw
    )
    got, answer_body = answer(sock)
    sock.close()
    assert got == status and json.loads(answer_body)["error"]["code"] == code
    assert front.engine_requests() == []


def test_forwarding_header_with_underscores_is_refused(front: Front) -> None:
    with front.served.gateway() as g:
        resp = g.get(f"/{front.deployment['id']}/v1/models/m", headers={"X_Forwarded_For": "127.0.0.2"})
    assert resp.status_code == 404
    assert front.engine_requests() == []


@pytest.mark.parametrize("part", ["{port[x]}", "{port.x}", "{port:>100000000}"])
def test_format_strings_in_a_command_are_422(front: Front, part: str) -> None:
    with Peak(front.served) as peak, front.served.admin() as admin:
        resp = admin.post(
            "/deployments",
            json={"name": "f", "engine": "command", "memory_gib": 1, "mode": "on_demand", "command": ["x", part]},
        )
    assert resp.status_code == 422 and resp.json()["error"]["field"] == "command"
    assert peak.peak - front.idle_rss_mib < 50


def test_a_name_with_a_trailing_newline_is_422(front: Front) -> None:
    with front.served.admin() as admin:
        resp = admin.post(
            "/deployments",
            json={"name": "abc\n", "engine": "command", "memory_gib": 1, "mode": "on_demand", "command": ["x"]},
        )
    assert resp.status_code == 422 and resp.json()["error"]["field"] == "name"


def test_the_web_package_source_is_not_served(front: Front) -> None:
    for path in ("/__init__.py/", "/__init__.py", "/index.html/"):
        assert httpx.get(front.served.base + path).status_code == 404
