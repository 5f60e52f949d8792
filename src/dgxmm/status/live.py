"""Live status: every deployment's honest status (``dgxmm.status.honest``), kept current on open pages.

Views carry the status computed when they are built. Most changes reach pages anyway: the
deployer publishes every state and configuration change, the controller every change of the
live counters. What neither publishes is a change of phase with the same counts (a request
joining the memory queue, a backoff running out, a start that now waits for another engine, a
victim whose idle timer moved). ``LiveStatus`` follows those without looking at every deployment
in turns: the controller announces each deployment whose on-demand facts changed
(``Controller.add_watcher``), the deployer each change of a record or of the start-up gate, and
``run`` looks at just those (and at the queued ones, whose wait depends on everyone), at most
every ``CHECK_GAP_S``; a change of phase goes out at once (``publish_now``), a change of counts
alone is folded with the counters (``publish_soon``). Time alone changes a status in two ways, a backoff that runs out and a
wait whose expected end passes, and each is looked at when it is due; while something is queued,
the queued ones are looked at every ``QUEUED_POLL_S`` as well, since free memory may be measured
and change without an event. An idle host costs nothing. The same checks feed the history with
counts and the host's memory.

``read_controller`` is the one function here that reads the on-demand controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dgxmm.deploy import placement
from dgxmm.deploy.budget import MemoryBudget, Snapshot
from dgxmm.records.changes import Change
from dgxmm.records.deployment import Deployment
from dgxmm.settings import OndemandSettings
from dgxmm.status.history import History
from dgxmm.controller import decide
from dgxmm.controller.effects import Clock
from dgxmm.status.honest import Facts, Room, differs, honest_status, wait_ends_at

CHECK_GAP_S = 0.05  # announcements that come together are looked at in one check
QUEUED_POLL_S = 0.5  # while something is queued: a measured free memory changes without an event
MOVING_S = 1.0  # a wait whose expected end passed moves with the clock: looked at again this often


class LiveDeployments(Protocol):
    """The deployer, as the live status reads it: stored records (not copies), the budget and
    the start-up gate, and each change as it happens."""

    @property
    def budget(self) -> MemoryBudget: ...

    def snapshot(self, exclude: str | None = None) -> Snapshot: ...

    def peek(self, deployment_id: str) -> Deployment | None: ...

    def peek_all(self) -> list[Deployment]: ...

    def waiting_for_gate(self, deployment_id: str) -> bool: ...


class OnDemand(Protocol):
    """The on-demand controller, as the live status reads it (``read_controller``), and the ids
    whose on-demand facts changed (``add_watcher``)."""

    @property
    def settings(self) -> OndemandSettings: ...

    @property
    def clock(self) -> Clock: ...

    def status(self, deployment_id: str) -> dict[str, Any]: ...

    def tracked(self, deployment_id: str) -> decide.Track | None: ...

    def queue_ids(self) -> list[str]: ...

    def stopped_for(self, deployment_id: str) -> tuple[str, ...]: ...

    def add_watcher(self, watcher: Callable[[str], None]) -> None: ...


@dataclass(frozen=True)
class ControllerFacts:
    inflight: int
    queued: int
    in_queue: bool
    last_request_at: float | None  # when the controller last granted a slot
    idle_stops_at: float | None
    evictable_at: float | None
    refused_until: float | None
    drained_for: str | None
    stopped_for_it: tuple[str, ...]


def read_controller(
    controller: OnDemand, deps: Iterable[Deployment], now: float
) -> tuple[dict[str, ControllerFacts], tuple[str, ...]]:
    """What the controller knows of ``deps`` (its public ``status``, the track's idle timer and
    start backoff, monotonic times turned into Unix times) and its memory queue, head first."""
    mono = controller.clock()
    queue = tuple(controller.queue_ids())
    found: dict[str, ControllerFacts] = {}
    for dep in deps:
        status = controller.status(dep.id)
        expiry = evict = refused = None
        track = controller.tracked(dep.id)  # None for one it never saw or forgot (removed)
        if track is not None:
            o = controller.settings
            expiry = decide.idle_expiry(dep, track, o.idle_timeout_s)
            if o.evict_idle_s is not None:
                evict = decide.idle_expiry(dep, track, o.idle_timeout_s, o.evict_idle_s)
            refused = track.refused_until if track.refused_until > mono else None
        found[dep.id] = ControllerFacts(
            inflight=status["inflight"],
            queued=status["queued"],
            in_queue=dep.id in queue,
            last_request_at=status["last_request_at"],
            idle_stops_at=None if expiry is None else now + expiry - mono,
            evictable_at=None if evict is None else now + evict - mono,
            refused_until=None if refused is None else now + refused - mono,
            drained_for=track.drained_for if track is not None else None,
            stopped_for_it=controller.stopped_for(dep.id),
        )
    return found, queue


class LiveStatus:
    def __init__(
        self,
        deployer: LiveDeployments,
        controller: OnDemand,
        history: History,
        publish_soon: Callable[[str], None],
        clock: Callable[[], float] = time.time,
        publish_now: Callable[[str], None] | None = None,
    ) -> None:
        self._deployer = deployer
        self._controller = controller
        self._history = history
        self._publish_soon = publish_soon  # folded with the counters: a change of counts alone
        self._publish_now = publish_now or publish_soon  # a change of phase: pages show it at once
        self.clock = clock
        self._published: dict[str, dict[str, Any]] = {}
        self._facts: dict[str, Facts] = {}  # as the last look at each deployment found them
        self._marked: set[str] = set()  # announced since the last check
        self._everything = True  # the next check looks at every deployment
        self._capacity: tuple[float, ...] | None = None  # what on-demand models could get at the last check, per device
        self._due: dict[str, float] = {}  # when a status changes with time alone (Unix time)
        self._queued = False  # something was in the memory queue at the last check
        self._announced = asyncio.Event()
        controller.add_watcher(self.mark)

    def mark(self, deployment_id: str) -> None:
        """Something of ``deployment_id`` a status shows may have changed: the next check looks."""
        self._marked.add(deployment_id)
        self._announced.set()

    def on_change(self, change: Change) -> None:
        """Deployer listener (``assembly.listeners``): a changed deployment is looked at next."""
        self.mark(change.deployment.id)

    def _ceiling(self, dep: Deployment, snap: Snapshot) -> tuple[float | None, float]:
        """What ``dep`` needs on each device it spans (None on a pooled host: its memory_gib) and
        the most on-demand models can get on a device it may use."""
        budget = self._deployer.budget
        if budget.pooled:
            return None, snap.capacity
        need = budget.need_of(dep)
        return need.per_device, placement.largest_share(snap.rooms(), need)

    def _facts_of(self, dep: Deployment, c: ControllerFacts, snap: Snapshot) -> Facts:
        history = self._history
        last_cold = history.last_cold_start(dep.id)
        starts = history.starts(dep.id)
        failed = starts[-1] if starts and starts[-1].outcome == "failed" else None
        arrivals = [t for t in (c.last_request_at, history.last_request_at(dep.id)) if t is not None]
        share, capacity = self._ceiling(dep, snap)
        return Facts(
            inflight=c.inflight,
            queued=c.queued,
            in_queue=c.in_queue,
            idle_stops_at=c.idle_stops_at,
            evictable_at=c.evictable_at,
            drained_for=c.drained_for,
            stopped_for_it=c.stopped_for_it,
            refused_until=c.refused_until,
            waiting_for_gate=self._deployer.waiting_for_gate(dep.id),
            last_cold_start_s=last_cold.duration_s if last_cold else None,
            last_request_at=max(arrivals) if arrivals else None,
            last_failure=(failed.ended_at or failed.began_at, failed.reason) if failed else None,
            capacity_gib=capacity,
            share_gib=share,
        )

    def status(self, dep: Deployment) -> dict[str, Any]:
        """``dep``'s status now, for a view."""
        return self.statuses([dep])[dep.id]

    def statuses(self, deps: Sequence[Deployment]) -> dict[str, dict[str, Any]]:
        """The statuses of ``deps`` now, for their views, from one look at the budget and the
        controller (a look per view made the list of 2,000 deployments take 1.8 s)."""
        now = self.clock()
        snap = self._deployer.snapshot()
        found, queue = read_controller(self._controller, deps, now)
        facts = {dep.id: self._facts_of(dep, found[dep.id], snap) for dep in deps}
        room = None
        if any(f.in_queue for f in facts.values()):  # what it waits for depends on all the others
            every = self._deployer.peek_all()
            others, _ = read_controller(self._controller, [d for d in every if d.id not in facts], now)
            facts |= {d.id: self._facts_of(d, others[d.id], snap) for d in every if d.id not in facts}
            room = Room(snap.free, queue, tuple((d, facts[d.id]) for d in every))
        return {
            dep.id: honest_status(dep, facts[dep.id], now, room if facts[dep.id].in_queue else None) for dep in deps
        }

    def published(self, deployment_id: str, status: dict[str, Any]) -> None:
        """A view with ``status`` went out to the event stream."""
        self._published[deployment_id] = status

    def forget(self, deployment_id: str) -> None:
        for kept in (self._published, self._facts, self._due):
            kept.pop(deployment_id, None)

    def check(self) -> list[str]:
        """Look at every deployment announced since the last check, the queued ones and those
        whose status is due to change with time: feed the history, and ask for a view of each
        whose status differs from the last one published. Returns their ids."""
        now = self.clock()
        snap = self._deployer.snapshot()
        capacities = tuple(room.capacity_gib for room in snap.rooms())
        if capacities != self._capacity:  # whether each on-demand model can ever fit
            self._everything, self._capacity = True, capacities
        if self._everything:
            marked = [dep.id for dep in self._deployer.peek_all()]
            self._everything = False
        else:
            marked = list(self._marked) + [dep_id for dep_id, due in self._due.items() if due <= now]
        self._marked = set()
        deps = {dep.id: dep for dep in map(self._deployer.peek, marked) if dep is not None}
        for gone in set(marked) - deps.keys():
            self.forget(gone)
        found, queue = read_controller(self._controller, deps.values(), now)
        for dep in deps.values():
            f = self._facts[dep.id] = self._facts_of(dep, found[dep.id], snap)
            self._history.load(dep.id, f.inflight, f.queued)
        every = self._deployer.peek_all()
        room = None
        if queue:  # a queued deployment's wait depends on everyone: look at each queued one
            unseen = [dep for dep in every if dep.id not in self._facts]  # none after a first full check
            if unseen:
                more, _ = read_controller(self._controller, unseen, now)
                self._facts |= {dep.id: self._facts_of(dep, more[dep.id], snap) for dep in unseen}
            room = Room(snap.free, queue, tuple((dep, self._facts[dep.id]) for dep in every))
            deps |= {dep_id: queued for dep_id in queue if (queued := self._deployer.peek(dep_id)) is not None}
        self._queued = bool(queue)
        changed = []
        for dep in deps.values():
            status = honest_status(dep, self._facts[dep.id], now, room)
            self._schedule(dep.id, status, now)
            published = self._published.get(dep.id)
            if differs(published, status, counts=False):
                changed.append(dep.id)
                self._publish_now(dep.id)
            elif differs(published, status):
                changed.append(dep.id)
                self._publish_soon(dep.id)
        if deps:
            self._history.memory(
                round(snap.usable, 3),
                {dep.id: dep.memory_gib for dep in every if dep.holds_memory},
                sum(dep.memory_gib for dep in every if dep.id in queue),
                {dep.id: dep.name for dep in every},
                {dep.id: list(dep.placed_on) for dep in every if dep.holds_memory and dep.placed_on is not None},
            )
        return changed

    def _schedule(self, deployment_id: str, status: dict[str, Any], now: float) -> None:
        """When ``status`` changes with time alone: a backoff that runs out (the failed badge's
        ``until``), or the expected end of a queued wait, which moves with the clock once passed."""
        due = None
        if status["code"] == "failed" and status["until"] is not None:
            due = status["until"]
        elif (ends := wait_ends_at(status["waits_for"])) is not None:
            due = max(ends, now + MOVING_S)
        if due is None:
            self._due.pop(deployment_id, None)
        else:
            self._due[deployment_id] = due

    def _next_check_in(self) -> float | None:
        """Seconds until a check is due without an announcement; None: none is."""
        delays = [due - self.clock() for due in self._due.values()]
        if self._queued:
            delays.append(QUEUED_POLL_S)
        return max(0.0, min(delays)) if delays else None

    async def run(self) -> None:
        """Run by the supervisor (a failed check is logged, recorded and the loop restarted,
        with every deployment looked at again)."""
        self._everything = True
        while True:
            self._announced.clear()
            self.check()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_check_in()):
                    await self._announced.wait()
            await asyncio.sleep(CHECK_GAP_S)
