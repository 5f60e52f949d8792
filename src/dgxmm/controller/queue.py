"""The memory queue: one entry per deployment waiting for memory.

Its order (``ids``, head first) is ``priority.queue_order``: an entry holding a reservation
first, then by the priority of each model's best waiter, aged from when its entry joined, ties in
order of joining (so equal priorities keep first come, first served).

Only the head may make room (stop idle models). The head's victims are listed in its entry; the
memory they freed is reserved for the head until it starts or gives up (the entry leaves), so a
later, smaller entry cannot take it. Plain data: the controller's state owns the one instance
and its readers see it as a ``QueueView``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from dgxmm.controller import priority


class QueueView(Protocol):
    """What a reader sees of the memory queue (``ControllerState.queue``): no writes."""

    def __contains__(self, deployment_id: str) -> bool: ...

    def __len__(self) -> int: ...

    def ids(self) -> list[str]: ...

    def is_head(self, deployment_id: str) -> bool: ...

    def joined_at(self, deployment_id: str) -> float | None: ...

    def victims_of(self, deployment_id: str) -> tuple[str, ...]: ...

    def victims_of_head(self, deployment_id: str) -> dict[str, float]: ...


@dataclass
class QueueEntry:
    deployment_id: str
    joined_at: float  # the controller's clock: how long the entry has waited (the drain's rule)
    victims: dict[str, float] = field(default_factory=dict)  # stopped for this entry: id -> GiB


class MemoryQueue:
    def __init__(
        self,
        best: Callable[[str], int] = lambda deployment_id: 0,
        clock: Callable[[], float] = lambda: 0.0,
        aging_s: float = 0.0,
    ) -> None:
        self._entries: dict[str, QueueEntry] = {}  # insertion order is arrival order
        self._best = best  # the highest priority among a deployment's waiters
        self._clock = clock
        self._aging_s = aging_s

    def __contains__(self, deployment_id: str) -> bool:
        return deployment_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> list[str]:
        """The entries' deployments in the order they start, head first."""
        return [entry.deployment_id for entry in self._ordered()]

    def _ordered(self) -> list[QueueEntry]:
        entries = list(self._entries.values())
        if len(entries) < 2:
            return entries
        ranks = [(self._best(e.deployment_id), e.joined_at, bool(e.victims)) for e in entries]
        return [entries[i] for i in priority.queue_order(ranks, self._clock(), self._aging_s)]

    def head(self) -> QueueEntry | None:
        return next(iter(self._ordered()), None)

    def is_head(self, deployment_id: str) -> bool:
        head = self.head()
        return head is not None and head.deployment_id == deployment_id

    def join(self, deployment_id: str, now: float) -> bool:
        """Add at the tail unless already queued; True if it was added."""
        if deployment_id in self._entries:
            return False
        self._entries[deployment_id] = QueueEntry(deployment_id, now)
        return True

    def joined_at(self, deployment_id: str) -> float | None:
        entry = self._entries.get(deployment_id)
        return None if entry is None else entry.joined_at

    def leave(self, deployment_id: str) -> bool:
        """Remove the entry (and with it its reservation); True if it was queued."""
        return self._entries.pop(deployment_id, None) is not None

    def reserve(self, deployment_id: str, victims: dict[str, float]) -> None:
        """Record victims stopped for ``deployment_id``: what they free is reserved for it."""
        entry = self._entries.get(deployment_id)
        if entry is not None:
            entry.victims.update(victims)

    def unreserve(self, deployment_id: str, victim: str) -> None:
        """A victim whose stop the precheck refused frees nothing for the entry."""
        entry = self._entries.get(deployment_id)
        if entry is not None:
            entry.victims.pop(victim, None)

    def victims_of(self, deployment_id: str) -> tuple[str, ...]:
        """The deployments stopped for ``deployment_id``'s entry (none when it is not queued)."""
        entry = self._entries.get(deployment_id)
        return () if entry is None else tuple(entry.victims)

    def victims_of_head(self, deployment_id: str) -> dict[str, float]:
        """The head's victims, unless ``deployment_id`` is the head (its own are not a limit)."""
        head = self.head()
        if head is None or head.deployment_id == deployment_id:
            return {}
        return dict(head.victims)
