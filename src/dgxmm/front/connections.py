"""The connection budget: how many client connections are open, and which one gives way.

A connection is *busy* from its request's complete head to the end of its answer, *spare* when
it has no request in flight (a new connection, one reading a head, one idle between keep-alive
requests), or *closing* after a refusal. Busy connections are never touched. Two limits:

* **Connections.** When a new connection would pass ``max_connections``, one that is not busy
  is closed to make room: a closing one first, then the spare one that has been spare longest.
  When every connection is busy, the new one is refused. Connections that never finish their
  request (slowloris) thus cannot keep a real client out: its connection replaces theirs.
* **Head bytes.** Unfinished heads that span more than one read together may hold at most
  ``max_head_bytes``; past that the connection holding the most is dropped. A real client's
  head arrives whole and small, so it is the attacker's 60 KiB half-heads that go, and memory
  stays bounded however many connections read at once.

Each request costs two dictionary moves (spare to busy, busy to spare): the budget sits on the
hot path of every request.
"""

from __future__ import annotations

from typing import Protocol


class Connection(Protocol):
    in_head: bool  # reading a request head (or nothing sent yet)

    def evict(self) -> None:
        """Close now: the budget needs this connection's place."""


class ConnectionBudget:
    def __init__(self, max_connections: int, max_head_bytes: int) -> None:
        self.max_connections = max_connections
        self.max_head_bytes = max_head_bytes
        self._busy: set[Connection] = set()
        self._spare: dict[Connection, None] = {}  # insertion order: spare the longest first
        self._closing: dict[Connection, None] = {}
        self._head: dict[Connection, int] = {}  # unfinished heads that span reads: their bytes
        self.head_bytes = 0
        self.evicted = 0
        self.refused = 0
        self.gateway_requests = 0  # kept by the application (OndemandFront): its share's count

    @property
    def open(self) -> int:
        return len(self._busy) + len(self._spare) + len(self._closing)

    def admit(self, conn: Connection) -> bool:
        """Count a new connection (as spare). False: it must be refused, every place is busy;
        it is then counted as closing until it is gone."""
        if self.open >= self.max_connections and not self._make_room():
            self.refused += 1
            self._closing[conn] = None
            return False
        self._spare[conn] = None
        return True

    def busy(self, conn: Connection) -> None:
        if conn in self._spare:
            del self._spare[conn]
            self._busy.add(conn)

    def spare(self, conn: Connection) -> None:
        if conn in self._busy:
            self._busy.discard(conn)
            self._spare[conn] = None

    def closing(self, conn: Connection) -> None:
        self.leave(conn)
        self._closing[conn] = None

    def reading(self, conn: Connection, head_bytes: int) -> None:
        """``conn`` holds ``head_bytes`` of an unfinished head (0 once it is complete)."""
        self.head_bytes += head_bytes - self._head.pop(conn, 0)
        if head_bytes:
            self._head[conn] = head_bytes
        while self.head_bytes > self.max_head_bytes and self._head:
            self._evict(max(self._head, key=self._head.__getitem__))

    def leave(self, conn: Connection) -> None:
        """The connection is gone (also after an eviction: then it was forgotten already)."""
        self._busy.discard(conn)
        self._spare.pop(conn, None)
        self._closing.pop(conn, None)
        self.head_bytes -= self._head.pop(conn, 0)

    def stats(self) -> dict[str, int]:
        """What ``GET /api/host`` shows under ``server``."""
        reading = sum(1 for conn in self._spare if conn.in_head)
        return {
            "connections": self.open,
            "busy": len(self._busy),
            "idle": len(self._spare) - reading,
            "reading": reading,
            "closing": len(self._closing),
            "head_bytes": self.head_bytes,
            "gateway_requests": self.gateway_requests,
            "evicted": self.evicted,
            "refused": self.refused,
        }

    def _make_room(self) -> bool:
        for pool in (self._closing, self._spare):
            if pool:
                self._evict(next(iter(pool)))
                return True
        return False

    def _evict(self, conn: Connection) -> None:
        self.leave(conn)
        self.evicted += 1
        conn.evict()
