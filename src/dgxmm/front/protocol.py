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
* **Idle time.** A keep-alive connection idle for ``keep_alive_s`` after an answer is closed:
  uvicorn's rule, with its timer made lazy the same way (uvicorn arms one per answer and
  cancels it at the next read).
* **Request target.** A raw ``#`` (a fragment, which HTTP never sends) is refused with 400;
  the parser would drop it silently and the application would see another path.
* **Connections.** Each connection is counted in the server's ``ConnectionBudget`` (see
  ``connections``), which may close spare connections to admit a new one, drop the biggest
  unfinished head, or refuse the new connection with 503.

Every refusal is an OpenAI-style JSON error with ``Connection: close``, followed by a lingering
close: the write side is shut and further input is read and dropped for ``linger_s`` (at most
``linger_bytes`` of it), so the client reads the answer instead of a connection reset.
Uvicorn's plain-text 400 for unparsable requests gets the same shape.

A request whose path is the gateway's (the config's ``door`` says which) skips ASGI: it becomes a
``FrontRequest`` (front/request.py) handed to ``door.serve`` in a task of its own, with no scope,
cycle or messages. Everything else (the admin API, the UI) gets uvicorn's ASGI cycle, built as
uvicorn builds it. Both kinds share the connection's pipeline (a request pipelined behind an
unfinished answer waits, with reading paused), its timers, limits and budget.

The limits cost about 3 us per request over uvicorn's class (``bench/protocol.py``); work that
makes the request path cheaper can keep them by keeping this class's hooks.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from typing import Any, Protocol, cast
from urllib.parse import unquote

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from dgxmm.errors import error_body
from dgxmm.front.connections import ConnectionBudget
from dgxmm.front.limits import FrontLimits
from dgxmm.front.request import FrontRequest

log = logging.getLogger(__name__)

HASH = ord("#")  # an int: CPython 3.11 tests bytes-in-bytes by raising and clearing a TypeError first (10x slower)
BODY_PIECE = 16 * 1024  # bodies are fed in pieces of this size: a pipelined head counts its whole piece


class GatewayDoor(Protocol):
    """Where the front door hands the gateway's requests (``ondemand.mount.OndemandFront``)."""

    def routes_to_gateway(self, path: str) -> bool: ...

    def serve(self, req: FrontRequest) -> Awaitable[None]: ...


class FrontConfig(Config):
    """Uvicorn's config plus what every connection of the server shares."""

    def __init__(
        self, app: Any, *, limits: FrontLimits, budget: ConnectionBudget, door: GatewayDoor | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(app, http=FrontDoorProtocol, **kwargs)
        self.limits = limits
        self.budget = budget
        self.door = door


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
        self.door = front.door
        self.in_head = True  # the next bytes belong to a request head (also before the first byte)
        self.head_bytes = 0
        self.head_recorded = False  # the budget counts this head's bytes (it spans reads)
        self.head_deadline = 0.0
        self.piece = 0  # length of the piece being parsed
        self.head_timer: asyncio.TimerHandle | None = None
        self.idle_deadline = 0.0  # 0 while not idle between requests (uvicorn's keep-alive)
        self.linger_timer: asyncio.TimerHandle | None = None
        self.refusal: _Refusal | None = None
        self.closing = False
        self.discarded = 0

    # --- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if not self.budget.admit(self):
            self.refuse(503, "server_busy", "too many open connections, try again")
            return
        self._start_head_clock()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self.budget.leave(self)
        cycle = self.cycle
        if type(cycle) is not FrontRequest:
            super().connection_lost(exc)
            return
        self.cycle = None  # type: ignore[assignment]  # (uvicorn's part is for its own cycles)
        super().connection_lost(exc)
        self.cycle = cycle
        cycle.lost()

    def evict(self) -> None:
        """The budget needs this place: an idle connection is closed, anything else dropped."""
        self._cancel_timers()
        self._unset_keepalive_if_required()
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
        self._unset_keepalive_if_required()
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
            if self.transport.is_closing():
                return  # dropped: the unfinished heads of all connections were too many bytes
        elif self.cycle is None or self.cycle.response_complete:
            # The rest of a body whose request was answered already: the idle clock runs only
            # from an answer's end, so without this the connection would wait forever.
            self._idle()

    def _head_within_limits(self) -> bool:
        """Between reads of an unfinished head: its size and field count (a field count checked
        here, not per field, keeps the common path cheap; one read adds at most 64 KiB)."""
        if not self.in_head:
            return True
        if self.head_bytes >= self.limits.max_header_bytes:
            self.refuse(431, "request_header_fields_too_large",
                        f"the request line and headers exceed {self.limits.max_header_bytes} bytes")  # fmt: skip
            return False
        if self.headers and len(self.headers) > self.limits.max_headers:
            self.refuse(431, "request_header_fields_too_large", f"more than {self.limits.max_headers} header fields")
            return False
        return True

    def _feed(self, piece: bytes | memoryview) -> bool:
        """Parse one piece; False when the connection is done with (refused or closed)."""
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
        return not (self.closing or self.transport.is_closing())

    # --- parser callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        # uvicorn's per-request state; its ASGI scope only once the request is known to need one
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.in_head = True
        self.head_bytes = self.piece  # this request's bytes in the current piece, at most
        self._start_head_clock()

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.head_recorded:
            self.head_recorded = False
            self.budget.reading(self, 0)
        if len(self.headers) > self.limits.max_headers:
            self._stop(431, "request_header_fields_too_large", f"more than {self.limits.max_headers} header fields")
        if HASH in self.url:
            self._stop(400, "invalid_path", "a '#' fragment is not allowed in a request")
        req = self._gateway_request()
        if req is None:
            self._asgi_scope()
            super().on_headers_complete()
        else:
            existing = self.cycle
            self.cycle = req  # type: ignore[assignment]
            if existing is None or existing.response_complete:
                self._start_asgi_task(req, None)  # type: ignore[arg-type]
            else:  # pipelined behind an unfinished answer: it waits (uvicorn's own rule)
                self.flow.pause_reading()
                self.pipeline.appendleft((req, None))  # type: ignore[arg-type]
        self.budget.busy(self)

    def _gateway_request(self) -> FrontRequest | None:
        """The request as a ``FrontRequest`` when its path is the gateway's, else None. Only an
        origin-form target (``/path?query``, what every client sends) is read here; anything
        else takes uvicorn's way, and a gateway path among it is adapted from ASGI."""
        url = self.url
        if self.door is None or url[:1] != b"/" or self.root_path:
            return None
        raw_path, _, query = url.partition(b"?")
        try:
            path = raw_path.decode("ascii")
        except UnicodeDecodeError:
            return None
        if "%" in path:
            path = unquote(path)
        if not self.door.routes_to_gateway(path):
            return None
        parser = self.parser
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        return FrontRequest(self, parser.get_method().decode("ascii"), path, raw_path, query, self.headers,
                            keep_alive, self.expect_100_continue)  # fmt: skip

    def _asgi_scope(self) -> None:
        """The request's ASGI scope, as uvicorn's ``on_message_begin`` makes it."""
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()
        self.url, self.headers, self.expect_100_continue = url, headers, expect
        self.scope["headers"] = headers

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if type(cycle) is not FrontRequest:
            super()._start_asgi_task(cycle, app)
            return
        task = self.loop.create_task(cycle.run(self.door.serve))  # type: ignore[union-attr]
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is FrontRequest:
            cycle.on_body(body)
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is FrontRequest:
            cycle.on_message_complete()
        else:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        # uvicorn's, with the idle clock instead of a timer per answer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle()
        # self.cycle is the newest request parsed: one pipelined behind keeps the connection busy.
        if self.cycle.response_complete:
            self.budget.spare(self)

    def _stop(self, status: int, code: str, message: str) -> None:
        self.refusal = _Refusal(status, code, message)
        raise self.refusal

    # --- refusals and timers ------------------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        self.refuse(400, "invalid_request", msg)

    def refuse(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` with a JSON error and close after a short linger. While an answer to
        an earlier request is still being written there is no room for another: then the
        connection is simply closed."""
        if self.closing:
            return
        self.closing = True
        self._cancel_timers()
        self._unset_keepalive_if_required()
        self.budget.closing(self)
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        body = json.dumps(error_body(status, code, message)).encode()
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
                    % len(body))  # fmt: skip
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
        self.refuse(408, "request_timeout",
                    f"the request line and headers did not arrive within {self.limits.header_timeout_s:g} s")  # fmt: skip

    def _idle(self) -> None:
        """The connection waits for its next request: it closes ``keep_alive_s`` from now unless
        one comes. The timer is armed only when none is (the next answers move the deadline)."""
        self.idle_deadline = self.loop.time() + self.timeout_keep_alive
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_at(self.idle_deadline, self._idle_timeout)

    def _unset_keepalive_if_required(self) -> None:
        """Input came: the connection is not idle (the timer, when it fires, sees that)."""
        self.idle_deadline = 0.0

    def _idle_timeout(self) -> None:
        self.timeout_keep_alive_task = None
        if not self.idle_deadline:
            return  # busy since: the end of its answer arms the timer again
        if self.loop.time() < self.idle_deadline:
            self.timeout_keep_alive_task = self.loop.call_at(self.idle_deadline, self._idle_timeout)
            return
        self.timeout_keep_alive_handler()

    def _cancel_timers(self) -> None:
        for timer in (self.head_timer, self.linger_timer, self.timeout_keep_alive_task):
            if timer is not None:
                timer.cancel()
        self.head_timer = self.linger_timer = self.timeout_keep_alive_task = None
        self.idle_deadline = 0.0
