"""The metrics sampler: the latest (time, running, waiting) of every ready engine, and on the same
schedule what every running engine holds (``measured.py``).

The controller stops a model only when a sample younger than ``metrics_max_age_s`` shows nothing
running or waiting, so a sample is never invented: an engine whose page cannot be read keeps its
last sample, which ages until it no longer counts.

Each engine is read on its own: a page that is slow to come (a CPU engine busy generating can
take seconds to serve it) must neither be cut off by the sampling interval nor hold back the
samples of the other engines. So every round starts a read for each ready engine that has none
in flight, and a read may take up to ``timeout_s``. A sample is stamped with the time its read
was sent: the counts describe some moment between sending and receiving, and the earlier stamp
never makes a sample look younger than it is.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.procmemory import Usage, gpu_by_device
from dgxmm.records.deployment import Deployment, State

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    time: float  # time.monotonic() when the read was sent
    running: float
    waiting: float

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0

    def age(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.time


class SampledDeployments(Protocol):
    """The deployer, as the sampler reads it: the deployments whose engines it polls."""

    def all(self) -> list[Deployment]: ...

    def find(self, deployment_id: str) -> Deployment | None: ...


class Recorder(Protocol):
    def record(self, dep: Deployment, measured_bytes: int, devices: tuple[int, ...] = ()) -> None: ...


Measure = Callable[[str], Awaitable[Usage | None]]  # the runtime's reading of one engine


class MetricsSampler:
    def __init__(
        self,
        deployments: SampledDeployments,
        http: aiohttp.ClientSession,
        interval_s: float,
        timeout_s: float,
        measure: Measure | None = None,
        measured: Recorder | None = None,
    ):
        self._deployments = deployments
        self._http = http
        self._interval = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._samples: dict[str, Sample] = {}
        self._reading: dict[str, asyncio.Task[None]] = {}  # deployment id -> its read in flight
        self._measure = measure
        self._measured = measured
        self._measuring: dict[str, asyncio.Task[None]] = {}  # deployment id -> its memory reading
        # Told, synchronously, of each engine whose newest sample shows it idle where the one
        # before did not (or there was none): make-room waits for such a sample of a victim.
        self._idle_listeners: list[Callable[[str], None]] = []

    def add_idle_listener(self, listener: Callable[[str], None]) -> None:
        self._idle_listeners.append(listener)

    def latest(self, deployment_id: str) -> Sample | None:
        return self._samples.get(deployment_id)

    def answered(self, deployment_id: str) -> float | None:
        """When the engine's newest metrics page was asked for: a new one is a sign of life."""
        sample = self._samples.get(deployment_id)
        return None if sample is None else sample.time

    def forget(self, deployment_id: str) -> None:
        self._samples.pop(deployment_id, None)

    async def run(self) -> None:
        try:
            while True:
                self.start_reads()
                await asyncio.sleep(self._interval)
        finally:
            for task in [*self._reading.values(), *self._measuring.values()]:
                task.cancel()

    async def sample_once(self) -> None:
        """One round, waited for: the reads it started and any still in flight from before."""
        self.start_reads()
        await asyncio.gather(*self._reading.values(), *self._measuring.values())

    def start_reads(self) -> None:
        """Start a read of every ready engine that has none in flight (one sampling round), and
        a memory reading of every engine that holds memory."""
        for dep in self._deployments.all():
            if dep.state is State.READY and dep.base_url and dep.id not in self._reading:
                task = asyncio.create_task(self._sample(dep), name=f"metrics-{dep.id}")
                self._reading[dep.id] = task
                task.add_done_callback(functools.partial(_forget, self._reading, dep.id))
            if self._measure is not None and dep.holds_memory and dep.id not in self._measuring:
                task = asyncio.create_task(self._read_memory(dep), name=f"memory-{dep.id}")
                self._measuring[dep.id] = task
                task.add_done_callback(functools.partial(_forget, self._measuring, dep.id))

    async def _read_memory(self, dep: Deployment) -> None:
        assert self._measure is not None and self._measured is not None
        try:
            found = await self._measure(dep.id)
            if found is None:
                return
            gpu = await asyncio.to_thread(gpu_by_device, found.pids)
        except Exception as exc:  # noqa: BLE001 - a reading that fails is skipped, as a metrics page
            log.debug("no memory reading of %s: %r", dep.id, exc)
            return
        current = self._deployments.find(dep.id)
        if current is not None:  # (a stop meanwhile: record() drops a reading of a stopped engine)
            self._measured.record(current, found.host_bytes + sum(gpu.values()), tuple(sorted(gpu)))

    async def _sample(self, dep: Deployment) -> None:
        kind = engine_of(dep)
        url = f"{dep.base_url}{kind.metrics_path_of(dep)}"
        sent = time.monotonic()
        try:
            headers = dep.runtime_handle.auth if dep.runtime_handle else None
            async with self._http.get(url, timeout=self._timeout, headers=headers) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                load = kind.parse_load(await resp.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("no metrics from %s: %r", dep.id, exc)
            return
        before = self._samples.get(dep.id)
        sample = self._samples[dep.id] = Sample(sent, load.running, load.waiting)
        if sample.idle and (before is None or not before.idle):
            for listener in self._idle_listeners:
                try:
                    listener(dep.id)
                except Exception:
                    log.exception("idle listener %r failed", listener)
        log.debug(
            "metrics of %s: %g running, %g waiting (read in %.3f s)",
            dep.id,
            load.running,
            load.waiting,
            time.monotonic() - sent,
        )


def _forget(tasks: dict[str, asyncio.Task[None]], deployment_id: str, task: asyncio.Task[None]) -> None:
    """A read ended: the next round may start another."""
    tasks.pop(deployment_id, None)
