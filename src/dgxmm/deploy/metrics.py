"""The metrics sampler: the latest (time, running, waiting) of every ready engine.

The controller stops a model only when a sample younger than ``metrics_max_age_s`` shows nothing
running or waiting, so a sample is never invented: an engine whose page cannot be read keeps its
last sample, which ages until it no longer counts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.models import Deployment, State

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    time: float  # time.monotonic() of the reading
    running: float
    waiting: float

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0

    def age(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.time


class Deployments(Protocol):
    def all(self) -> list[Deployment]: ...


class MetricsSampler:
    def __init__(self, deployments: Deployments, http: aiohttp.ClientSession, interval_s: float):
        self._deployments = deployments
        self._http = http
        self._interval = interval_s
        self._samples: dict[str, Sample] = {}

    def latest(self, deployment_id: str) -> Sample | None:
        return self._samples.get(deployment_id)

    def forget(self, deployment_id: str) -> None:
        self._samples.pop(deployment_id, None)

    async def run(self) -> None:
        while True:
            await self.sample_once()
            await asyncio.sleep(self._interval)

    async def sample_once(self) -> None:
        ready = [dep for dep in self._deployments.all() if dep.state is State.READY and dep.base_url]
        await asyncio.gather(*(self._sample(dep) for dep in ready))

    async def _sample(self, dep: Deployment) -> None:
        kind = engine_of(dep)
        url = f"{dep.base_url}{kind.metrics_path_of(dep)}"
        try:
            async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=self._interval)) as resp:
                if resp.status != 200:
                    raise ValueError(f"HTTP {resp.status}")
                load = kind.parse_load(await resp.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.debug("no metrics from %s: %s", dep.id, exc)
            return
        self._samples[dep.id] = Sample(time.monotonic(), load.running, load.waiting)
