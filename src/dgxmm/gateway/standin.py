"""A caller's request standing for one of the model router's, as another API's routes hand it to
the gateway (Ollama's ``/api``, llama.cpp's ``/models``): the gateway reads the route it stands
for (``path``) and the ``Dialect`` from it, and everything of the caller's connection (headers,
peer, hang-up) from the request it wraps. Subclasses translate its body and its answer."""

from __future__ import annotations

from collections.abc import Callable

from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.request import Dialect, GatewayRequest


class StandIn:
    def __init__(self, inner: GatewayRequest, method: str, routed: str, dialect: Dialect) -> None:
        self.inner = inner
        self.method = method
        self.path = routed
        self.raw_path = routed.encode()
        self.query = b""
        self.headers = inner.headers
        self.client = inner.client
        self.response_started = False
        self.dialect = dialect
        self.exchange: Exchange | None = None

    @property
    def disconnected(self) -> bool:
        return self.inner.disconnected

    @disconnected.setter
    def disconnected(self, value: bool) -> None:
        self.inner.disconnected = value

    @property
    def hangup(self) -> Callable[[], object] | None:
        return self.inner.hangup

    @hangup.setter
    def hangup(self, value: Callable[[], object] | None) -> None:
        self.inner.hangup = value
