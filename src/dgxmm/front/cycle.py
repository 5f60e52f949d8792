"""The request-response cycle of dgxmm's front door: uvicorn's, plus two things the gateway uses.

Every request's ASGI scope carries a weak reference to the cycle under
``scope["extensions"][FRONT]`` (``front_of(scope)`` reads it). Weak, because the cycle holds
the scope: a strong one made every request a reference cycle (cycle, scope, headers, event),
about 16 objects that only the garbage collector could free, which then ran every 40-odd
requests and took about 4 % of the gateway's CPU.

* ``respond(status, headers, body)`` writes a whole answer, head and body, in one write. Through
  plain ASGI a head and its body are two writes (uvicorn writes the head as soon as it is sent),
  which is two system calls and two packets for every non-streaming answer the gateway relays.
* ``whole_body()``: the request's body when all of it is already in, without the coroutine
  and the message of ``receive()``.
* ``hangup``: a callable run once when the client's connection is lost before the answer is
  complete. The gateway sets it to cancel the request's work (its wait for a slot or for the
  engine), which a task per request watching ``receive()`` did before, at the price of a task.
* ``cut()``: an answer that began cannot be completed (its source broke off): the connection is
  closed, so the client sees it cut short, and the cycle counts as disconnected, so the server
  does not report the application for it.

The cycle is otherwise uvicorn's ``RequestResponseCycle``, unchanged.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle

FRONT = "dgxmm.front"  # the scope extension's key
# Header names already found valid: answers repeat the same few, so each is checked once.
MAX_GOOD_NAMES = 512
_GOOD_NAMES: set[bytes] = set()


def front_of(scope: Any) -> FrontCycle | None:
    """The request's cycle when dgxmm's front door serves it (None under another server)."""
    ref: weakref.ref[FrontCycle] | None = scope.get("extensions", {}).get(FRONT)
    return None if ref is None else ref()


class FrontCycle(RequestResponseCycle):
    hangup: Callable[[], object] | None = None

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """The whole answer in one write; ``Content-Length`` is set here (a length or
        ``Transfer-Encoding`` among ``headers`` is dropped). After a hang-up it does nothing."""
        if self.response_started:
            raise RuntimeError("respond() after the answer began")
        if self.disconnected:
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        content = [STATUS_LINE[status]]
        for name, value in self.default_headers:
            content += (name, b": ", value, b"\r\n")
        values = []
        for name, value in headers:
            if name not in _GOOD_NAMES:
                if HEADER_RE.search(name):
                    raise RuntimeError("Invalid HTTP header name.")
                if len(_GOOD_NAMES) < MAX_GOOD_NAMES:
                    _GOOD_NAMES.add(name)
            values.append(value)
            name = name.lower()
            if name == b"content-length" or name == b"transfer-encoding":
                continue
            if name == b"connection" and value.lower().find(b"close") >= 0:
                self.keep_alive = False
                continue
            content += (name, b": ", value, b"\r\n")
        if HEADER_VALUE_RE.search(b"".join(values)):  # one search: a bad byte is bad wherever it is
            raise RuntimeError("Invalid HTTP header value.")
        content.append(b"content-length: %d\r\n" % len(body))
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        content.append(b"\r\n")
        if self.scope["method"] != "HEAD":
            content.append(body)
        self.transport.write(b"".join(content))
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()

    def whole_body(self) -> bytes | None:
        """The request's body when all of it is in (a small request arrives in one read), taken
        as ``receive`` would take it, without a coroutine and a message; None otherwise (the
        caller then reads it with ``receive``)."""
        if (self.more_body or self.waiting_for_100_continue or self.disconnected or self.response_complete
                or not self.message_event.is_set()):  # fmt: skip
            return None
        self.flow.resume_reading()  # as receive() does: a large body may have paused reading
        self.message_event.clear()
        body = bytes(self.body)
        self.body = bytearray()
        return body

    def cut(self) -> None:
        """The answer began but cannot be completed: close the connection (a chunked answer then
        lacks its last chunk, an answer with a length its bytes, and the client knows it)."""
        self.keep_alive = False
        self.disconnected = True
        self.message_event.set()
        self.transport.close()

    def lost(self) -> None:
        """The connection is gone (called by the protocol)."""
        hangup, self.hangup = self.hangup, None
        if hangup is not None and not self.response_complete:
            hangup()
