"""The second hardening round's attacks on the front door (issue 26), replayed against the served
dgxmm, each bounded or refused with a clear status, and nothing of them reaching an engine:
chunked trailers, a body cut short by a bad chunk, an upgrade with a body, an invalid
Transfer-Encoding."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from conftest import KEY

from hostile.harness import Front, Peak, bounded
from hostile.test_attacks import MB, answer

pytestmark = pytest.mark.hostile

# What a refusal at the limit still lets a client send: the linger's 1 MiB, the client's send
# buffer (2 MiB, fixed by send_until_refused) and dgxmm's receive buffer, which the kernel grows to
# several MiB while dgxmm, slow on a loaded machine, has not read up to the limit yet (7 MiB seen in
# a CI run against a bound of 4). Far below the 32 and 100 MiB a server that read it all takes.
REFUSED_EARLY = 16 * MB


def admin_latency(front: Front, stop: threading.Event, worst: list[float]) -> None:
    """The admin API's slowest answer while an attack runs (it must stay under a second)."""
    with front.served.admin(timeout=30) as admin:
        while not stop.is_set():
            began = time.monotonic()
            assert admin.get("/host").status_code == 200
            worst[0] = max(worst[0], time.monotonic() - began)
            time.sleep(0.05)


def send_until_refused(sock: socket.socket, head: bytes, piece: bytes, total: int) -> int:
    sent = 0
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MB)  # (the kernel doubles it)
    try:
        sock.sendall(head)
        while sent < total:
            sock.sendall(piece)
            sent += len(piece)
    except OSError:
        pass  # refused: the server shut its side
    return sent


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/dgxmm/api/deployments", None),
        ("/dgxmm/ondemand/{id}/v1/chat/completions", None),
        ("/dgxmm/ondemand/{id}/v1/chat/completions", KEY),
    ],
)
def test_an_endless_trailer_value_is_cut_short(front: Front, path: str, key: str | None) -> None:
    """A chunked body whose last chunk is followed by a trailer value of 32 MiB, with no token:
    it used to take 5.9 s of CPU with the event loop blocked. Now the connection reads at most
    64 KiB and an eighth of the body of it, and the admin API answers within a second all along.
    Without a token the answer on the head is 401; with the gateway's key, 400 for the body."""
    target = path.replace("{id}", front.deployment["id"]).encode()
    auth = b"Authorization: Bearer " + key.encode() + b"\r\n" if key else b""
    stop, worst = threading.Event(), [0.0]
    watcher = threading.Thread(target=admin_latency, args=(front, stop, worst), daemon=True)
    sock = front.connect("127.0.0.2")
    with Peak(front.served) as peak:
        watcher.start()
        head = b"POST " + target + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"Transfer-Encoding: chunked\r\n\r\n0\r\nX-T: "
        sent = send_until_refused(sock, head, b"a" * 65536, 32 * MB)
        status, body = answer(sock)
        stop.set()
        watcher.join(30)
    sock.close()
    if key is None:  # the token is checked on the head: 401 before any body
        assert status == 401
    else:  # the gateway reads the body before it answers: the limit refuses it
        assert status == 400 and json.loads(body)["error"]["message"] == (
            "the chunked body's framing and trailers are too large"
        )
    assert sent < REFUSED_EARLY
    assert worst[0] < 1.0, worst
    bounded(front, f"a 32 MiB trailer value ({path.split('/')[2]}, {'key' if key else 'no token'})", peak)
    assert front.engine_requests() == []
    front.settle()


def test_a_flood_of_short_trailer_lines_is_refused_past_the_field_limit(front: Front) -> None:
    """100 MiB of short trailer lines (they used to be held: +106 MiB): 431 after 100 fields."""
    target = f"/dgxmm/ondemand/{front.deployment['id']}/v1/chat/completions".encode()
    sock = front.connect("127.0.0.2")
    with Peak(front.served) as peak:
        head = (
            b"POST "
            + target
            + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + KEY.encode()
            + b"\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"
        )
        sent = send_until_refused(sock, head, b"X-T: a\r\n" * 8192, 100 * MB)
        status, body = answer(sock)
    sock.close()
    assert status == 431 and json.loads(body)["error"]["code"] == "request_header_fields_too_large"
    assert sent < REFUSED_EARLY
    bounded(front, "100 MiB of short trailer lines", peak)
    assert front.engine_requests() == []
    front.settle()


def test_trailers_never_reach_the_engine(front: Front) -> None:
    """A few trailer fields, within the limits: the request is served, the trailers dropped."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    target = f"/dgxmm/ondemand/{front.deployment['id']}/v1/chat/completions".encode()
    sock = front.connect("127.0.0.2")
    sock.sendall(
        b"POST "
        + target
        + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + KEY.encode()
        + b"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%b\r\n0\r\nX-Smuggled: 1\r\nAuthorization: Bearer other\r\n\r\n" % (len(body), body)
    )
    status, _ = answer(sock)
    sock.close()
    assert status == 200
    [seen] = front.engine_requests()
    assert not {"x-smuggled"} & {name.lower() for name in seen["headers"]}
    assert seen["body"] == body.decode()
    front.clear_engine()


def test_an_upgrade_with_a_body_is_refused_not_forwarded_empty(front: Front) -> None:
    """The parser hands nothing after a head asking for an upgrade: the engine got an empty body."""
    body = json.dumps({"model": "m", "messages": []}).encode()
    target = f"/dgxmm/ondemand/{front.deployment['id']}/v1/chat/completions".encode()
    sock = front.connect("127.0.0.2")
    sock.sendall(
        b"POST "
        + target
        + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + KEY.encode()
        + b"\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__"
        + b"\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    )
    status, answer_body = answer(sock)
    sock.close()
    assert status == 400 and "upgrades no connection" in json.loads(answer_body)["error"]["message"]
    assert front.engine_requests() == []
    # Without a body (curl --http2 on plain HTTP sends this): answered as HTTP/1.1.
    with front.served.gateway() as client:
        resp = client.get(f"/{front.deployment['id']}/v1/models", headers={"Connection": "Upgrade", "Upgrade": "h2c"})
    assert resp.status_code == 200


@pytest.mark.parametrize(
    "framing",
    [
        b"Transfer-Encoding: xchunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",  # not a coding HTTP has
        b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffffffff\r\n",  # a chunk size past 64 bits
    ],
)
def test_a_body_the_parser_cannot_read_gets_an_answer(front: Front, framing: bytes) -> None:
    """Each of these used to get no answer at all: the connection just closed."""
    target = f"/dgxmm/ondemand/{front.deployment['id']}/v1/chat/completions".encode()
    sock = front.connect("127.0.0.2")
    sock.sendall(
        b"POST " + target + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n" + framing
    )
    status, body = answer(sock)
    sock.close()
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid_request"
    assert front.engine_requests() == []


@pytest.mark.bounded
def test_unfinished_bodies_are_refused_at_the_body_deadline_and_free_their_places(front: Front) -> None:
    """300 gateway requests with a full head and a body that never finishes, most of the gateway's
    share (4,040 of them used to hold every gateway place, so real callers got 503 for as long as
    they were held): each gets 408 once its body made no progress for body_timeout_s, and a real
    caller is served right after."""
    target = f"/dgxmm/ondemand/{front.deployment['id']}/v1/chat/completions".encode()
    head = (
        b"POST "
        + target
        + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + KEY.encode()
        + b'\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"model": '
    )
    socks = []
    began = time.monotonic()
    with Peak(front.served) as peak:
        for _ in range(300):
            sock = front.connect("127.0.0.3")
            sock.sendall(head)
            socks.append(sock)
        answers = [answer(sock) for sock in socks]
        waited = time.monotonic() - began
        with front.served.gateway() as g:
            resp = g.post(
                f"/{front.deployment['id']}/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            )
    for sock in socks:
        sock.close()
    assert {status for status, _ in answers} == {408}
    assert json.loads(answers[0][1])["error"]["code"] == "request_timeout"
    assert waited < 2.0 + 15  # the deadline, and the time to open 300 connections on a busy machine
    assert resp.status_code == 200
    bounded(front, "300 unfinished gateway bodies", peak)
    assert front.engine_requests() == [] or len(front.engine_requests()) == 1  # only the real caller's
    front.clear_engine()
    front.settle()


def test_large_unfinished_bodies_together_stay_within_the_bodies_budget(front: Front) -> None:
    """30 requests sending 15 MiB of a declared 16 MiB body (they grew RSS by 430 MiB): the gateway
    holds at most four bodies of the largest size at once; past that a body gets 503."""
    target = f"/dgxmm/ondemand/{front.deployment['id']}/v1/chat/completions".encode()
    head = (
        b"POST "
        + target
        + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + KEY.encode()
        + b"\r\nContent-Length: %d\r\n\r\n" % (16 * MB)
    )
    piece = b"a" * MB

    def upload() -> tuple[int, bytes]:
        sock = front.connect("127.0.0.3")
        try:
            sock.sendall(head)
            for _ in range(15):
                sock.sendall(piece)
        except OSError:
            pass  # refused: the server shut its side
        try:
            sock.settimeout(10)
            return answer(sock)
        finally:
            sock.close()

    from concurrent.futures import ThreadPoolExecutor

    with Peak(front.served) as peak, ThreadPoolExecutor(30) as pool:
        results = list(pool.map(lambda _: upload(), range(30)))
    statuses = sorted(status for status, _ in results)
    assert set(statuses) <= {408, 503}, statuses  # over the budget at once, or stalled at 15 MiB
    assert statuses.count(503) >= 26, statuses
    bounded(front, "30 bodies of 15 MiB each, unfinished", peak)
    assert front.engine_requests() == []
    front.settle()
