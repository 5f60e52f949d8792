"""A start attempt for one deployment, run under the controller lock: queue discipline, the fit
check, does_not_fit, and making room by stopping idle on-demand models (spec: Controller)."""

from __future__ import annotations

import asyncio
import math
from typing import TYPE_CHECKING

from dgxmm.deploy.budget import InsufficientMemory
from dgxmm.deploy.models import Deployment
from dgxmm.errors import Conflict, NotFound
from dgxmm.ondemand import decide
from dgxmm.ondemand.decide import Action
from dgxmm.ondemand.errors import DoesNotFit

if TYPE_CHECKING:
    from dgxmm.ondemand.controller import Controller

SETTLE_POLL_S = 0.1


class MakeRoom:
    def __init__(self, controller: Controller) -> None:
        self._c = controller
        self.last_stop = -math.inf  # monotonic time of the last approved on-demand stop

    async def start(self, deployment_id: str) -> None:
        """Start (or wake) ``deployment_id`` for its waiters, making room if it is the queue
        head; leaves it queued when it cannot start yet. Caller holds the controller lock."""
        c = self._c
        stopped_victim = False
        while True:
            if not c.waiters_of(deployment_id):
                c.queue.leave(deployment_id)
                return  # nobody waits any more: start nothing
            dep = c.deployer.find(deployment_id)
            if dep is None:
                return
            action = decide.next_action(dep, c.track(deployment_id), c.clock())
            if action not in (Action.START, Action.WAKE):
                return
            if not self._may_start_now(dep):
                self._enqueue(deployment_id)
                return
            try:
                if action is Action.START:
                    await c.deployer.restart(deployment_id, actor="ondemand")
                else:
                    await c.deployer.wake(deployment_id, actor="ondemand")
            except InsufficientMemory as exc:
                if self._does_not_fit(exc, stopped_victim):
                    c.fail_waiters(deployment_id, DoesNotFit(
                        f"{dep.name} needs {exc.need:g} GiB, more than the {exc.capacity:.1f} GiB "
                        "on-demand models can get on this host"))  # fmt: skip
                    return
                self._enqueue(deployment_id)
                if not c.queue.is_head(deployment_id) or not await self._make_room(dep, exc):
                    return
                stopped_victim = True
                continue
            except (Conflict, NotFound):
                return  # the state moved on; waiters look again
            c.queue.leave(deployment_id)
            c.record_start(deployment_id)
            return

    def _may_start_now(self, dep: Deployment) -> bool:
        """Behind a blocked head, only what fits in free memory minus the head's reservation."""
        q = self._c.queue
        if not len(q) or q.is_head(dep.id):
            return True
        snap = self._c.deployer.snapshot(exclude=dep.id)
        return decide.may_start_behind_head(dep.memory_gib, snap.free, q.reserved_for_others(dep.id))

    def _does_not_fit(self, exc: InsufficientMemory, stopped_victim: bool) -> bool:
        """More than the capacity can never fit, unless a recent stop may still read as used."""
        recent = self._c.clock() - self.last_stop < self._c.settings.stop_settle_s
        return exc.need > exc.capacity + 1e-9 and not stopped_victim and not recent

    def _enqueue(self, deployment_id: str) -> None:
        c = self._c
        if c.queue.join(deployment_id):
            c.notify()
        for waiter in c.waiters_of(deployment_id):
            c.fire_queued(waiter)

    async def _make_room(self, dep: Deployment, exc: InsufficientMemory) -> bool:
        """Stop idle on-demand models, least recently used first, to cover the shortfall; none is
        stopped if all of them together are not enough. True if any stop was approved."""
        c = self._c
        now = c.clock()
        candidates = [
            decide.Candidate(other.id, other.memory_gib, c.track(other.id).idle_since)
            for other in c.deployer.all()
            if other.id != dep.id and c.is_idle(other)
        ]
        victims = decide.pick_victims(candidates, exc.need - exc.free)
        if not victims:
            return False
        text = f"Stopped to make room for {dep.name}"
        by_id = {other.id: other for other in c.deployer.all()}
        results = await asyncio.gather(*(c.stop_idle(by_id[v], text) for v in victims))
        freed = sum(by_id[v].memory_gib for v, ok in zip(victims, results) if ok)
        if not freed:
            return False
        c.queue.reserve(dep.id, freed)
        await self._settle(dep.id, now)
        return True

    async def _settle(self, deployment_id: str, since: float) -> None:
        """Wait up to ``stop_settle_s`` for the budget to show the freed memory."""
        c = self._c
        deadline = since + c.settings.stop_settle_s
        while c.clock() < deadline:
            try:
                c.deployer.fit(deployment_id)
                return
            except InsufficientMemory:
                await asyncio.sleep(SETTLE_POLL_S)
            except NotFound:
                return
