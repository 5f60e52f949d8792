"""The caller's request to llama.cpp's model-management routes (``llamacpp.api``) standing for
one of the model router's (``ModelsRequest``): its body checked and handed over in the router's
shape, the router's answer given llama.cpp's (or llama-swap's) shape."""

from __future__ import annotations

import json
from typing import Any

from dgxmm.front.body import BodyBudget, OverBudget
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.request import Dialect, GatewayRequest
from dgxmm.gateway.responses import JSON
from dgxmm.gateway.routes import LOAD, PROPS, UNLOAD
from dgxmm.gateway.standin import StandIn

DIALECT = Dialect("llamacpp", translates=True)  # translates: the router's load and unload routes exist for it
TRAFFIC = frozenset({"infill", "completion", "reranking"})  # passed through, body and answer
PASSED = TRAFFIC | {PROPS}  # answers passed through as they come (a ready engine's /props too)
BODY_BYTES = 64 * 1024  # a load or an unload names a model: nothing longer is one
RUNNING = {"loaded": "ready", "loading": "starting", "sleeping": "asleep"}  # llama-swap's words


class ModelsRequest(StandIn):
    """The caller's request standing for the router's ``routed`` one: a load's or an unload's
    body checked and handed over as ``{"model": NAME}``; a 200 answer given llama.cpp's shape,
    any other passed on as the gateway wrote it (dgxmm's error envelope, OpenAI's, which
    llama.cpp's own errors follow). ``named``: the model named elsewhere than in the body
    (llama-swap's unload names it in the path), whose 200 is llama-swap's ``OK``."""

    def __init__(self, inner: GatewayRequest, route: str, routed: str, named: str | None = None) -> None:
        super().__init__(inner, "GET" if route in ("models", "running", PROPS) else "POST", routed, DIALECT)
        self.route = route
        self.named = named
        if route == PROPS:
            self.query = inner.query  # (names the model)
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._held: list[bytes] = []

    async def body(
        self, limit: int, *, timeout_s: float | None = None, budget: BodyBudget | None = None
    ) -> bytearray | None:
        if self.route in TRAFFIC:
            return await self.inner.body(limit, timeout_s=timeout_s, budget=budget)
        if self.named is not None:  # (the caller's body, if any, is not read)
            named = bytearray(json.dumps({"model": self.named}).encode())
            if budget is not None and not budget.take(len(named)):
                raise OverBudget
            return named
        raw = await self.inner.body(min(limit, BODY_BYTES), timeout_s=timeout_s, budget=budget)
        if raw is None or self.method == "GET":
            return raw
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            body = None
        name = body.get("model") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise Refused(400, "invalid_request", 'a JSON body naming the model: {"model": NAME}')
        new = bytearray(json.dumps({"model": name}).encode())
        if budget is not None:
            budget.resize(len(raw), len(new))
        return new

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.response_started = True
        if status != 200 or self.route == "models" or self.route in PASSED:
            await self.inner.respond(status, headers, body)
            return
        kept = [(k, v) for k, v in headers if k != b"content-type"]
        if self.named is not None:
            await self.inner.respond(200, [(b"content-type", b"text/plain; charset=utf-8"), *kept], b"OK")
            return
        answer = json.loads(body)
        out: dict[str, Any] = {"success": True} if self.route in (LOAD, UNLOAD) else running(answer["data"])
        await self.inner.respond(200, [JSON, *kept], json.dumps(out).encode())

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.response_started = True
        if self.route in PASSED:
            await self.inner.start(status, headers)
        self._status, self._headers = status, headers

    async def write(self, chunk: bytes) -> None:
        if self.route in PASSED:
            await self.inner.write(chunk)
        else:
            self._held.append(chunk)

    async def end(self, last: bytes = b"") -> None:
        if self.route in PASSED:
            await self.inner.end(last)
            return
        self._held.append(last)
        await self.respond(self._status, self._headers, b"".join(self._held))

    def cut(self) -> None:
        self.inner.cut()


def running(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """llama-swap's ``GET /running``: each model that holds an engine now, once (by its served
    name, not again by each alias), with its state in llama-swap's words."""
    out = []
    for entry in entries:
        state = RUNNING.get(entry["status"]["value"])
        if state is not None and not entry["dgxmm"]["alias"]:
            out.append({"model": entry["id"], "state": state, "name": entry["dgxmm"]["deployment"]})
    return {"running": out}


class Kept(ModelsRequest):
    """One of the router's requests made for the caller's: its answer kept here, not sent."""

    def __init__(self, inner: GatewayRequest, route: str, routed: str, named: str | None = None) -> None:
        super().__init__(inner, route, routed, named)
        self.answer: tuple[int, list[tuple[bytes, bytes]], bytes] = (0, [], b"")

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.response_started = True
        self.answer = (status, headers, body)
