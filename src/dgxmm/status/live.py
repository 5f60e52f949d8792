"""Live status: every deployment's honest status (``dgxmm.status.honest``), kept current on open pages.

Views carry the status computed when they are built. Most changes reach pages anyway: the
deployer publishes every state and configuration change, the controller every change of the
live counters. What neither sees is a change of phase with the same counts (a request joining
the memory queue, a backoff running out, a start that now waits for another engine, a victim
whose idle timeout moved), so ``run`` looks at all statuses every ``POLL_S`` and asks for a
view to be published (rate-limited like the counters) for each one that changed since the last
view that went out. The same poll feeds the history with counts and the host's memory.

``read_controller`` is the one function here that reads the on-demand controller.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from dgxmm.deploy.deployer import Deployer
from dgxmm.records.deployment import Deployment
from dgxmm.status.history import History
from dgxmm.controller import decide
from dgxmm.controller.controller import Controller
from dgxmm.status.honest import Facts, Room, differs, honest_status

POLL_S = 0.5


@dataclass(frozen=True)
class ControllerFacts:
    inflight: int
    queued: int
    in_queue: bool
    last_request_at: float | None  # when the controller last granted a slot
    idle_stops_at: float | None
    refused_until: float | None


def read_controller(
    controller: Controller, deps: Iterable[Deployment], now: float
) -> tuple[dict[str, ControllerFacts], tuple[str, ...]]:
    """What the controller knows of ``deps`` (its public ``status``, the track's idle timer and
    start backoff, monotonic times turned into Unix times) and its memory queue, head first."""
    mono = controller.clock()
    queue = tuple(controller.queue_ids())
    found: dict[str, ControllerFacts] = {}
    for dep in deps:
        status = controller.status(dep.id)
        expiry = refused = None
        track = controller.tracked(dep.id)  # None for one it never saw or forgot (removed)
        if track is not None:
            expiry = decide.idle_expiry(dep, track, controller.settings.idle_timeout_s)
            refused = track.refused_until if track.refused_until > mono else None
        found[dep.id] = ControllerFacts(
            inflight=status["inflight"], queued=status["queued"], in_queue=dep.id in queue,
            last_request_at=status["last_request_at"],
            idle_stops_at=None if expiry is None else now + expiry - mono,
            refused_until=None if refused is None else now + refused - mono,
        )  # fmt: skip
    return found, queue


class LiveStatus:
    def __init__(
        self,
        deployer: Deployer,
        controller: Controller,
        history: History,
        publish_soon: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._deployer = deployer
        self._controller = controller
        self._history = history
        self._publish_soon = publish_soon
        self.clock = clock
        self._published: dict[str, dict[str, Any]] = {}

    def _facts(self, dep: Deployment, c: ControllerFacts, capacity: float) -> Facts:
        history = self._history
        last_cold = history.last_cold_start(dep.id)
        starts = history.starts(dep.id)
        failed = starts[-1] if starts and starts[-1].outcome == "failed" else None
        arrivals = [t for t in (c.last_request_at, history.last_request_at(dep.id)) if t is not None]
        return Facts(
            inflight=c.inflight, queued=c.queued, in_queue=c.in_queue, idle_stops_at=c.idle_stops_at,
            refused_until=c.refused_until, waiting_for_gate=self._deployer.waiting_for_gate(dep.id),
            last_cold_start_s=last_cold.duration_s if last_cold else None,
            last_request_at=max(arrivals) if arrivals else None,
            last_failure=(failed.ended_at or failed.began_at, failed.reason) if failed else None,
            capacity_gib=capacity,
        )  # fmt: skip

    def status(self, dep: Deployment) -> dict[str, Any]:
        """``dep``'s status now, for a view."""
        return self.statuses([dep])[dep.id]

    def statuses(self, deps: Sequence[Deployment]) -> dict[str, dict[str, Any]]:
        """The statuses of ``deps`` now, for their views, from one look at the budget and the
        controller (a look per view made the list of 2,000 deployments take 1.8 s)."""
        now = self.clock()
        snap = self._deployer.snapshot()
        found, queue = read_controller(self._controller, deps, now)
        facts = {dep.id: self._facts(dep, found[dep.id], snap.capacity) for dep in deps}
        room = None
        if any(f.in_queue for f in facts.values()):  # what it waits for depends on all the others
            every = self._deployer.peek_all()
            others, _ = read_controller(self._controller, [d for d in every if d.id not in facts], now)
            facts |= {d.id: self._facts(d, others[d.id], snap.capacity) for d in every if d.id not in facts}
            room = Room(snap.free, queue, tuple((d, facts[d.id]) for d in every))
        return {dep.id: honest_status(dep, facts[dep.id], now, room if facts[dep.id].in_queue else None)
                for dep in deps}  # fmt: skip

    def published(self, deployment_id: str, status: dict[str, Any]) -> None:
        """A view with ``status`` went out to the event stream."""
        self._published[deployment_id] = status

    def forget(self, deployment_id: str) -> None:
        self._published.pop(deployment_id, None)

    def check(self) -> list[str]:
        """One look at everything: feed the history, and ask for a view of every deployment
        whose status differs from the last one published. Returns their ids."""
        now = self.clock()
        deps = self._deployer.peek_all()
        snap = self._deployer.snapshot()
        found, queue = read_controller(self._controller, deps, now)
        facts = {dep.id: self._facts(dep, found[dep.id], snap.capacity) for dep in deps}
        room = Room(snap.free, queue, tuple((dep, facts[dep.id]) for dep in deps)) if queue else None
        changed = []
        for dep in deps:
            f = facts[dep.id]
            self._history.load(dep.id, f.inflight, f.queued)
            if differs(self._published.get(dep.id), honest_status(dep, f, now, room)):
                changed.append(dep.id)
                self._publish_soon(dep.id)
        self._history.memory(
            round(snap.usable, 3), {dep.id: dep.memory_gib for dep in deps if dep.holds_memory},
            sum(dep.memory_gib for dep in deps if dep.id in queue), {dep.id: dep.name for dep in deps},
        )  # fmt: skip
        return changed

    async def run(self) -> None:
        """Run by the supervisor: a failed check is logged, recorded and the loop restarted."""
        while True:
            self.check()
            await asyncio.sleep(POLL_S)
