"""The test engine's sleep mode, as vLLM's development mode serves it (``--sleep-mode``):
``POST /sleep?level=1|2`` or ``?tags=weights|kv_cache``, ``POST /wake_up`` (all of it, or
``?tags=`` one tag at a time), ``POST /collective_rpc`` (``{"method": "reload_weights"}`` only,
and only while the weights' memory is awake and their contents are gone, as after a level 2
sleep), ``GET /is_sleeping`` (true until every slept tag is awake again). Traffic waits while
anything sleeps. Each call is recorded like any request (``/_test/requests``), so tests read the
order dgxmm called them in."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

TAGS = ("weights", "kv_cache")


class SleepState:
    def __init__(self, awake: asyncio.Event, wake_delay: float, say: Callable[..., None], name: str) -> None:
        self.awake = awake  # set while nothing sleeps: traffic waits on it
        self.wake_delay = wake_delay
        self.say, self.name = say, name
        self.asleep: set[str] = set()
        self.weights_lost = False  # level 2: the weights' contents were dropped, reload_weights owed
        # When the first wake step since the last sleep began: a level 2 wake is three steps (two
        # of them wake_delay each), and the engine's own wake time is all of them together.
        self.waking_since: float | None = None

    def sleep(self, level: str | None, tags: list[str]) -> web.Response:
        if tags:
            if any(tag not in TAGS for tag in tags):
                return web.json_response({"error": f"unknown tags {tags}"}, status=400)
            chosen = set(tags)
        elif level in (None, "1", "2"):
            chosen = set(TAGS)
            self.weights_lost = self.weights_lost or level == "2"
        else:
            return web.json_response({"error": f"unknown level {level}"}, status=400)
        self.asleep |= chosen
        self.awake.clear()
        self.waking_since = None
        return web.Response(status=200)

    async def wake(self, tags: list[str]) -> web.Response:
        if self.waking_since is None:
            self.waking_since = time.time()
        await asyncio.sleep(self.wake_delay)
        self.asleep -= set(tags) if tags else set(TAGS)
        if not self.asleep and not self.weights_lost:
            self._woke()
        return web.Response(status=200)

    def _woke(self) -> None:
        """Awake again: the line bench/coldstart.py reads the engine's wake time from."""
        self.awake.set()
        began = self.waking_since if self.waking_since is not None else time.time()
        self.say(f"testengine {self.name} woke at {time.time():.6f} after {time.time() - began:.6f} s", flush=True)

    def collective_rpc(self, body: Any) -> web.Response:
        if not isinstance(body, dict) or body.get("method") != "reload_weights":
            return web.json_response({"error": f"only reload_weights here, not {body!r}"}, status=400)
        if "weights" in self.asleep:
            return web.json_response({"error": "the weights' memory is asleep: wake it first"}, status=409)
        self.weights_lost = False
        if not self.asleep:
            self._woke()
        return web.json_response({"results": [None]})


def add_sleep(app: web.Application, state: SleepState) -> None:
    async def sleep(request: web.Request) -> web.Response:
        return state.sleep(request.query.get("level"), request.query.getall("tags", []))

    async def wake_up(request: web.Request) -> web.Response:
        return await state.wake(request.query.getall("tags", []))

    async def collective_rpc(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        return state.collective_rpc(body)

    async def is_sleeping(request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": bool(state.asleep) or state.weights_lost})

    app.router.add_post("/sleep", sleep)
    app.router.add_post("/wake_up", wake_up)
    app.router.add_post("/collective_rpc", collective_rpc)
    app.router.add_get("/is_sleeping", is_sleeping)
