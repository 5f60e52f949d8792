"""llama.cpp's ``GET /models/sse``: each change of a model's load state, as llama.cpp's router
sends it and its web UI (and Open WebUI's llama.cpp connection) reads it: one SSE record per
change, whose ``data`` line is the envelope ``{"model": NAME, "event": "model_status", "data":
{"status": VALUE}}`` (``failed: true`` beside ``unloaded`` for a failed model, as the list says
it, ``gateway.modelstatus``), and ``model_remove`` for a model deleted.

The caller's key is checked, and its models read, by the router's list (``GET /models``, with
every check and its activity record): the stream tells of those models only, under each name
the list gave them (aliases included), and only when their value changes. It is fed from the
event bus (each deployment's new view), subscribed before the list is read so that no change
between the two is lost, with the console's bound on slow readers: a reader that falls the
bus's backlog behind is dropped, its stream ended (``events.EventBus``). A comment line every
``PING_S`` keeps an idle stream open through proxies; dgxmm's shutdown ends the stream as a
finished answer. dgxmm does not know an engine's load progress: none is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from dgxmm.events import EventBus, Message
from dgxmm.gateway.entrance import Entrance
from dgxmm.gateway.modelstatus import llamacpp_status
from dgxmm.gateway.request import GatewayRequest
from dgxmm.llamacpp.request import Kept
from dgxmm.records.deployment import State

PING_S = 15.0  # as the console's streams (api/streams.py)
HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class Follow:
    """What one stream tells: the caller's models by deployment (their names), and the status
    last sent of each."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.names: dict[str, list[str]] = {}
        self.last: dict[str, dict[str, Any]] = {}
        for entry in entries:
            dep_id = entry["dgxmm"]["deployment_id"]
            self.names.setdefault(dep_id, []).append(entry["id"])
            self.last[dep_id] = entry["status"]

    def records(self, message: Message) -> list[bytes]:
        """The SSE records a bus message makes (none for most)."""
        data = message.data
        names = self.names.get(data.get("id", "")) if message.kind == "deployment" else None
        if names is None:
            return []
        if data.get("removed"):
            del self.names[data["id"]]
            return [_record(name, "model_remove", {}) for name in names]
        phase = (data.get("ondemand") or {}).get("phase")
        status = llamacpp_status(State(data["state"]), phase)
        if status == self.last[data["id"]]:
            return []
        self.last[data["id"]] = status
        told = {"status": status["value"], **{k: v for k, v in status.items() if k != "value"}}
        return [_record(name, "model_status", told) for name in names]


def _record(model: str, event: str, data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps({"model": model, "event": event, "data": data}).encode() + b"\n\n"


async def serve(req: GatewayRequest, entrance: Entrance, router: str, bus: EventBus, stopping: asyncio.Event) -> None:
    sub = bus.subscribe()  # (before the list: a change meanwhile is heard)
    messages = aiter(sub)
    try:
        listing = Kept(req, "models", f"{router}/models")
        await entrance.serve(listing)
        status, headers, body = listing.answer
        if status != 200:
            await req.respond(status, headers, body)
            return
        follow = Follow(json.loads(body)["data"])
        await req.start(200, HEADERS)
        task = asyncio.current_task()
        assert task is not None
        req.hangup = task.cancel  # the caller hung up: the stream ends here
        try:
            await _stream(req, messages, follow, stopping)
        except asyncio.CancelledError:
            if not req.disconnected:
                raise
            return
        finally:
            req.hangup = None
        await req.end()
    finally:
        sub.close()


async def _stream(
    req: GatewayRequest, messages: AsyncIterator[Message], follow: Follow, stopping: asyncio.Event
) -> None:
    """Write each change until the bus drops the reader or dgxmm stops."""
    stopped = asyncio.ensure_future(stopping.wait())
    following: asyncio.Future[Message] | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(messages))
            while not (await asyncio.wait({following, stopped}, timeout=PING_S, return_when=asyncio.FIRST_COMPLETED))[
                0
            ]:
                await req.write(b": ping\n\n")
            if not following.done():
                return  # dgxmm stops
            try:
                message = following.result()
            except StopAsyncIteration:
                return  # fell the bus's backlog behind: dropped
            for record in follow.records(message):
                await req.write(record)
    finally:
        stopped.cancel()
        if following is not None and not following.done():
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await following
