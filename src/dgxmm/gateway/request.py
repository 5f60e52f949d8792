"""A gateway request as the gateway sees it: what it reads of the request, how it answers.

``asgirequest.AsgiRequest`` is the one object of this shape in dgxmm: every gateway request comes
through ASGI and is read and answered through it. Tests give the gateway recorded requests of
the same shape (tests/unit/recorded.py), so its checks run without a server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dgxmm.front.body import BodyBudget

if TYPE_CHECKING:
    from dgxmm.gateway.exchange import Exchange


@dataclass(frozen=True)
class Dialect:
    """The API a request came in by, and what that changes at the gateway: the activity log's
    label (``name``), the caller key a request without credentials acts as (``keyless``:
    ``[ollama] keyless_key``, whose clients cannot send a key; None: refused 401), and whether
    its body is translated as it is read (``translates``): then the body picks the router's
    endpoint (a raw prompt is a completion, an empty one a load: the request sets ``ex.route``
    as it hands the body over) and the router's load and unload routes exist for it (``routes.OWN``)."""

    name: str
    keyless: str | None = None
    translates: bool = False


OPENAI = Dialect("openai")  # every request but the Ollama API's (ollama/)


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
    dialect: Dialect
    # The gateway's record of the request, set as it begins: Ollama's answers read its cold start.
    exchange: Exchange | None

    async def body(
        self, limit: int, *, timeout_s: float | None = None, budget: BodyBudget | None = None
    ) -> bytearray | None:
        """The whole body (one buffer, never copied whole), or None once more than ``limit``
        bytes came; ``front.body.ClientGone`` when the caller hangs up first, ``BodyTimeout``
        when it stalls, ``OverBudget`` (see ``front.body.read_buffer``, whose contract with the
        budget this is)."""

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
