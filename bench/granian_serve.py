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
import os
import sys
from pathlib import Path
from typing import Any

from dgxmm.app import create_app
from dgxmm.front.limits import raise_open_files_limit
from dgxmm.settings import load_settings
from dgxmm import logs


def asgi_app() -> Any:
    """The ASGI application, built in granian's worker (its gateway requests take the app's ASGI
    way: ``gateway.asgirequest.AsgiRequest``, two messages per answer, a watcher task per request
    for the hang-up)."""
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
