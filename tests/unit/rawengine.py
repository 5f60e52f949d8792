"""A raw HTTP/1.1 engine on real sockets whose every connection the test controls.

Threads and blocking sockets, outside the test's event loop: the test can make the engine close
a pooled connection and wait, without letting its own loop run, until the FIN has reached its
side, which is exactly the moment a pool can hand out a connection whose close it has not read.

Each connection serves requests one after another. What it answers and what it does afterwards
is decided per request by ``Engine.plan`` (a function of the request's ``x-seq`` header).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

STREAM_BODY = b'data: {"n": 1}\n\ndata: [DONE]\n\n'
JSON_BODY = b'{"ok": true}'


@dataclass
class Plan:
    stream: bool = False  # chunked SSE answer instead of a JSON one with Content-Length
    connection_close: bool = False  # answer with "Connection: close" (the connection is kept open)
    close_after: bool = False  # close the socket right after the answer (no Connection: close)
    close_when: threading.Event | None = None  # with close_after: close only once this is set
    hang_up: bool = False  # read the request, then close without answering
    break_off: bool = False  # send the head and part of the body, then close
    # (a stream: all of it but the last chunk; with ``events`` only the first n events' chunk and
    # ``partial`` bytes of the next event)
    events: int | None = None
    partial: int = 0
    until_close: bool = False  # a JSON answer with neither length nor chunks: it ends when the socket closes
    extra_headers: int = 0  # header lines added to the answer's head
    long_header: int = 0  # bytes of one more header's value
    padding: int = 0  # spaces after a JSON answer's body (sent with its head, in one write)


@dataclass
class Seen:
    seq: str
    conn: int  # which accepted connection carried it (0, 1, ...)
    headers: dict[str, str]


@dataclass
class Engine:
    plan: Callable[[str], Plan] = lambda seq: Plan()
    seen: list[Seen] = field(default_factory=list)
    conns: list[socket.socket] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)  # set when close_conn is done

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                index = len(self.conns)
                self.conns.append(sock)
                serving = threading.Thread(target=self._serve, args=(sock, index), daemon=True)
                self._threads.append(serving)
            serving.start()

    def _serve(self, sock: socket.socket, index: int) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
                length = int(headers.get("content-length", "0"))
                while len(buf) < length:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                buf = buf[length:]
                seq = headers.get("x-seq", "")
                with self._lock:
                    self.seen.append(Seen(seq, index, headers))
                plan = self.plan(seq)
                if plan.hang_up:
                    sock.close()
                    return
                if plan.break_off and plan.events is not None:
                    sock.sendall(_events_then_break(plan))
                    sock.close()
                    return
                if plan.break_off or plan.until_close:
                    answer = _answer(plan)
                    if plan.until_close:
                        answer = answer.replace(b"Content-Length: %d\r\n" % len(JSON_BODY), b"")
                    sock.sendall(answer[:-5] if plan.break_off else answer)
                    sock.close()
                    return
                sock.sendall(_answer(plan))
                if plan.close_after:
                    if plan.close_when is not None:
                        plan.close_when.wait(10)
                    sock.close()
                    return
        except OSError:
            return

    def close_conn(self, index: int) -> None:
        """Close one connection from the engine's side (FIN) and signal ``closed``. shutdown()
        first: a plain close() from this thread would not end the serving thread's recv()."""
        sock = self.conns[index]
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        self.closed.set()

    def seqs(self) -> list[str]:
        with self._lock:
            return [s.seq for s in self.seen]

    def stop(self) -> None:
        """Wake every thread from its socket (shutdown), wait for them, then close the sockets.
        Closed under a thread still in ``accept`` or ``recv``, a socket's descriptor number can go
        to the next socket the process opens (another test's server), and the thread then takes
        that server's connections and answers them as this engine."""
        with self._lock:
            socks, threads = [self._listener, *self.conns], list(self._threads)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(5)
        for sock in socks:
            sock.close()


def _answer(plan: Plan) -> bytes:
    close = b"Connection: close\r\n" if plan.connection_close else b"Keep-Alive: timeout=5, max=100\r\n"
    close += b"X-Extra: 1\r\n" * plan.extra_headers
    if plan.long_header:
        close += b"X-Long: " + b"a" * plan.long_header + b"\r\n"
    if plan.stream:
        body = f"{len(STREAM_BODY):x}\r\n".encode() + STREAM_BODY + b"\r\n0\r\n\r\n"
        return (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
            + close
            + b"\r\n"
            + body
        )
    body = JSON_BODY + b" " * plan.padding
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n"
        + close
        + b"\r\n"
        + body
    )


def _events_then_break(plan: Plan) -> bytes:
    """An SSE answer's head, ``plan.events`` whole events and ``plan.partial`` bytes of one more,
    as one chunk; then the engine closes (no further chunk, no last chunk)."""
    event = b'data: {"n": 1}\n\n'
    body = event * (plan.events or 0) + event[: plan.partial]
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(body):x}\r\n".encode()
        + body
        + b"\r\n"
    )
