"""Which devices an engine runs on: pure decisions from a snapshot of the devices' memory.

A host has one or more devices (a pooled host, a DGX Spark's unified memory or a declared
capacity, is one). A deployment spans ``count`` of them (its ``gpus``) and holds ``gib / count``
on each; a pinned one may use only its pins. Everything here is a function of plain numbers (no
I/O, no clock), shared by the deployer's fit check and the controller's make-room, so both place a
model the same way; tests drive every rule with hand-built rooms.

* **Fit** (``fitting``): among the device sets it may use where every device has room, the best
  fit: the one left with the least free memory, so a large model keeps room elsewhere (Ollama's
  and GPUStack's rule); ties go to the lowest indices.
* **Never fits** (``ever_fits``): no device set it may use could hold it even with every model
  that comes and goes stopped (its share is larger than a device's capacity): ``does_not_fit``.
* **Make room** (``making_room``): for each device set, the idle holders on those devices, least
  recently used first, until every device's shortfall is covered; the set with the fewest
  victims wins, then the one whose victims were used least recently. Victims come only from the
  devices the model will use: a model waiting for device 1 never stops one on device 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

EPS = 1e-9  # memory sums are floats: 0.1 + 0.2 must cover 0.3


@dataclass(frozen=True)
class Room:
    """One device as a decision sees it, in GiB."""

    index: int
    free_gib: float  # free now (with the deployment being placed left out)
    capacity_gib: float  # what on-demand models can ever get there: usable minus the fixed deployments' share


@dataclass(frozen=True)
class Need:
    """What a deployment asks of the devices."""

    gib: float  # its memory_gib, in all
    count: int = 1  # how many devices it spans (gpus)
    pins: tuple[int, ...] | None = None  # the only devices it may use (gpu_ids)

    @property
    def per_device(self) -> float:
        return self.gib / self.count


@dataclass(frozen=True)
class Holder:
    """A deployment make-room may stop, and what stopping it frees on each device."""

    id: str
    idle_since: float
    frees: Mapping[int, float] = field(default_factory=dict)


def choices(rooms: Sequence[Room], need: Need) -> list[tuple[int, ...]]:
    """The device sets ``need`` may use: its pins when it has them (all present on the host),
    else every set of ``count`` devices, lowest indices first."""
    present = [room.index for room in rooms]
    if need.pins is not None:
        pins = tuple(sorted(need.pins))
        return [pins] if len(pins) == need.count and all(pin in present for pin in pins) else []
    if need.count > len(present):
        return []
    return list(combinations(sorted(present), need.count))


def fitting(rooms: Sequence[Room], need: Need, reserved: Mapping[int, float] | None = None) -> tuple[int, ...] | None:
    """The devices ``need`` fits on without stopping anything (best fit), or None. ``reserved``:
    memory on each device that is free but kept for someone else (the memory queue's head)."""
    by_index = {room.index: room for room in rooms}
    held = reserved or {}
    best: tuple[float, tuple[int, ...]] | None = None
    for devices in choices(rooms, need):
        left = [by_index[d].free_gib - held.get(d, 0.0) - need.per_device for d in devices]
        if min(left) < -EPS:
            continue
        rank = (sum(left), devices)
        if best is None or rank < best:
            best = rank
    return None if best is None else best[1]


def ever_fits(rooms: Sequence[Room], need: Need) -> bool:
    """Whether some device set ``need`` may use could hold it once every model that comes and
    goes was stopped."""
    by_index = {room.index: room for room in rooms}
    return any(
        all(need.per_device <= by_index[d].capacity_gib + EPS for d in devices) for devices in choices(rooms, need)
    )


def largest_share(rooms: Sequence[Room], need: Need) -> float:
    """The most one device ``need`` may use could ever give it (for the does_not_fit message)."""
    allowed = {d for devices in choices(rooms, need) for d in devices}
    return max((room.capacity_gib for room in rooms if room.index in allowed), default=0.0)


def shortfall(rooms: Sequence[Room], need: Need, devices: Iterable[int]) -> dict[int, float]:
    """What is missing on each of ``devices`` for ``need`` (only the devices short of room)."""
    by_index = {room.index: room for room in rooms}
    short = {d: need.per_device - by_index[d].free_gib for d in devices}
    return {d: gib for d, gib in short.items() if gib > EPS}


def making_room(
    rooms: Sequence[Room], need: Need, holders: Iterable[Holder]
) -> tuple[tuple[int, ...], tuple[str, ...]] | None:
    """The device set and the victims (least recently used first) whose stops let ``need``
    start, with the fewest victims and then the least recently used ones; None when no set can
    be freed by stopping ``holders``."""
    ordered = sorted(holders, key=lambda h: (h.idle_since, h.id))
    best: tuple[tuple[int, tuple[float, ...], tuple[int, ...]], tuple[int, ...], tuple[str, ...]] | None = None
    for devices in choices(rooms, need):
        short = shortfall(rooms, need, devices)
        victims: list[Holder] = []
        for holder in ordered:
            if not short:
                break
            helps = [d for d in short if holder.frees.get(d, 0.0) > EPS]
            if not helps:
                continue
            victims.append(holder)
            for d in helps:
                short[d] -= holder.frees[d]
                if short[d] <= EPS:
                    del short[d]
        if short:
            continue
        rank = (len(victims), tuple(v.idle_since for v in victims), devices)
        if best is None or rank < best[0]:
            best = (rank, devices, tuple(v.id for v in victims))
    return None if best is None else (best[1], best[2])


def spread(gib: float, devices: Sequence[int]) -> dict[int, float]:
    """What a deployment of ``gib`` in all holds on each of its ``devices``."""
    if not devices:
        return {}
    share = gib / len(devices)
    return {d: share for d in devices}
