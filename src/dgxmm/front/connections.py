"""The connection budget: how many client connections are open, and which one gives way.

Every connection is in one phase: ``reading`` a request head (also a new connection that has not
sent a byte yet), ``busy`` with a request (from its complete head to the end of its answer),
``idle`` between keep-alive requests, or ``closing`` after a refusal. Busy connections are never
touched. Two limits:

* **Connections.** When a new connection would pass ``max_connections``, one that is not busy
  is closed to make room: a closing one first, then the oldest idle one, then the oldest reader.
  When every connection is busy, the new one is refused. Connections that never finish their
  request (slowloris) thus cannot keep a real client out: its connection replaces theirs.
* **Head bytes.** Readers together may hold at most ``max_head_bytes`` of unfinished heads; past
  that the reader holding the most is dropped. A real client's head arrives whole and small, so
  it is the attacker's 60 KiB half-heads that go, and memory stays bounded however many
  connections read at once.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from typing import Protocol


class Phase(enum.Enum):
    READING = "reading"
    BUSY = "busy"
    IDLE = "idle"
    CLOSING = "closing"


class Connection(Protocol):
    def evict(self) -> None:
        """Close now: the budget needs this connection's place."""


class ConnectionBudget:
    def __init__(self, max_connections: int, max_head_bytes: int) -> None:
        self.max_connections = max_connections
        self.max_head_bytes = max_head_bytes
        self._phase: dict[Connection, Phase] = {}
        # Oldest first, per phase that may give way.
        self._pools: dict[Phase, OrderedDict[Connection, None]] = {
            phase: OrderedDict() for phase in (Phase.CLOSING, Phase.IDLE, Phase.READING)
        }
        self._head: dict[Connection, int] = {}
        self.head_bytes = 0
        self.evicted = 0
        self.refused = 0
        self.gateway_requests = 0  # kept by the application (OndemandFront): its share's count

    @property
    def open(self) -> int:
        return len(self._phase)

    def stats(self) -> dict[str, int]:
        """What ``GET /api/host`` shows under ``server``."""
        busy = self.open - sum(len(pool) for pool in self._pools.values())
        return {"connections": self.open, "busy": busy, "idle": len(self._pools[Phase.IDLE]),
                "reading": len(self._pools[Phase.READING]), "closing": len(self._pools[Phase.CLOSING]),
                "head_bytes": self.head_bytes, "gateway_requests": self.gateway_requests,
                "evicted": self.evicted, "refused": self.refused}  # fmt: skip

    def admit(self, conn: Connection) -> bool:
        """Count a new connection (as reading). False: it must be refused, every place is busy;
        it is then counted as closing until it is gone."""
        if self.open >= self.max_connections and not self._make_room():
            self.refused += 1
            self.set(conn, Phase.CLOSING)
            return False
        self.set(conn, Phase.READING)
        return True

    def set(self, conn: Connection, phase: Phase) -> None:
        if self._phase.get(conn) is phase:
            return
        self._drop(conn)
        self._phase[conn] = phase
        if phase in self._pools:
            self._pools[phase][conn] = None

    def reading(self, conn: Connection, head_bytes: int) -> None:
        """A reader now holds ``head_bytes`` of an unfinished head (0 once it is complete)."""
        self.head_bytes += head_bytes - self._head.pop(conn, 0)
        if head_bytes:
            self._head[conn] = head_bytes
        while self.head_bytes > self.max_head_bytes and self._head:
            self._evict(max(self._head, key=self._head.__getitem__))

    def leave(self, conn: Connection) -> None:
        """The connection is gone (also after an eviction: then it was forgotten already)."""
        self._drop(conn)

    def _drop(self, conn: Connection) -> None:
        self._phase.pop(conn, None)
        for pool in self._pools.values():
            pool.pop(conn, None)
        self.head_bytes -= self._head.pop(conn, 0)

    def _make_room(self) -> bool:
        for pool in self._pools.values():
            if pool:
                self._evict(next(iter(pool)))
                return True
        return False

    def _evict(self, conn: Connection) -> None:
        self._drop(conn)
        self.evicted += 1
        conn.evict()
