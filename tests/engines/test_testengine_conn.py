"""The test engine's connection switches (testengine_conn.py), seen from a raw socket.

Integration tests trust these switches to close connections the way real engines do; here each
one is checked byte by byte: what the answer's head says, and when the engine's FIN arrives.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from engines.test_testengine import Engine, launch, stop, wait_for

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    started: list[Engine] = []

    def factory(*args: str) -> Engine:
        started.append(launch(tmp_path, *args))
        return started[-1]

    yield factory
    for engine in started:
        stop(engine)


def send(sock: socket.socket, body: dict) -> None:
    raw = json.dumps(body).encode()
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" + raw
    )


def answer(sock: socket.socket) -> tuple[str, bytes]:
    """Read one answer: its head, and its body (Content-Length or chunked until the last chunk)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += received(sock)
    head, body = data.split(b"\r\n\r\n", 1)
    text = head.decode("latin-1").lower()
    if "content-length:" in text:
        length = int(text.split("content-length:")[1].split("\r\n")[0])
        while len(body) < length:
            body += received(sock)
    else:
        while not body.endswith(b"0\r\n\r\n"):
            body += received(sock)
    return text, body


def received(sock: socket.socket) -> bytes:
    data = sock.recv(65536)
    assert data, "the engine closed the connection before its answer ended"
    return data


def closed_by_engine(sock: socket.socket, within: float = 2.0) -> bool:
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False


def connect(engine: Engine) -> socket.socket:
    wait_for(lambda: httpx.get(engine.url("/health")).status_code == 200)
    return socket.create_connection(("127.0.0.1", int(engine.base.rsplit(":", 1)[1])))


def counts(engine: Engine) -> dict:
    return httpx.get(engine.url("/_test/connections")).json()


def test_close_after_stream_advertises_keep_alive_then_closes(start) -> None:
    engine = start("--close-after-stream")
    with connect(engine) as sock:
        send(sock, CHAT)
        head, _ = answer(sock)  # a plain answer: the connection stays
        assert "keep-alive: timeout=5, max=100" in head and "connection: close" not in head
        send(sock, {**CHAT, "stream": True})
        head, body = answer(sock)
        assert body.endswith(b"0\r\n\r\n") and b"data: [DONE]" in body
        assert "keep-alive: timeout=5, max=100" in head and "connection: close" not in head
        assert closed_by_engine(sock)
    assert counts(engine)["closed_after_stream"] == 1


@pytest.mark.bounded
def test_idle_close_closes_only_idle_connections(start) -> None:
    """A connection with an answer under way is never idle, however long the answer takes: here
    a stream of 8 chunks 0.5 s apart (3.5 s, past the 2 s idle time) reaches its end while the
    idle connection beside it is closed. (Each connection's request follows its connect at once:
    2 s is the margin of that, not of the test's pace.)"""
    engine = start("--idle-close", "2")
    with connect(engine) as idle:
        send(idle, CHAT)
        head, _ = answer(idle)
        assert "keep-alive" not in head and "connection: close" not in head  # unannounced
        httpx.post(engine.url("/_test/config"), json={"chunk_delay": 0.5})
        with connect(engine) as busy:
            send(busy, {**CHAT, "stream": True, "max_tokens": 8})
            assert closed_by_engine(idle, within=30)  # (30 s: only a bound on a hang)
            head, body = answer(busy)  # the whole stream, on a connection left open
            assert head.startswith("http/1.1 200") and b"data: [DONE]" in body
    assert counts(engine)["idle_closed"] >= 1


def test_request_cap_says_connection_close_on_the_last_answer(start) -> None:
    engine = start("--max-requests-per-conn", "3")
    with connect(engine) as sock:
        for n in (1, 2):
            send(sock, {**CHAT, "stream": n == 2})
            head, _ = answer(sock)
            assert "connection: close" not in head
        send(sock, CHAT)
        head, _ = answer(sock)
        assert "connection: close" in head
        assert closed_by_engine(sock)
    assert counts(engine)["capped"] == 1
