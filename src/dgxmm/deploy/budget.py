"""The memory budget: how much a deployment may use, and the fit check every start passes.

Accounting is by ``memory_gib``: every deployment in a state that holds memory counts in full (or,
with the engines measured, ``measured.py``, for the larger of declared and measured), and so does
one whose engine is still being ended after a failure (``lingering``): its record says failed at
once, but its memory is free only once its engine is gone. A measured source (``meminfo`` for unified memory as on a DGX Spark, ``nvml`` for discrete
GPUs) also caps what is free by what the machine reports, so memory an engine has not yet given
back after a stop reads as used until it really is free.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from dgxmm.records.deployment import Deployment
from dgxmm.settings import MemorySettings

log = logging.getLogger(__name__)

GIB = 1024**3


class InsufficientMemory(Exception):
    """A start that does not fit; ``capacity`` is usable memory minus the fixed deployments.

    The message names the deployment by name (a refused create has an id nobody will ever see)
    and gives the usable memory the UI shows, with the part the fixed deployments hold."""

    def __init__(
        self, deployment_id: str, need: float, free: float, capacity: float, *, name: str, usable: float
    ) -> None:
        fixed = usable - capacity
        held = f", {fixed:.1f} GiB of it held by always-on and system deployments" if fixed > 0.05 else ""
        super().__init__(f"{name} needs {need:g} GiB, {free:.1f} GiB free of {usable:.1f} GiB usable{held}")
        self.deployment_id = deployment_id
        self.need, self.free, self.capacity = need, free, capacity


@dataclass(frozen=True)
class Reading:
    """What a measured source reports, in GiB."""

    total: float
    available: float


@dataclass(frozen=True)
class Snapshot:
    usable: float  # what deployments may use in all
    held: float  # declared memory of every deployment holding memory
    fixed: float  # of which always-on, system and decider deployments
    measured_free: float | None  # the source's available memory, if it measures

    @property
    def capacity(self) -> float:
        """What on-demand models can ever get: usable minus what the fixed deployments hold."""
        return self.usable - self.fixed

    @property
    def free(self) -> float:
        by_declaration = self.usable - self.held
        if self.measured_free is None:
            return by_declaration
        return min(by_declaration, self.measured_free)


def read_meminfo(path: Path = Path("/proc/meminfo")) -> Reading:
    fields = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0]) * 1024
    return Reading(total=fields["MemTotal"] / GIB, available=fields["MemAvailable"] / GIB)


def read_nvml() -> Reading:
    import pynvml  # only on hosts configured for it; nvidia-ml-py provides it

    pynvml.nvmlInit()
    try:
        total = available = 0.0
        for index in range(pynvml.nvmlDeviceGetCount()):
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            total += info.total / GIB
            available += info.free / GIB
        return Reading(total=total, available=available)
    finally:
        pynvml.nvmlShutdown()


class MemoryBudget:
    def __init__(
        self, settings: MemorySettings, reader: Callable[[], Reading] | None = None,
        held: Callable[[Deployment], float] | None = None,
    ) -> None:  # fmt: skip
        self._settings = settings
        # What a deployment holding memory counts for: its declaration, or (measured.py) the
        # larger of declared and measured.
        self.held_of: Callable[[Deployment], float] = held or (lambda dep: dep.memory_gib)
        if reader is None and settings.source == "meminfo":
            reader = read_meminfo
        elif reader is None and settings.source == "nvml":
            reader = read_nvml
        self._reader = reader
        self._device_total: float | None = None

    def device_total(self) -> float:
        """The device's whole memory in GiB, as an engine sizing itself counts it: the configured
        ``device_total_gib``, else the measured total (read once: it does not change), else the
        declared capacity. No reserve is taken off: vLLM's share is of the whole device."""
        if self._settings.device_total_gib is not None:
            return self._settings.device_total_gib
        if self._reader is None:
            assert self._settings.capacity_gib is not None
            return self._settings.capacity_gib
        if self._device_total is None:
            self._device_total = self._reader().total
        return self._device_total

    def check_source(self) -> None:
        """Fail at start-up, not at the first start, when the configured source cannot be read."""
        if self._reader is not None:
            self._reader()

    def snapshot(
        self, deployments: Iterable[Deployment], exclude: str | None = None, lingering: Collection[str] = ()
    ) -> Snapshot:
        """The budget now; ``exclude`` leaves one deployment out (the one being fitted);
        ``lingering``: deployments whose engine still holds memory whatever their state says."""
        held = fixed = 0.0
        for dep in deployments:
            if dep.id == exclude or not (dep.holds_memory or dep.id in lingering):
                continue
            gib = self.held_of(dep)
            held += gib
            if dep.is_fixed:
                fixed += gib
        measured = None
        if self._reader is not None:
            reading = self._reader()
            usable = reading.total - self._settings.reserve_gib
            if self._settings.capacity_gib is not None:
                usable = min(usable, self._settings.capacity_gib)
            measured = reading.available - self._settings.reserve_gib
        else:
            assert self._settings.capacity_gib is not None
            usable = self._settings.capacity_gib - self._settings.reserve_gib
        return Snapshot(usable=usable, held=held, fixed=fixed, measured_free=measured)

    def fit(self, dep: Deployment, deployments: Iterable[Deployment], lingering: Collection[str] = ()) -> Snapshot:
        """The fit check: raise ``InsufficientMemory`` unless ``dep`` fits in what is free."""
        snap = self.snapshot(deployments, exclude=dep.id, lingering=lingering)
        if dep.memory_gib > snap.free + 1e-9:
            raise InsufficientMemory(dep.id, dep.memory_gib, max(snap.free, 0.0), snap.capacity,
                                     name=dep.name, usable=snap.usable)  # fmt: skip
        return snap
