"""dgxmm's HTTP/1.1 protocol: uvicorn's httptools protocol with a bounded front door.

Uvicorn's protocol hands whatever arrives to the parser: a request head of any size is buffered
(the parser keeps each header value whole), and nothing times out before the first response.
This subclass enforces, before the application sees a request (numbers in ``limits``):

* **Head size.** A head that spans reads is fed to the parser in pieces no larger than the room
  left under ``max_header_bytes``, so no more than that is ever buffered for it; a head that
  reaches the limit without ending gets 431. More than ``max_headers`` fields: 431 too, counted
  once per read and once per complete head (not per field: this is every request's path). For a
  request pipelined behind another, its bytes in the piece where it began count in full, a
  bound from above: the parser does not say where in a piece a request starts.
* **Head time.** The request line and headers must arrive within ``header_timeout_s``, counted
  from the connection's start, or from a keep-alive request's first byte: else 408. One timer
  per connection, moved lazily: a request costs a clock read, not a timer.
* **Idle time.** A keep-alive connection with no new request for ``keep_alive_s`` after its
  last answer is closed: uvicorn's timer, stopped here only when a request begins (uvicorn stops
  it on any input, so the rest of a refused request's body would keep a connection open for as
  long as a client likes to send it).
* **Request target.** A raw ``#`` (a fragment, which HTTP never sends) is refused with 400;
  the parser would drop it silently and the application would see another path.
* **Trailers and chunk framing.** Trailer fields after a chunked body's last chunk are held to
  the head's limits (431 past ``max_headers`` fields or ``max_header_bytes``) and dropped: they
  never reach the application, let alone an engine. What a chunked body carries besides its data
  (chunk sizes, extensions, trailers) may be at most ``max_header_bytes`` plus an eighth of the
  data, else 400: the parser buffers a trailer's value whole, and grows it in time quadratic in
  its length, so it is never let grow past that.
* **Upgrades.** dgxmm upgrades no connection: a request asking for one (``Connection:
  upgrade``) with a body is refused with 400, since the parser hands nothing after such a head
  to the application; one without a body is answered, and its connection closed after.
* **Connections.** Each connection is counted in the server's ``ConnectionBudget`` (see
  ``connections``), which may close spare connections to admit a new one, drop the biggest
  unfinished head, or refuse the new connection with 503.

Every refusal is an OpenAI-style JSON error with ``Connection: close``, followed by a lingering
close: the write side is shut and further input is read and dropped for ``linger_s`` (at most
``linger_bytes`` of it), so the client reads the answer instead of a connection reset. A request
the parser cannot read gets the same shape (400), logged at debug level: a flood of them must
not flood the log. A refusal that comes while the application holds the request but has not
begun its answer (a body that cannot be parsed, trailers past the limits) is answered too, and
the application is told the client is gone (uvicorn's cycle marked disconnected).

Every request, the gateway's included, then takes uvicorn's own way: its ASGI scope, cycle and
task. What this class relies on of uvicorn is a short list of names (``UVICORN_NAMES``), each
held by ``tests/unit/test_uvicorn_contract.py`` to its meaning, so a uvicorn release that changes
one fails a test instead of this class.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, cast

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from dgxmm.errors import error_body
from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits

log = logging.getLogger(__name__)

HASH = ord("#")  # an int: CPython 3.11 tests bytes-in-bytes by raising and clearing a TypeError first (10x slower)
BODY_PIECE = 16 * 1024  # bodies are fed in pieces of this size: a pipelined head counts its whole piece
# What this protocol uses of uvicorn's HttpToolsProtocol: the methods it extends (calling them)
# and the attributes it reads. tests/unit/test_uvicorn_contract.py holds each to its meaning.
UVICORN_NAMES = (
    "connection_made",
    "connection_lost",
    "shutdown",
    "on_message_begin",
    "on_header",
    "on_headers_complete",
    "on_body",
    "on_response_complete",
    "parser",
    "transport",
    "cycle",
    "headers",
    "url",
    "client",
    "server_state",
    "loop",
    "timeout_keep_alive_task",
)
# ... and of its request-response cycle (``cycle``), to end one whose request was refused.
CYCLE_NAMES = ("response_started", "response_complete", "disconnected", "message_event", "keep_alive")


class FrontConfig(Config):
    """Uvicorn's config plus what every connection of the server shares."""

    def __init__(self, app: Any, *, limits: FrontLimits, budget: ConnectionBudget, **kwargs: Any) -> None:
        super().__init__(app, http=FrontDoorProtocol, **kwargs)
        self.limits = limits
        self.budget = budget


class _Refusal(Exception):
    """Raised inside a parser callback to stop parsing; the connection then answers it."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class FrontDoorProtocol(HttpToolsProtocol):
    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        front = cast(FrontConfig, config)
        self.limits = front.limits
        self.budget = front.budget
        self.in_head = True  # the next bytes belong to a request head (also before the first byte)
        self.head_bytes = 0
        self.head_recorded = False  # the budget counts this head's bytes (it spans reads)
        self.head_deadline = 0.0
        self.piece = 0  # length of the piece being parsed
        self.head_timer: asyncio.TimerHandle | None = None
        self.linger_timer: asyncio.TimerHandle | None = None
        self.refusal: _Refusal | None = None
        self.closing = False
        self.discarded = 0
        self.body_bytes = 0  # of the request being read: its body's data
        self.framing = 0  # ... and what it carried besides (chunk sizes, extensions, trailers)
        self.trailers = 0  # trailer fields of the request being read
        self.begun = 0  # requests begun on this connection (a piece may end one body and begin the next)

    # --- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's does too
        super().connection_made(transport)
        if not self.budget.admit(self):
            self.refuse(503, "server_busy", "too many open connections, try again")
            return
        self._start_head_clock()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self.budget.leave(self)
        super().connection_lost(exc)

    def evict(self) -> None:
        """The budget needs this place: an idle connection is closed, anything else dropped."""
        self._cancel_timers()
        if self.in_head or self.closing:
            self.transport.abort()
        else:
            self.transport.close()

    def shutdown(self) -> None:
        if self.closing:
            self.transport.close()
            return
        super().shutdown()

    # --- input --------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.closing:  # lingering after a refusal: read and drop, within a budget
            self.discarded += len(data)
            if self.discarded > self.limits.linger_bytes:
                self.transport.close()
            return
        limit = self.limits.max_header_bytes
        if len(data) <= BODY_PIECE and (not self.in_head or self.head_bytes + len(data) < limit):
            # The usual read: a whole small request, or a piece of a body. One feed.
            if self.in_head:
                self.head_bytes += len(data)
            self.piece = len(data)
            if not self._feed(data):
                return
        else:
            view = memoryview(data)
            while view:
                piece = view[: limit - self.head_bytes] if self.in_head else view[:BODY_PIECE]
                if self.in_head:
                    self.head_bytes += len(piece)
                view = view[len(piece) :]
                self.piece = len(piece)
                if not self._feed(piece) or not self._head_within_limits():
                    return
        if self.in_head:
            if not self._head_within_limits():
                return
            self.head_recorded = True
            self.budget.reading(self, self.head_bytes)

    def _head_within_limits(self) -> bool:
        """Between reads of an unfinished head: its size and field count (a field count checked
        here, not per field, keeps the common path cheap; one read adds at most 64 KiB)."""
        if not self.in_head:
            return True
        if self.head_bytes >= self.limits.max_header_bytes:
            self.refuse(
                431,
                "request_header_fields_too_large",
                f"the request line and headers exceed {self.limits.max_header_bytes} bytes",
            )
            return False
        if self.headers and len(self.headers) > self.limits.max_headers:
            self.refuse(431, "request_header_fields_too_large", f"more than {self.limits.max_headers} header fields")
            return False
        return True

    def _feed(self, piece: bytes | memoryview) -> bool:
        """Parse one piece; False when the connection is done with (refused or closed)."""
        in_body, data_before, begun = not self.in_head, self.body_bytes, self.begun
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            pass  # no WebSocket here: the request was handled as plain HTTP
        except httptools.HttpParserError as exc:
            refusal, self.refusal = self.refusal, None
            if refusal is None:
                log.debug("invalid HTTP request from %s: %s", self.client, exc)
                refusal = _Refusal(400, "invalid_request", "invalid HTTP request")
            self.refuse(refusal.status, refusal.code, refusal.message)
            return False
        if in_body and self.begun == begun:  # (a piece that began a new request is that request's to count)
            self.framing += len(piece) - (self.body_bytes - data_before)
            if self.framing > self.limits.max_header_bytes + self.body_bytes // 8:
                self.refuse(400, "invalid_request", "the chunked body's framing and trailers are too large")
                return False
        return not (self.closing or self.transport.is_closing())

    # --- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        keep_alive = self.timeout_keep_alive_task  # a request began: the connection is not idle
        if keep_alive is not None:
            keep_alive.cancel()
            self.timeout_keep_alive_task = None
        self.in_head = True
        self.begun += 1
        self.head_bytes = self.piece  # this request's bytes in the current piece, at most
        self._start_head_clock()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.in_head:
            super().on_header(name, value)
            return
        # A trailer field (after a chunked body): held to the head's limits, never kept.
        self.trailers += 1
        self.framing += len(name) + len(value)
        if self.trailers > self.limits.max_headers:
            self._stop(431, "request_header_fields_too_large", f"more than {self.limits.max_headers} trailer fields")

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        super().on_body(body)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.body_bytes = self.framing = self.trailers = 0
        if self.head_recorded:
            self.head_recorded = False
            self.budget.reading(self, 0)
        if len(self.headers) > self.limits.max_headers:
            self._stop(431, "request_header_fields_too_large", f"more than {self.limits.max_headers} header fields")
        if HASH in self.url:
            self._stop(400, "invalid_path", "a '#' fragment is not allowed in a request")
        upgrade = self.parser.should_upgrade()
        if upgrade and any(name in (b"content-length", b"transfer-encoding") for name, _ in self.headers):
            self._stop(400, "invalid_request", "dgxmm upgrades no connection: the body of this request would be lost")
        super().on_headers_complete()
        if upgrade and self.cycle is not None:
            self.cycle.keep_alive = False  # the parser reads nothing after it: close after the answer
        self.budget.busy(self)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        # self.cycle is the newest request parsed: one pipelined behind keeps the connection busy.
        if self.cycle.response_complete:
            self.budget.spare(self)

    def _stop(self, status: int, code: str, message: str) -> None:
        self.refusal = _Refusal(status, code, message)
        raise self.refusal

    # --- refusals and timers ------------------------------------------------------------------

    def refuse(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` with a JSON error and close after a short linger. While an answer to
        an earlier request is still being written there is no room for another: then the
        connection is simply closed."""
        if self.closing:
            return
        self.closing = True
        self._cancel_timers()
        self.budget.closing(self)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if cycle.response_started:  # no room for another answer: the client sees the cut
                self.transport.close()
                return
            cycle.disconnected = True  # the application's request is refused: it writes nothing now
            cycle.message_event.set()
        body = json.dumps(error_body(status, code, message)).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body))
        self.transport.write(b"".join(head) + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.transport.resume_reading()
        self.linger_timer = self.loop.call_later(self.limits.linger_s, self.transport.close)

    def _start_head_clock(self) -> None:
        """A head starts now and must end by the deadline. The timer is armed only when none is
        (a keep-alive connection's next requests just move the deadline; the timer, when it
        fires, looks at the deadline then): per request this costs a clock read, not a timer."""
        self.head_deadline = self.loop.time() + self.limits.header_timeout_s
        if self.head_timer is None:
            self.head_timer = self.loop.call_at(self.head_deadline, self._head_timeout)

    def _head_timeout(self) -> None:
        self.head_timer = None
        if self.closing or self.transport.is_closing() or not self.in_head:
            return  # no head under way: the next one arms the timer again
        if self.loop.time() < self.head_deadline or (self.cycle is not None and not self.cycle.response_complete):
            # A later head, or one pipelined behind an answer still being written: look again.
            self.head_timer = self.loop.call_at(max(self.head_deadline, self.loop.time() + 1), self._head_timeout)
            return
        self.refuse(
            408,
            "request_timeout",
            f"the request line and headers did not arrive within {self.limits.header_timeout_s:g} s",
        )

    def _cancel_timers(self) -> None:
        for timer in (self.head_timer, self.linger_timer):
            if timer is not None:
                timer.cancel()
        self.head_timer = self.linger_timer = None
