#!/usr/bin/env python3
"""``dgxmm serve`` under granian instead of dgxmm's own front door: a benchmark's launcher, to
measure whether another server costs less CPU per request (bench/frontdoors.py). Not a way to
run dgxmm: none of the front door's limits (head size and deadline as dgxmm sets them, the
connection budget that keeps the admin API reachable, lingering close) hold here, nor dgxmm's
shutdown order.

    .venv/bin/pip install -e '.[frontdoors]'     # granian, pinned
    .venv/bin/python bench/granian_serve.py --config FILE [--interface asgi|rsgi] [--task-impl asyncio|rust]

One granian worker process (the controller's state lives in one process) with one Rust runtime
thread, on uvloop, HTTP/1 only, no WebSocket, a 10 s head deadline (dgxmm's
``header_timeout_s``). The application is built in the worker by ``asgi_app`` or ``rsgi_app``
from ``$DGXMM_CONFIG``, the way ``dgxmm serve`` builds it (``create_app``; its lifespan takes
the data directory's lock).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from dgxmm.app import create_app
from dgxmm.front.body import ClientGone
from dgxmm.front.cycle import FRONT
from dgxmm.front.limits import raise_open_files_limit
from dgxmm.ondemand.errors import Refused
from dgxmm.ondemand.gateway import Gateway
from dgxmm.ondemand.heads import Heads
from dgxmm.settings import load_settings
from dgxmm.telemetry import logs
from dgxmm.telemetry.access import finish
from dgxmm.telemetry.exchange import Exchange, request_id_of


class _NoCycle:
    """What the gateway's checks read of the front door's cycle when there is none."""

    @staticmethod
    def whole_body() -> None:
        return None  # the body is read with receive()


async def _under_plain_asgi(self: Gateway, scope: Any, receive: Any, send: Any) -> None:
    """The gateway's request under a server without dgxmm's cycle in the scope (a benchmark's
    patch, as bench/nometrics.py patches ``finish``): answers go through ``send`` (two messages),
    and a task per request watches ``receive()`` after the body for the hang-up that cancels the
    request's work, as the gateway did before the front door's cycle had ``hangup``."""
    client = scope.get("client")
    heads = Heads(scope["headers"])
    ex = Exchange(time.monotonic(), request_id_of(heads.request_id()), client[0] if client else "")
    task = asyncio.current_task()
    gone = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal gone
        while (await receive())["type"] != "http.disconnect":
            pass
        gone = True
        if task is not None:
            task.cancel()

    try:
        route, dep, payload = await self._checks_then_body(scope, receive, _NoCycle(), heads, ex)  # type: ignore[arg-type]
        watcher = asyncio.create_task(watch())
        await self._dispatch(scope, send, route, dep, payload, heads, ex)
    except Refused as exc:
        await self._refuse(send, ex, exc)
    except ClientGone:
        return
    except asyncio.CancelledError:
        if not gone:
            raise
    finally:
        if watcher is not None:
            watcher.cancel()
        finish(self._metrics, scope, ex)


def _serve_plain_asgi() -> None:
    """Patch the gateway so that a request without dgxmm's cycle takes ``_under_plain_asgi``."""
    original = Gateway.__call__

    async def call(self: Gateway, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and FRONT not in (scope.get("extensions") or {}):
            await _under_plain_asgi(self, scope, receive, send)
            return
        await original(self, scope, receive, send)

    Gateway.__call__ = call  # type: ignore[method-assign]


def asgi_app() -> Any:
    """The ASGI application, built in granian's worker."""
    _serve_plain_asgi()
    settings = load_settings(Path(os.environ["DGXMM_CONFIG"]))
    logs.configure(settings.server.log_level, settings.server.log_format)
    raise_open_files_limit()
    return create_app(settings)


def rsgi_app() -> Any:
    """The same application behind the RSGI adapter (bench/rsgi_front.py)."""
    from rsgi_front import RSGIFront

    return RSGIFront(asgi_app())


def main() -> None:
    from granian import Granian
    from granian.constants import HTTPModes, Interfaces, Loops, TaskImpl
    from granian.http import HTTP1Settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--interface", choices=("asgi", "rsgi"), default="asgi")
    parser.add_argument("--task-impl", choices=("asyncio", "rust"), default="asyncio")
    args = parser.parse_args()
    os.environ["DGXMM_CONFIG"] = str(args.config.resolve())
    settings = load_settings(args.config)
    server = settings.server
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the worker imports this module by name
    Granian(
        f"granian_serve:{args.interface}_app",
        factory=True,
        address=server.host,
        port=server.port,
        interface=Interfaces.ASGI if args.interface == "asgi" else Interfaces.RSGI,
        workers=1,
        runtime_threads=1,
        loop=Loops.uvloop,
        task_impl=TaskImpl(args.task_impl),
        http=HTTPModes.http1,
        websockets=False,
        backlog=2048,
        http1_settings=HTTP1Settings(header_read_timeout=int(server.header_timeout_s * 1000)),
        log_level="warning",
    ).serve()


if __name__ == "__main__":
    main()
