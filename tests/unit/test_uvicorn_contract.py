"""What dgxmm's front door (dgxmm/front/protocol.py, dgxmm/front/server.py) relies on of uvicorn,
held to its meaning on uvicorn's own classes: a uvicorn release that renames, drops or changes
one of these fails here, not in production. The names are the protocol's ``UVICORN_NAMES``, the
server's shutdown and signal handling, and the config's protocol class."""

from __future__ import annotations

import asyncio
import inspect
import signal
from typing import Any

import httptools
import uvicorn
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from dgxmm.front.protocol import CYCLE_NAMES, UVICORN_NAMES

METHODS = {
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "shutdown": ["self"],
    "on_message_begin": ["self"],
    "on_header": ["self", "name", "value"],
    "on_headers_complete": ["self"],
    "on_body": ["self", "body"],
    "on_response_complete": ["self"],
}


class Transport(asyncio.Transport):
    """Enough of a socket transport for a protocol to serve one request."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.2", 4000), "sockname": ("127.0.0.1", 8090)}.get(name, default)

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_every_name_the_front_door_uses_is_listed_here() -> None:
    attributes = {
        "parser",
        "transport",
        "cycle",
        "headers",
        "url",
        "client",
        "server_state",
        "loop",
        "timeout_keep_alive_task",
    }
    assert set(CYCLE_NAMES) == {"response_started", "response_complete", "disconnected", "message_event", "keep_alive"}
    assert set(UVICORN_NAMES) == set(METHODS) | attributes


def test_the_methods_the_front_door_extends_keep_their_signatures() -> None:
    for name, params in METHODS.items():
        method = getattr(HttpToolsProtocol, name)
        assert inspect.isfunction(method), name
        assert list(inspect.signature(method).parameters) == params, name
    assert list(inspect.signature(HttpToolsProtocol.__init__).parameters) == [
        "self",
        "config",
        "server_state",
        "app_state",
        "_loop",
    ]


async def test_the_attributes_mean_what_the_front_door_reads_them_as() -> None:
    """One request served by uvicorn's own protocol: the parser is httptools', the head lands in
    ``url`` and ``headers``, the answer's end calls ``on_response_complete`` (which the
    subclass extends: it is looked up on the instance), which arms ``timeout_keep_alive_task``."""
    config = Config(app, http=HttpToolsProtocol, lifespan="off", log_config=None, timeout_keep_alive=5)
    state = ServerState()
    protocol = HttpToolsProtocol(config, state, {}, asyncio.get_running_loop())
    ended: list[bool] = []
    original = protocol.on_response_complete
    protocol.on_response_complete = lambda: (ended.append(True), original())[1]  # type: ignore[method-assign]
    transport = Transport()
    protocol.connection_made(transport)
    assert protocol.transport is transport and protocol.client == ("127.0.0.2", 4000)
    assert protocol in state.connections and protocol.loop is asyncio.get_running_loop()
    assert isinstance(protocol.parser, httptools.HttpRequestParser) and protocol.cycle is None
    assert protocol.timeout_keep_alive_task is None
    protocol.parser.feed_data(b"GET /p?q=1 HTTP/1.1\r\nHost: x\r\nX-A: b\r\n\r\n")
    assert protocol.url == b"/p?q=1" and protocol.headers == [(b"host", b"x"), (b"x-a", b"b")]
    assert protocol.cycle is not None and protocol.cycle.response_complete is False
    while not ended:
        await asyncio.sleep(0)
    assert protocol.cycle.response_complete is True
    assert bytes(transport.written).startswith(STATUS_LINE[200]) and transport.written.endswith(b"ok")
    assert isinstance(protocol.timeout_keep_alive_task, asyncio.TimerHandle)  # armed by the answer's end
    assert state.default_headers == [] or all(isinstance(h, tuple) for h in state.default_headers)
    protocol.shutdown()  # idle: closed now
    assert transport.closed
    protocol.connection_lost(None)
    assert protocol not in state.connections and protocol.timeout_keep_alive_task is None


def test_the_server_s_shutdown_and_signals_are_what_dgxmm_extends(monkeypatch) -> None:
    assert list(inspect.signature(uvicorn.Server.shutdown).parameters) == ["self", "sockets"]
    assert inspect.iscoroutinefunction(uvicorn.Server.shutdown)
    # (sse-starlette wraps handle_exit when it is imported, as dgxmm's API does: its behaviour is
    # what counts, through the wrapper; the wrapper's process-wide flag is put back after)
    from sse_starlette.sse import AppStatus

    monkeypatch.setattr(AppStatus, "should_exit", AppStatus.should_exit)
    server = uvicorn.Server(Config(app, lifespan="on", log_config=None))
    assert (server.should_exit, server.force_exit) == (False, False)
    assert isinstance(server.server_state.tasks, set)
    server.handle_exit(signal.SIGTERM, None)
    assert (server.should_exit, server.force_exit) == (True, False)
    server.handle_exit(signal.SIGTERM, None)  # uvicorn forces only on a second SIGINT: dgxmm adds SIGTERM
    assert server.force_exit is False
    server.handle_exit(signal.SIGINT, None)
    assert server.force_exit is True
    source = inspect.getsource(uvicorn.Server.shutdown)
    assert "if not self.force_exit:" in source and "self.lifespan.shutdown()" in source  # skipped on force


def test_the_config_takes_the_protocol_class() -> None:
    class Mine(HttpToolsProtocol):
        pass

    config = Config(app, http=Mine, log_config=None, timeout_keep_alive=3, timeout_graceful_shutdown=7)
    config.load()
    assert config.http_protocol_class is Mine
    assert (config.timeout_keep_alive, config.timeout_graceful_shutdown) == (3, 7)


async def test_a_cycle_marked_disconnected_ends_its_application_quietly() -> None:
    """How the front door ends a request it refused while the application holds it (a body it
    cannot parse): ``disconnected`` and ``message_event`` make the application's ``receive``
    say the client is gone and its ``send`` write nothing; ``keep_alive`` False closes the
    connection after an answer; ``response_started`` says whether one began."""
    received: list[Any] = []
    wrote: list[Any] = []

    async def waits_for_its_body(scope: Any, receive: Any, send: Any) -> None:
        received.append(await receive())
        received.append(await receive())  # the rest of the body, which never comes
        await send({"type": "http.response.start", "status": 200, "headers": []})
        wrote.append(True)

    config = Config(waits_for_its_body, http=HttpToolsProtocol, lifespan="off", log_config=None)
    protocol = HttpToolsProtocol(config, ServerState(), {}, asyncio.get_running_loop())
    transport = Transport()
    protocol.connection_made(transport)
    protocol.parser.feed_data(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n12345")
    cycle = protocol.cycle
    assert set(CYCLE_NAMES) <= set(vars(cycle))
    while not received:
        await asyncio.sleep(0)
    assert received[0] == {"type": "http.request", "body": b"12345", "more_body": True}
    assert cycle.response_started is False and cycle.keep_alive is True
    cycle.disconnected = True
    cycle.message_event.set()
    while len(received) < 2 or not wrote:
        await asyncio.sleep(0)
    assert received[1] == {"type": "http.disconnect"}
    assert bytes(transport.written) == b""  # its answer went nowhere
