"""A gateway request double (the shape of ``dgxmm.gateway.request.GatewayRequest``) that keeps
what the gateway answered: for unit tests that drive the forwarder or the guard without a socket."""

from __future__ import annotations

from typing import Any

from collections.abc import Callable
from dataclasses import dataclass, field

from dgxmm.gateway.request import OPENAI, Dialect


@dataclass
class Recorded:
    method: str = "POST"
    path: str = "/dgxmm/ondemand/d1/v1/chat/completions"
    query: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    client: tuple[str, int] | None = ("127.0.0.2", 40000)
    payload: bytes = b""
    disconnected: bool = False
    response_started: bool = False
    hangup: Callable[[], object] | None = None
    dialect: Dialect = OPENAI
    exchange: Any = None
    status: int = 0
    answer_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    ended: bool = False
    cuts: int = 0

    @property
    def raw_path(self) -> bytes:
        return self.path.encode()

    @property
    def body_bytes(self) -> bytes:
        return b"".join(self.chunks)

    async def body(self, limit: int, *, timeout_s: float | None = None, budget: Any = None) -> bytes | None:
        if len(self.payload) > limit:
            return None
        if budget is not None and not budget.take(len(self.payload)):
            from dgxmm.front.body import OverBudget

            raise OverBudget
        return self.payload

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        await self.start(status, headers)
        await self.end(body)

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        assert not self.response_started, "the answer began already"
        self.response_started = True
        self.status, self.answer_headers = status, headers

    async def write(self, chunk: bytes) -> None:
        assert self.response_started and not self.ended
        if chunk:
            self.chunks.append(chunk)

    async def end(self, last: bytes = b"") -> None:
        await self.write(last)
        self.ended = True

    def cut(self) -> None:
        self.cuts += 1
        self.disconnected = True
