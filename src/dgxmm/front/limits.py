"""The front door's numbers, fixed here (and in docs/server.md) or derived from the fd limit.

A request head (request line and headers) is at most ``MAX_HEADER_BYTES`` and ``MAX_HEADERS``
fields; that is what Apache and Node allow by default, and 20 times what LiteLLM or a browser
send. Every open client connection costs one file descriptor, and a gateway request one more
towards its engine, so at most half of the descriptors left after ``FD_RESERVE`` are handed to
clients, and never more than ``CONNECTION_CEILING`` (about 40 KiB of memory each while
streaming). Unfinished heads of all connections together hold at most ``MAX_HEAD_BYTES``. Of
the connections, ``ADMIN_RESERVE`` are kept from gateway traffic so the admin API and UI stay
reachable when the gateway is full.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from dgxmm.settings import ServerSettings

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 * 1024
MAX_HEADERS = 100
# Idle keep-alive connections are closed after this: longer than the clients' own idle expiry
# (httpx and so the OpenAI and Anthropic SDKs 5 s, aiohttp 15 s, Node's undici 4 s), so a client
# drops an idle connection before dgxmm does. At uvicorn's 5 s a client reusing a connection
# idle for just under 5 s could send its request as dgxmm closed it, and see "server
# disconnected" (nginx waits 75 s too). An idle connection costs one descriptor; the budget
# closes the longest idle first when it needs the place.
KEEP_ALIVE_S = 75.0
LINGER_S = 2.0  # after a refusal, input is read and dropped this long so the client sees the answer
LINGER_BYTES = 1024 * 1024  # ... and no more than this much of it
FD_RESERVE = 128  # descriptors for the database, logs, engines, probes, the Docker socket
CONNECTION_CEILING = 4096
ADMIN_RESERVE = 64
MAX_HEAD_BYTES = 16 * 1024 * 1024  # unfinished heads of all connections together
FD_TARGET = 65536  # the soft fd limit dgxmm raises itself to, when the hard limit allows


@dataclass(frozen=True)
class FrontLimits:
    header_timeout_s: float
    max_connections: int
    admin_reserve: int
    max_head_bytes: int = MAX_HEAD_BYTES
    max_header_bytes: int = MAX_HEADER_BYTES
    max_headers: int = MAX_HEADERS
    keep_alive_s: float = KEEP_ALIVE_S
    linger_s: float = LINGER_S
    linger_bytes: int = LINGER_BYTES

    @property
    def gateway_share(self) -> int:
        """Gateway requests that may be in flight at once; past it the gateway answers 503."""
        return self.max_connections - self.admin_reserve


def open_files_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return FD_TARGET if soft == resource.RLIM_INFINITY else int(soft)


def raise_open_files_limit() -> int:
    """Raise the soft fd limit towards ``FD_TARGET`` (never past the hard limit); returns it.

    The usual soft limit of 1024 would leave about 450 client connections; raising the soft
    limit needs no privilege, and engines started by dgxmm inherit it (vLLM raises its own)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_TARGET if hard == resource.RLIM_INFINITY else min(FD_TARGET, int(hard))
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
    return open_files_limit()


def front_limits(server: ServerSettings, open_files: int | None = None) -> FrontLimits:
    """The limits for this process's fd limit (``open_files``, default: the current soft limit)."""
    files = open_files_limit() if open_files is None else open_files
    connections = max(16, min(CONNECTION_CEILING, (files - FD_RESERVE) // 2))
    return FrontLimits(
        header_timeout_s=server.header_timeout_s,
        max_connections=connections,
        admin_reserve=min(ADMIN_RESERVE, connections // 4),
    )
