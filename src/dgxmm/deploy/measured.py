"""What each running engine really holds, measured, beside the ``memory_gib`` its deployment
declares: the one owner of those readings.

The metrics sampler records a reading of every engine that holds memory on its schedule
(``procmemory.py``: its processes' PSS or its container's cgroup memory, plus its GPU memory where NVML
reports it per process). The budget counts a running deployment at the larger of declared and
measured, so an engine that takes more than declared is not over-committed beside; the views and
the scrape show both; and the highest reading of an engine's run is kept in the store per
deployment and configuration, from which a ``memory_gib`` is suggested.

A reading more than 10 % over the declaration once the engine is ready (a loading engine is still
growing) raises one warning per start (an event and an audit row, through ``warn``), saying both numbers and the ``memory_gib`` to declare. Readings
are dropped when the engine stops (nothing is measured then), and a new start begins a new peak.

On a host with several GPUs a reading also says on which devices NVML shows the engine's
processes: the budget counts it there (``seen_on``), and an engine that runs on other devices than
it was placed on (a ``CUDA_VISIBLE_DEVICES`` in its own ``env``) gets one warning per start.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dgxmm.logs import fields
from dgxmm.records.changes import Change
from dgxmm.records.deployment import Deployment, State

log = logging.getLogger(__name__)

GIB = 1024**3
OVER = 1.10  # a reading this far over the declaration is worth a warning
MARGIN = 1.10  # a suggestion is the peak plus this much...
STEP_GIB = 0.1  # ...rounded up to this


class Peaks(Protocol):
    """Where peaks are kept across runs (the store)."""

    def memory_peaks(self) -> dict[tuple[str, str], int]: ...

    def put_memory_peak(self, deployment_id: str, config: str, peak_bytes: int) -> None: ...


@dataclass
class Reading:
    bytes: int  # the latest
    peak: int  # the highest since the engine started
    warned: bool = False  # this run's warning was given
    devices: tuple[int, ...] = ()  # the GPUs NVML shows its processes on (none: none measured)
    misplaced: bool = False  # this run's warning that it runs elsewhere than placed was given
    asleep: bool = False  # the latest was taken while the engine was asleep


def over_declared(dep: Deployment, gib: float) -> str:
    """The warning's text: both numbers, and the ``memory_gib`` to declare."""
    return (
        f"Measured at {gib:.2f} GiB, more than the {dep.memory_gib:g} GiB it declares: other models may be "
        f"started beside it that do not fit; set memory_gib to {suggestion(int(gib * GIB)):g}"
    )


def config_key(dep: Deployment) -> str:
    """A configuration's name in the store: what a start depends on, hashed."""
    return hashlib.sha256(repr(dep.config_fingerprint()).encode()).hexdigest()[:16]


def suggestion(peak_bytes: int) -> float:
    """The ``memory_gib`` to declare for a measured peak: with a margin, rounded up."""
    return round(math.ceil(peak_bytes * MARGIN / GIB / STEP_GIB) * STEP_GIB, 1)


class MeasuredMemory:
    def __init__(
        self,
        peaks: Peaks,
        warn: Callable[[Deployment, float], None] | None = None,
        on_moved: Callable[[str], None] | None = None,
    ) -> None:
        self._peaks = peaks
        self._stored = peaks.memory_peaks()
        self._warn = warn
        self._readings: dict[str, Reading] = {}
        # Told of a deployment whose reading moved by a tenth or more (or its first): its memory
        # fields go out again (the app's publisher sends a memory event).
        self._on_moved = on_moved

    def record(self, dep: Deployment, measured_bytes: int, devices: tuple[int, ...] = ()) -> None:
        """A reading of ``dep``'s engine (the sampler's): kept, its peak stored when it grew,
        and the run's warning given when it is the first reading past the declaration;
        ``devices``: the GPUs its processes use memory on."""
        if not dep.holds_memory:
            return  # stopped meanwhile: nothing runs to be measured
        reading = self._readings.get(dep.id)
        if reading is None:
            reading = self._readings[dep.id] = Reading(measured_bytes, measured_bytes)
            moved = True
        else:
            moved = abs(measured_bytes - reading.bytes) >= max(reading.bytes / 10, 1)
        self._where(dep, reading, devices)
        reading.bytes, reading.peak = measured_bytes, max(reading.peak, measured_bytes)
        reading.asleep = dep.state is State.ASLEEP
        if moved and self._on_moved is not None:
            self._on_moved(dep.id)
        key = (dep.id, config_key(dep))
        if reading.peak > self._stored.get(key, 0):
            self._stored[key] = reading.peak
            self._peaks.put_memory_peak(dep.id, key[1], reading.peak)
        if not reading.warned and dep.state is State.READY and measured_bytes > dep.memory_gib * GIB * OVER:
            reading.warned = True
            if self._warn is not None:
                self._warn(dep, measured_bytes / GIB)

    def gib(self, deployment_id: str) -> float | None:
        """The latest reading, while the engine runs; None before the first one."""
        reading = self._readings.get(deployment_id)
        return None if reading is None else reading.bytes / GIB

    def peak_gib(self, deployment_id: str) -> float | None:
        reading = self._readings.get(deployment_id)
        return None if reading is None else reading.peak / GIB

    def suggested_gib(self, dep: Deployment) -> float | None:
        """What to declare for ``dep`` as it is configured now, from its highest measured run."""
        peak = self._stored.get((dep.id, config_key(dep)))
        return None if peak is None else suggestion(peak)

    def _where(self, dep: Deployment, reading: Reading, devices: tuple[int, ...]) -> None:
        """Where its processes run, and the run's warning when that is not where it was placed."""
        reading.devices = devices
        placed = dep.placed_on
        if devices and placed is not None and set(devices) != set(placed) and not reading.misplaced:
            reading.misplaced = True
            log.warning(
                "%s was placed on device %s, but NVML shows its engine on device %s (a CUDA_VISIBLE_DEVICES "
                "of its own env?): it is counted where it runs",
                dep.name,
                ", ".join(map(str, placed)),
                ", ".join(map(str, devices)),
                extra=fields(dep.id, dep.served_name),
            )

    def seen_on(self, dep: Deployment) -> tuple[int, ...]:
        """The devices NVML showed ``dep``'s engine on at its latest reading (none: unknown)."""
        reading = self._readings.get(dep.id)
        return () if reading is None else reading.devices

    def held_gib(self, dep: Deployment) -> float:
        """What ``dep`` holds for the budget: the larger of declared and measured."""
        measured = self.gib(dep.id)
        return dep.memory_gib if measured is None else max(dep.memory_gib, measured)

    def asleep_gib(self, dep: Deployment) -> float | None:
        """What an asleep engine holds, from a reading taken while it was asleep; None before one
        (the budget estimates it from the sleep level then)."""
        reading = self._readings.get(dep.id)
        if reading is None or not reading.asleep or dep.state is not State.ASLEEP:
            return None
        return reading.bytes / GIB

    def on_change(self, change: Change) -> None:
        """Deployer listener: a start begins a new run; an engine that no longer holds memory
        is not measured any more; a removed deployment's peaks go with it."""
        dep = change.deployment
        if change.kind == "removed":
            self._readings.pop(dep.id, None)
            self._stored = {key: peak for key, peak in self._stored.items() if key[0] != dep.id}
        elif change.kind == "state" and (dep.state is State.STARTING or not dep.holds_memory):
            if change.old_state is not State.ASLEEP or dep.state is not State.STARTING:  # a wake goes on
                self._readings.pop(dep.id, None)
