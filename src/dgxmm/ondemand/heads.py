"""The request headers the gateway acts on, read in one pass over the head.

The gateway needs five things from a request's headers: whether a header that may appear once
appears twice, the ``Authorization`` value, the ``Content-Length``, the health-check marker and
the caller's ``x-request-id``. Five scans of the same dozen fields cost five loops; one pass
collects all of them. The first copy of a header is the one that counts everywhere.

A singleton header that appears twice is refused: which copy counts is ambiguous (the gateway
reads the first, an engine may read the last, or refuse the request and break its answer, as
aiohttp's server does for a HEAD), the stuff of request smuggling.
"""

from __future__ import annotations

from dgxmm.ondemand import health
from dgxmm.telemetry.exchange import HEADER as REQUEST_ID

SINGLETONS = frozenset({b"host", b"content-length", b"content-type", b"transfer-encoding", b"user-agent",
                        b"authorization"})  # fmt: skip
WATCHED = SINGLETONS | {REQUEST_ID, health.HEADER}


class Heads:
    """What the gateway reads from one request's headers (names are lowercase, as the server
    hands them over)."""

    __slots__ = ("found", "repeated")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        found: dict[bytes, bytes] = {}
        repeated: bytes | None = None
        for name, value in headers:
            if name in WATCHED:
                if name not in found:
                    found[name] = value
                elif repeated is None and name in SINGLETONS:
                    repeated = name
        self.found = found
        self.repeated = repeated  # the first singleton seen twice, if any

    def get(self, name: bytes) -> str | None:
        value = self.found.get(name)
        return None if value is None else value.decode("latin-1")

    def request_id(self) -> bytes | None:
        return self.found.get(REQUEST_ID)
