"""The memory budget: how much a deployment may use, and the fit check every start passes.

Accounting is per device (a pooled host, unified memory or a declared capacity, is one), by
``memory_gib`` spread over the devices a deployment holds memory on: every deployment in a state that holds memory counts in full (or,
with the engines measured, ``measured.py``, for the larger of declared and measured), and so does
one whose engine is still being ended after a failure (``lingering``): its record says failed at
once, but its memory is free only once its engine is gone. A measured source (``meminfo`` for unified memory as on a DGX Spark, ``nvml`` for discrete
GPUs) also caps what is free by what the machine reports, so memory an engine has not yet given
back after a stop reads as used until it really is free.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dgxmm.deploy import gpus, placement
from dgxmm.deploy.pagecache import PageCache
from dgxmm.deploy.placement import Need, Room
from dgxmm.deploy.sleeplevels import asleep_holds_gib
from dgxmm.records.deployment import Deployment, State
from dgxmm.settings import MemorySettings

log = logging.getLogger(__name__)

GIB = 1024**3


class InsufficientMemory(Exception):
    """A start that does not fit; ``capacity`` is usable memory minus the fixed deployments.

    The message names the deployment by name (a refused create has an id nobody will ever see)
    and gives the usable memory the UI shows, with the part the fixed deployments hold."""

    def __init__(
        self,
        deployment_id: str,
        need: float,
        free: float,
        capacity: float,
        *,
        name: str,
        usable: float,
        devices: int = 1,
        share: float | None = None,
    ) -> None:
        fixed = usable - capacity
        held = f", {fixed:.1f} GiB of it held by always-on and system deployments" if fixed > 0.05 else ""
        if devices > 1 and share is not None:
            text = (
                f"{name} needs {share:g} GiB on each of the devices it may use; the most free on one device is "
                f"{free:.1f} GiB ({usable:.1f} GiB usable on {devices} devices{held})"
            )
        else:
            text = f"{name} needs {need:g} GiB, {free:.1f} GiB free of {usable:.1f} GiB usable{held}"
        super().__init__(text)
        self.deployment_id = deployment_id
        self.need, self.free, self.capacity = need, free, capacity


@dataclass(frozen=True)
class Reading:
    """What a measured source reports of one device, in GiB (``available`` None: the source
    reads the device's size but not what is free on it)."""

    total: float
    available: float
    index: int = 0
    name: str = "memory"


@dataclass(frozen=True)
class Device:
    """One device of the host as the budget accounts it."""

    index: int
    name: str
    total_gib: float


@dataclass(frozen=True)
class Account:
    """One device's figures, in GiB."""

    index: int
    total: float  # its whole memory
    usable: float  # what deployments may use on it
    held: float  # what deployments holding memory hold there
    fixed: float  # of which always-on, system and decider deployments
    measured_free: float | None  # the source's available memory there, if it measures

    @property
    def capacity(self) -> float:
        return self.usable - self.fixed

    @property
    def free(self) -> float:
        by_declaration = self.usable - self.held
        return by_declaration if self.measured_free is None else min(by_declaration, self.measured_free)


@dataclass(frozen=True)
class Snapshot:
    """The budget now: the host's figures (each the sum over its devices) and each device's."""

    usable: float  # what deployments may use in all
    held: float  # declared memory of every deployment holding memory
    fixed: float  # of which always-on, system and decider deployments
    measured_free: float | None  # the source's available memory, if it measures
    devices: tuple[Account, ...] = ()  # none: one pooled device with the figures above

    @property
    def capacity(self) -> float:
        """What on-demand models can ever get: usable minus what the fixed deployments hold."""
        return self.usable - self.fixed

    @property
    def free(self) -> float:
        if self.devices:
            return sum(account.free for account in self.devices)
        by_declaration = self.usable - self.held
        if self.measured_free is None:
            return by_declaration
        return min(by_declaration, self.measured_free)

    def rooms(self) -> tuple[Room, ...]:
        """The devices as placement decisions see them."""
        if not self.devices:
            return (Room(0, self.free, self.capacity),)
        return tuple(Room(a.index, a.free, a.capacity) for a in self.devices)


def read_meminfo(path: Path = Path("/proc/meminfo")) -> Reading:
    fields = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) * 1024
    return Reading(total=fields["MemTotal"] / GIB, available=fields["MemAvailable"] / GIB)


_warned_unified: set[int] = set()


def read_nvml(meminfo: Callable[[], Reading] = read_meminfo) -> tuple[Reading, ...]:
    """Each NVML device: its index, name, total and free memory. A device that answers
    ``NOT_SUPPORTED`` for its memory (a GB10: its memory is the host's, unified) is sized from
    ``/proc/meminfo`` instead, said once in the log. A device that cannot be read at all (it fell
    off the bus) is left out: the budget counts it as gone."""
    import pynvml  # only on hosts configured for it; nvidia-ml-py provides it

    not_supported = getattr(pynvml, "NVML_ERROR_NOT_SUPPORTED", 3)
    pynvml.nvmlInit()
    try:
        found = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                name = pynvml.nvmlDeviceGetName(handle)
                name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
                try:
                    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
                except pynvml.NVMLError as exc:
                    if getattr(exc, "value", None) != not_supported:
                        raise
                    if index not in _warned_unified:
                        _warned_unified.add(index)
                        log.warning(
                            "NVML does not report the memory of device %d (%s): it is unified memory, "
                            "read from /proc/meminfo",
                            index,
                            name,
                        )
                    host = meminfo()
                    found.append(Reading(host.total, host.available, index, name))
                    continue
            except pynvml.NVMLError as exc:
                log.debug("NVML device %d cannot be read: %s", index, exc)
                continue
            found.append(Reading(info.total / GIB, info.free / GIB, index, name))
        return tuple(found)
    finally:
        pynvml.nvmlShutdown()


class MemoryBudget:
    """The host's devices and what deployments hold on each. A pooled host (a declared
    ``capacity_gib``, or ``meminfo``) is one device, and engines are launched as before, seeing
    every device; declared ``devices_gib`` and ``nvml`` give one account per device."""

    def __init__(
        self,
        settings: MemorySettings,
        reader: Callable[[], Reading | Sequence[Reading]] | None = None,
        held: Callable[[Deployment], float] | None = None,
        seen_on: Callable[[Deployment], tuple[int, ...]] | None = None,
        asleep: Callable[[Deployment], float | None] | None = None,
    ) -> None:
        self._settings = settings
        # What a deployment holding memory counts for: its declaration, or (measured.py) the
        # larger of declared and measured; asleep, what a reading taken asleep says, if any.
        self._held: Callable[[Deployment], float] = held or (lambda dep: dep.memory_gib)
        self._asleep: Callable[[Deployment], float | None] = asleep or (lambda dep: None)
        # Where a running engine's processes were measured on (measured.py), which wins over
        # where it was placed: an engine told other devices by its own env runs there.
        self._seen_on: Callable[[Deployment], tuple[int, ...]] = seen_on or (lambda dep: ())
        if reader is None and settings.source == "meminfo":
            reader = read_meminfo
        elif reader is None and settings.source == "nvml":
            reader = read_nvml
        self._reader = reader
        self.page_cache = PageCache(settings.page_cache, settings.source)  # released after a stop, or kept
        self._devices: tuple[Device, ...] | None = None
        self.lost: frozenset[int] = frozenset()  # devices the source no longer reports (fell off the bus)
        # Pooled: one device and engines see all devices (no CUDA_VISIBLE_DEVICES).
        self.pooled = settings.source == "meminfo" or (settings.source == "declared" and settings.devices_gib is None)

    def held_of(self, dep: Deployment) -> float:
        """What ``dep`` counts for while it holds memory. Asleep: what its sleep level leaves
        held (measured while asleep, else estimated: sleeplevels.py), so that sleeping makes
        room; its wake must find the rest free, as a start does."""
        if dep.state is State.ASLEEP:
            measured = self._asleep(dep)
            return measured if measured is not None else asleep_holds_gib(dep, self.pooled)
        return self._held(dep)

    def _read(self) -> tuple[Reading, ...]:
        assert self._reader is not None
        found = self._reader()
        return (found,) if isinstance(found, Reading) else tuple(found)

    def devices(self) -> tuple[Device, ...]:
        """The host's devices (read once: they do not change while dgxmm runs)."""
        if self._devices is None:
            declared = self._settings.devices_gib
            if declared is not None:
                self._devices = tuple(Device(i, f"device {i}", gib) for i, gib in enumerate(declared))
            elif self._reader is None:
                assert self._settings.capacity_gib is not None
                self._devices = (Device(0, "memory", self._settings.capacity_gib),)
            else:
                self._devices = tuple(Device(r.index, r.name, r.total) for r in self._read())
        return self._devices

    def device_total(self, index: int = 0) -> float:
        """A device's whole memory in GiB, as an engine sizing itself counts it: the configured
        ``device_total_gib``, else the device's size. No reserve is taken off: vLLM's share is of
        the whole device."""
        if self._settings.device_total_gib is not None:
            return self._settings.device_total_gib
        sizes = {device.index: device.total_gib for device in self.devices()}
        return sizes.get(index, sizes[min(sizes)])

    def check_source(self) -> None:
        """Fail at start-up, not at the first start, when the configured source cannot be read."""
        if self._reader is not None:
            self._read()
        self.devices()

    def settled(self, dep: Deployment) -> Deployment:
        """``dep`` with its devices checked against the host's (``gpus.settled``: 422 naming
        the field), ``gpus`` set from a vLLM deployment's own parallel flags."""
        return gpus.settled(dep, [device.index for device in self.devices()], self.pooled)

    def count_of(self, dep: Deployment) -> int:
        """How many devices ``dep`` spans here: one on a pooled host, else its ``gpus``."""
        return 1 if self.pooled else dep.device_count

    def need_of(self, dep: Deployment) -> Need:
        """What ``dep``'s start asks of the devices; an asleep one's wake, ``wake_margin_gib``
        more: memory taken back by a wake must be free with room to spare (a wake into the last
        of unified memory froze a DGX Spark: vLLM #50011)."""
        count = self.count_of(dep)
        pins = None if self.pooled or not dep.gpu_ids else tuple(dep.gpu_ids)
        margin = self._settings.wake_margin_gib if dep.state is State.ASLEEP else 0.0
        return Need(dep.memory_gib + margin, max(count, 1), pins)

    def devices_of(self, dep: Deployment) -> tuple[int, ...]:
        """Where ``dep`` holds memory while it does: device 0 of a pooled host; else where its
        engine was measured, else where it was placed, else its pins, else the first devices
        (where CUDA puts an engine told nothing)."""
        if self.pooled:
            return (0,)
        present = [device.index for device in self.devices()]
        seen = self._seen_on(dep) if dep.holds_memory else ()
        if seen and all(d in present for d in seen):
            return seen
        count = dep.device_count
        if count == 0:
            return ()
        for given in (dep.placed_on, dep.gpu_ids):
            if given and all(d in present for d in given):
                return tuple(given)
        return tuple(present[:count])

    def snapshot(
        self, deployments: Iterable[Deployment], exclude: str | None = None, lingering: Collection[str] = ()
    ) -> Snapshot:
        """The budget now; ``exclude`` leaves one deployment out (the one being fitted);
        ``lingering``: deployments whose engine still holds memory whatever their state says."""
        devices = self.devices()
        held = dict.fromkeys((d.index for d in devices), 0.0)
        fixed = dict(held)
        for dep in deployments:
            if dep.id == exclude or not (dep.holds_memory or dep.id in lingering):
                continue
            where = self.devices_of(dep)
            if not where:
                continue
            share = self.held_of(dep) / len(where)
            for index in where:
                held[index] += share
                if dep.is_fixed:
                    fixed[index] += share
        reserve = self._settings.reserve_gib
        readings = {r.index: r for r in self._read()} if self._reader is not None else {}
        if self._reader is not None:
            self.lost = frozenset(d.index for d in devices if d.index not in readings)
        accounts = []
        for device in devices:
            reading = readings.get(device.index)
            if device.index in self.lost:  # gone: nothing more is placed there
                accounts.append(
                    Account(device.index, device.total_gib, 0.0, held[device.index], fixed[device.index], 0.0)
                )
                continue
            if reading is not None:
                usable = reading.total - reserve
                if self._settings.capacity_gib is not None:
                    usable = min(usable, self._settings.capacity_gib)
                measured: float | None = reading.available - reserve
            else:
                usable, measured = device.total_gib - reserve, None
            total = reading.total if reading is not None else device.total_gib
            accounts.append(Account(device.index, total, usable, held[device.index], fixed[device.index], measured))
        frees = [a.measured_free for a in accounts]
        return Snapshot(
            usable=sum(a.usable for a in accounts),
            held=sum(a.held for a in accounts),
            fixed=sum(a.fixed for a in accounts),
            measured_free=None if any(f is None for f in frees) else sum(f for f in frees if f is not None),
            devices=tuple(accounts),
        )

    def fit(
        self,
        dep: Deployment,
        deployments: Iterable[Deployment],
        lingering: Collection[str] = (),
        devices: Sequence[int] | None = None,
    ) -> tuple[int, ...]:
        """The fit check: the devices ``dep`` starts on (``devices`` when the caller chose them,
        else the best fit); ``InsufficientMemory`` unless it fits in what is free there."""
        if not self.pooled and dep.device_count == 0:
            return ()  # an engine that uses no device: nothing to hold on one
        snap = self.snapshot(deployments, exclude=dep.id, lingering=lingering)
        rooms, need = snap.rooms(), self.need_of(dep)
        if devices is not None:
            chosen: tuple[int, ...] | None = tuple(devices)
            if chosen not in placement.choices(rooms, need) or placement.shortfall(rooms, need, chosen):
                chosen = None
        else:
            chosen = placement.fitting(rooms, need)
        if chosen is None:
            free = max((r.free_gib for r in rooms), default=0.0) if len(rooms) > 1 else snap.free
            raise InsufficientMemory(
                dep.id,
                dep.memory_gib,
                max(free, 0.0),
                snap.capacity,
                name=dep.name,
                usable=snap.usable,
                devices=len(rooms),
                share=need.per_device,
            )
        return chosen
