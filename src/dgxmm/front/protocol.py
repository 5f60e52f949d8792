"""dgxmm's HTTP/1.1 protocol: uvicorn's httptools protocol with a bounded front door.

Uvicorn's protocol hands whatever arrives to the parser: a request head of any size is buffered
(the parser keeps each header value whole), and nothing times out before the first response.
This subclass enforces, before the application sees a request (numbers in ``limits``):

* **Head size.** Bytes are fed to the parser in pieces no larger than the room left under
  ``max_header_bytes``, so no more than that is ever buffered for a head; a head that reaches
  the limit without ending gets 431. More than ``max_headers`` fields: 431 too. (For a request
  pipelined behind another, its bytes in the piece where it began count in full, a bound from
  above: the parser does not say where in a piece a request starts.)
* **Head time.** The request line and headers must arrive within ``header_timeout_s``, counted
  from the connection's start, or from a keep-alive request's first byte: else 408.
  Idle keep-alive connections are closed after ``keep_alive_s`` (uvicorn's own timer).
* **Request target.** A raw ``#`` (a fragment, which HTTP never sends) is refused with 400;
  the parser would drop it silently and the application would see another path.
* **Connections.** Each connection is counted in the server's ``ConnectionBudget`` (see
  ``connections``), which may close idle or still-reading connections to admit a new one, or
  refuse the new one with 503.

Every refusal is an OpenAI-style JSON error with ``Connection: close``, followed by a lingering
close: the write side is shut and further input is read and dropped for ``linger_s`` (at most
``linger_bytes`` of it), so the client reads the answer instead of a connection reset. Uvicorn's plain-text 400 for unparsable
requests gets the same shape.
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

from dgxmm.front.connections import ConnectionBudget, Phase
from dgxmm.front.limits import FrontLimits
from dgxmm.ondemand.responses import error_body

log = logging.getLogger(__name__)

BODY_PIECE = 16 * 1024  # bodies are fed in pieces of this size: a pipelined head counts its whole piece


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
        self.head_fields = 0
        self.piece = 0  # length of the piece being parsed
        self.head_timer: asyncio.TimerHandle | None = None
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
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self.budget.leave(self)
        super().connection_lost(exc)

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
        view = memoryview(data)
        while view:
            if self.in_head:
                piece = view[: self.limits.max_header_bytes - self.head_bytes]
                self.head_bytes += len(piece)
            else:
                piece = view[:BODY_PIECE]
            view = view[len(piece) :]
            self.piece = len(piece)
            if not self._feed(piece):
                return
            if self.in_head:
                self.budget.reading(self, self.head_bytes)
                if self.transport.is_closing():
                    return  # dropped: the heads of all connections were too many bytes
            if self.in_head and self.head_bytes >= self.limits.max_header_bytes:
                self.refuse(431, "request_header_fields_too_large",
                            f"the request line and headers exceed {self.limits.max_header_bytes} bytes")  # fmt: skip
                return
        if not self.in_head and self.timeout_keep_alive_task is None and (
            self.cycle is None or self.cycle.response_complete
        ):
            # The rest of a body whose request was answered already: uvicorn arms its keep-alive
            # timer only when an answer ends, so without this the connection would wait forever.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

    def _feed(self, piece: memoryview) -> bool:
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
        super().on_message_begin()
        self.in_head = True
        self.head_bytes = self.piece  # this request's bytes in the current piece, at most
        self.head_fields = 0
        if self.head_timer is None:
            self._arm_head_timer()
        self._set_phase()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_fields += 1
        if self.head_fields > self.limits.max_headers:
            self._stop(431, "request_header_fields_too_large",
                       f"more than {self.limits.max_headers} header fields")  # fmt: skip
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self.in_head = False
        self._cancel_head_timer()
        self.budget.reading(self, 0)
        if b"#" in self.url:
            self._stop(400, "invalid_path", "a '#' fragment is not allowed in a request")
        super().on_headers_complete()
        self._set_phase()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._set_phase()

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
        self.budget.set(self, Phase.CLOSING)
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

    def _head_timeout(self) -> None:
        self.head_timer = None
        if self.closing or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm_head_timer()  # a pipelined head waits behind an answer still being written
            return
        self.refuse(408, "request_timeout",
                    f"the request line and headers did not arrive within {self.limits.header_timeout_s:g} s")  # fmt: skip

    def _arm_head_timer(self) -> None:
        self.head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timeout)

    def _cancel_head_timer(self) -> None:
        if self.head_timer is not None:
            self.head_timer.cancel()
            self.head_timer = None

    def _cancel_timers(self) -> None:
        self._cancel_head_timer()
        if self.linger_timer is not None:
            self.linger_timer.cancel()
            self.linger_timer = None

    def _set_phase(self) -> None:
        if self.closing:
            return
        if (self.cycle is not None and not self.cycle.response_complete) or self.pipeline:
            phase = Phase.BUSY
        else:
            phase = Phase.READING if self.in_head else Phase.IDLE
        self.budget.set(self, phase)
