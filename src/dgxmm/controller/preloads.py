"""Which preloaded deployments start when dgxmm starts or a preload is asked (``preload = true``):
a pure decision, like those of ``decide``, over the records and the free room; a preload never
makes room."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from dgxmm.deploy import placement
from dgxmm.deploy.placement import Need, Room
from dgxmm.records.deployment import Deployment, Role, State


@dataclass(frozen=True)
class Preload:
    """Which preloaded deployments start now, and which wait for their first request because they
    do not fit in what is free (a preload never makes room)."""

    start: tuple[str, ...]
    skipped: tuple[tuple[str, float], ...]  # (id, GiB it needs) of the ones that do not fit


def preloads(deps: Iterable[Deployment], rooms: Sequence[Room], need_of: Callable[[Deployment], Need]) -> Preload:
    """The stopped on-demand models marked ``preload``, oldest first, each started if it fits in
    what is still free (on some devices it may use) after the ones before it."""
    start: list[str] = []
    skipped: list[tuple[str, float]] = []
    left = {room.index: room for room in rooms}
    for dep in deps:
        if not dep.preload or not dep.is_on_demand or dep.role is not Role.MODEL or dep.state is not State.STOPPED:
            continue
        need = need_of(dep)
        placed = placement.fitting(tuple(left.values()), need)
        if placed is not None:
            start.append(dep.id)
            for index in placed:
                room = left[index]
                left[index] = Room(index, room.free_gib - need.per_device, room.capacity_gib)
        else:
            skipped.append((dep.id, dep.memory_gib))
    return Preload(tuple(start), tuple(skipped))
