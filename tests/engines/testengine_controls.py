"""The test engine's control endpoints, which tests call to read and steer it (never under /v1,
so a gateway never forwards them):

    GET|POST /_test/config    read / change chunk_delay, status, reply,
                              max_num_seqs, health_delay (every /health waits
                              that long), busy_health_delay live
    POST /_test/crash         answer, then exit 3 at once (testengine.py: it ends the process)
    GET|DELETE /_test/requests  list / clear recorded requests (all but
                              /health, /metrics and /_test/*)
    GET /_test/connections    {"open": n} open client TCP connections, not
                              counting the one asking; "total" counts it too;
                              how many were closed after a stream, when idle,
                              at the request cap (testengine_conn.py)
    GET /_test/env            {"CUDA_VISIBLE_DEVICES": ..., "CUDA_DEVICE_ORDER": ..., "pid"}
                              the device variables it was started with (null: unset)
    GET /_test/seats          {"running", "waiting", "peak"}: requests running now,
                              waiting for a seat, and the most that ever ran at once
"""

from __future__ import annotations

import json
import os

from aiohttp import web

from testengine_shapes import error_body


def _error(message: str, code: int) -> web.Response:
    return web.json_response(error_body(message, code), status=code)


async def ctl_config(request: web.Request) -> web.Response:
    engine = request.app["engine"]
    if request.method == "POST":
        try:
            change = json.loads(await request.read() or b"{}")
        except ValueError as exc:
            return _error(f"JSON decode error: {exc}", 400)
        unknown = set(change) - set(engine.config) if isinstance(change, dict) else {"<not an object>"}
        if unknown:
            return _error(f"unknown config keys: {sorted(unknown)}", 400)
        engine.config.update(change)
        engine.seats.limit = int(engine.config["max_num_seqs"])
        engine.seats.wake()
    return web.json_response(engine.config)


async def ctl_requests(request: web.Request) -> web.Response:
    engine = request.app["engine"]
    if request.method == "DELETE":
        engine.requests.clear()
        return web.json_response({"cleared": True})
    return web.json_response(engine.requests)


async def ctl_seats(request: web.Request) -> web.Response:
    """Requests running now, waiting for a seat, and the most that ever ran at once."""
    seats = request.app["engine"].seats
    return web.json_response({"running": seats.running, "waiting": seats.waiting, "peak": seats.peak})


async def ctl_connections(request: web.Request) -> web.Response:
    return web.json_response(request.app["engine"].conns.view(request))


DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


async def ctl_env(request: web.Request) -> web.Response:
    return web.json_response({**{name: os.environ.get(name) for name in DEVICE_VARIABLES}, "pid": os.getpid()})


def add_controls(router: web.UrlDispatcher) -> None:
    router.add_route("*", "/_test/config", ctl_config)
    router.add_route("*", "/_test/requests", ctl_requests)
    router.add_get("/_test/connections", ctl_connections)
    router.add_get("/_test/seats", ctl_seats)
    router.add_get("/_test/env", ctl_env)
