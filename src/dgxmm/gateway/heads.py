"""The request headers as the gateway and its guard read them, in one pass over the head.

Per request the gateway needs: whether a header that may appear once appears twice, the
``Authorization`` value (or ``x-api-key``, where Anthropic's clients send the key), the ``Content-Length``, the health-check marker and the caller's
``x-request-id``; the guard needs to know whether a forwarding header came; the engine gets the
rest, minus what must not reach it. One pass collects all of it, and the headers sent up are
built there as bytes, ready to write. The first copy of a header is the one that counts.

What a header name means is worked out once per distinct name (``_KINDS``, bounded: a caller
that sends ever new names gets them worked out each time, not kept), because the same dozen
names come with every request.

Not sent up: Authorization, the keys some clients send beside it (``x-api-key``, ``api-key``),
Cookie, Host, forwarding headers (``X-Forwarded-*``, Forwarded,
X-Real-IP), hop-by-hop headers and any named in Connection, the health-check marker, and what
the gateway sets itself (Accept-Encoding, Content-Length, x-request-id), and dgxmm's own
``x-dgxmm-priority`` (reqpriority.py). Names are matched with
``_`` read as ``-``, so ``X_Forwarded_Host`` or ``Proxy_Authorization`` cannot slip past under
another spelling: servers that map headers to CGI-style variables (WSGI,
``HTTP_X_FORWARDED_FOR``) cannot tell the two apart.

A singleton header that appears twice is refused: which copy counts is ambiguous (the gateway
reads the first, an engine may read the last, or refuse the request and break its answer, as
aiohttp's server does for a HEAD), the stuff of request smuggling.
"""

from __future__ import annotations

from dgxmm.gateway import health
from dgxmm.gateway.exchange import HEADER as REQUEST_ID

PRIORITY = b"x-dgxmm-priority"  # a request's priority (reqpriority.py): dgxmm's, not the engine's

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
# ``expect``: the whole body goes with the head, there is nothing to wait for.
# ``x-api-key`` and ``api-key``: where Anthropic and Azure clients send a key (perhaps dgxmm's).
DROP_UP = HOP_BY_HOP | {
    b"authorization",
    b"x-api-key",
    b"api-key",
    b"cookie",
    b"host",
    b"forwarded",
    b"x-real-ip",
    health.HEADER,
    b"accept-encoding",
    b"content-length",
    b"expect",
    REQUEST_ID,
    PRIORITY,
}
SINGLETONS = frozenset(
    {b"host", b"content-length", b"content-type", b"transfer-encoding", b"user-agent", b"authorization", b"x-api-key"}
)
WATCHED = SINGLETONS | {REQUEST_ID, health.HEADER, PRIORITY}
FORWARDING = {b"x-forwarded-for": "X-Forwarded-For", b"forwarded": "Forwarded", b"x-real-ip": "X-Real-IP"}
PLAIN_CONNECTION = frozenset({b"keep-alive", b"close"})  # Connection values naming no other header
UNDERSCORE = ord("_")  # an int: CPython 3.11 tests bytes-in-bytes by raising and clearing a TypeError first

# What a (lowercase) name means: one of these kinds.
KEEP = 0  # sent up as it came
DROP = 1  # not sent up
WATCH_KEEP = 2  # its first value is kept (and a second copy of a singleton noted), and it is sent up
WATCH_DROP = 3  # the same, not sent up
RARE = 4  # a forwarding header (the guard refuses the request) or Connection (may name more): not sent up
MAX_KINDS = 1024
_KINDS: dict[bytes, int] = {}


def _kind(name: bytes) -> int:
    key = name.replace(b"_", b"-") if UNDERSCORE in name else name
    dropped = key in DROP_UP or key.startswith(b"x-forwarded-")
    if key in FORWARDING or key == b"connection":
        kind = RARE
    elif name in WATCHED:
        kind = WATCH_DROP if dropped else WATCH_KEEP
    else:
        kind = DROP if dropped else KEEP
    if len(_KINDS) < MAX_KINDS:
        _KINDS[name] = kind
    return kind


def _kind_of(name: bytes) -> int:
    kind = _KINDS.get(name)
    return _kind(name) if kind is None else kind


class Heads:
    """What the gateway reads from one request's headers (names are lowercase, as the front door
    and ASGI hand them over)."""

    __slots__ = ("forwarded", "found", "repeated", "upstream")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        found: dict[bytes, bytes] = {}
        repeated: bytes | None = None
        forwarded: bytes | None = None
        named = False
        up: list[bytes] = []
        kinds = _KINDS
        for name, value in headers:
            kind = kinds.get(name)
            if kind is None:
                kind = _kind(name)
            if kind == KEEP:  # the usual header: sent up as it came
                up += (name, b": ", value, b"\r\n")
            elif kind == WATCH_KEEP or kind == WATCH_DROP:
                if name not in found:
                    found[name] = value
                elif repeated is None and name in SINGLETONS:
                    repeated = name
                if kind == WATCH_KEEP:
                    up += (name, b": ", value, b"\r\n")
            elif kind == RARE:
                key = name.replace(b"_", b"-") if UNDERSCORE in name else name
                if key == b"connection":
                    named = named or value.lower() not in PLAIN_CONNECTION
                elif forwarded is None:
                    forwarded = name
        self.found = found
        self.repeated = repeated  # the first singleton seen twice, if any
        self.forwarded = forwarded  # the first forwarding header, if any
        # The header lines sent up (before Accept-Encoding and x-request-id, which the forwarder adds).
        self.upstream = _without_named(headers) if named else b"".join(up)

    def get(self, name: bytes) -> str | None:
        value = self.found.get(name)
        return None if value is None else value.decode("latin-1")

    def request_id(self) -> bytes | None:
        return self.found.get(REQUEST_ID)

    def forwarding_header(self) -> str | None:
        """How the first forwarding header is spelled in the HTTP spec, if one came."""
        if self.forwarded is None:
            return None
        name = self.forwarded
        return FORWARDING[name.replace(b"_", b"-") if UNDERSCORE in name else name]


def _without_named(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The header lines sent up when a Connection header names headers (not hop-by-hop ones
    already): those are not sent either. The rare case, so a second pass."""
    named: set[bytes] = set()
    for name, value in headers:
        if _kind_of(name) == RARE and name.replace(b"_", b"-") == b"connection":
            named.update(token.strip().lower().replace(b"_", b"-") for token in value.split(b",") if token.strip())
    named -= DROP_UP
    up: list[bytes] = []
    for name, value in headers:
        key = name.replace(b"_", b"-") if UNDERSCORE in name else name
        if _kind_of(name) in (KEEP, WATCH_KEEP) and key not in named:
            up += (name, b": ", value, b"\r\n")
    return b"".join(up)
