"""The memory queue: one entry per deployment waiting for memory, in order of first arrival.

Only the head may make room (stop idle models). Memory freed for the head is reserved for it
until it starts or gives up, so a later, smaller entry cannot take it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Entry:
    deployment_id: str
    reserved_gib: float = 0.0


class MemoryQueue:
    def __init__(self) -> None:
        self._entries: dict[str, Entry] = {}  # insertion order is arrival order

    def __contains__(self, deployment_id: str) -> bool:
        return deployment_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> list[str]:
        return list(self._entries)

    def head(self) -> Entry | None:
        return next(iter(self._entries.values()), None)

    def is_head(self, deployment_id: str) -> bool:
        head = self.head()
        return head is not None and head.deployment_id == deployment_id

    def join(self, deployment_id: str) -> bool:
        """Add at the tail unless already queued; True if it was added."""
        if deployment_id in self._entries:
            return False
        self._entries[deployment_id] = Entry(deployment_id)
        return True

    def leave(self, deployment_id: str) -> bool:
        """Remove the entry (and with it any reservation); True if it was queued."""
        return self._entries.pop(deployment_id, None) is not None

    def reserve(self, deployment_id: str, gib: float) -> None:
        entry = self._entries.get(deployment_id)
        if entry is not None:
            entry.reserved_gib += gib

    def reserved_for_others(self, deployment_id: str) -> float:
        """What the head holds in reserve, unless ``deployment_id`` is the head."""
        head = self.head()
        if head is None or head.deployment_id == deployment_id:
            return 0.0
        return head.reserved_gib
