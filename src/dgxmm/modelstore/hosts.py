"""Where the hub may send dgxmm: its own origin and the hosts its storage answers from.

A file's bytes come from a redirect (the Hub answers ``resolve`` with a 302 to its storage or
CDN), and huggingface_hub's client follows every redirect it is given. A hostile or compromised
hub could so send dgxmm, with its address and its network's reach, to any URL: dgxmm's own admin
API, another service on the host or the network. dgxmm's hook on the client's requests (httpx
calls it for each request of a redirect chain, before sending it) refuses every URL that is not
the hub's origin (scheme, host and port of ``[models] hub_url``) or a host of ``[models]
redirect_hosts``, so such a request is never made and the pull fails saying where it was sent.

The allowance is that of the ``HubSource`` call running on the thread (``allowing``): requests
of huggingface_hub that are no call of dgxmm's are not its to judge.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import httpx2

DEFAULT_PORTS = {"http": 80, "https": 443}


class Elsewhere(Exception):
    """Raised by the request hook for a URL the hub may not send dgxmm to: not an error
    huggingface_hub retries, so the transfer ends without the request. ``where`` is the URL's
    origin only (a signed storage URL's query is a credential)."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def origin(url: httpx2.URL) -> tuple[str, str, int | None]:
    return url.scheme, url.host.lower(), url.port or DEFAULT_PORTS.get(url.scheme)


@dataclass(frozen=True)
class AllowedHosts:
    """The hub's origin and the ``redirect_hosts`` patterns: ``HOST`` (at the scheme's default
    port), ``HOST:PORT``, or ``*.DOMAIN`` (any host under ``DOMAIN``, at its default port)."""

    hub: tuple[str, str, int | None]
    patterns: tuple[str, ...]

    @classmethod
    def of(cls, hub_url: str, redirect_hosts: Sequence[str]) -> AllowedHosts:
        return cls(origin(httpx2.URL(hub_url)), tuple(p.strip().lower().rstrip(".") for p in redirect_hosts))

    def allows(self, url: httpx2.URL) -> bool:
        scheme, host, port = origin(url)
        if (scheme, host, port) == self.hub:
            return True
        default = port == DEFAULT_PORTS.get(scheme)
        for pattern in self.patterns:
            if pattern.startswith("*."):
                if default and host.endswith(pattern[1:]):
                    return True
            elif pattern == f"{host}:{port}" or (default and pattern == host):
                return True
        return False


_current = threading.local()  # the allowance of the HubSource call running on this thread


@contextmanager
def allowing(hosts: AllowedHosts) -> Iterator[None]:
    """The hub's client, while the block runs on this thread, goes only where ``hosts`` allows."""
    _current.hosts = hosts
    try:
        yield
    finally:
        _current.hosts = None


def on_request(request: httpx2.Request) -> None:
    """Every request the hub's client sends (hook), the redirects it follows among them."""
    hosts: AllowedHosts | None = getattr(_current, "hosts", None)
    if hosts is not None and not hosts.allows(request.url):
        scheme, host, port = origin(request.url)
        raise Elsewhere(f"{scheme}://{host}:{port}")
