"""A gateway request as the gateway sees it: what it reads of the request, how it answers.

Two objects have this shape. dgxmm's front door hands every request under the gateway's prefix
over as a ``front.request.FrontRequest``, with no ASGI scope or message in between (the hot path,
docs/performance.md). ``asgirequest.AsgiRequest`` gives the same shape to a request that came
through ASGI (another server, or a test driving the app directly), so the gateway has one
request path whatever serves it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class GatewayRequest(Protocol):
    method: str
    path: str  # percent-decoded
    raw_path: bytes  # as it came, checked by ``paths.segments``
    query: bytes
    headers: list[tuple[bytes, bytes]]  # lowercase names, in the order they came
    client: tuple[str, int] | None  # the raw TCP peer
    disconnected: bool  # the caller hung up (or the answer was cut): writes do nothing now
    response_started: bool
    # Run once if the caller hangs up before the answer is complete (set by the gateway).
    hangup: Callable[[], object] | None

    async def body(self, limit: int) -> bytes | None:
        """The whole body, or None once more than ``limit`` bytes came; ``front.body.ClientGone``
        when the caller hangs up first."""

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole answer (its Content-Length is set here)."""

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The head of an answer whose body follows: as long as a Content-Length among
        ``headers`` says, else in chunks."""

    async def write(self, chunk: bytes) -> None:
        """A piece of the body, once the caller's side has room for it."""

    async def end(self, last: bytes = b"") -> None:
        """The last piece of the body, and the end of the answer."""

    def cut(self) -> None:
        """The answer began and cannot be completed: the caller must see it cut short."""
