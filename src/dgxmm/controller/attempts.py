"""Start attempts: at most one task per deployment, shared by its waiters (``Attempts``).

An attempt decides (``_decide``: a fresh snapshot, ``oomretry.plan_attempt``, which is
``decide.plan_attempt`` with a start's one retry for memory, and the synchronous part of the
step, in one plain call, so nothing else runs meanwhile: the controller lock), does
the slow part of the step outside the decision (the victims' stops, a drain's wait for what they
run, the wait for freed memory), and decides again. Its state (the tasks, the queue and its
reservation, the tracks) is ``ControllerState``'s, changed only through its named writes (a
reservation, a drain, a start's flag); the world is reached through ``Effects``. A decision runs
inside ``ControllerState.deciding``: the change its own restart makes is applied after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from dgxmm.controller import decide, oomretry, texts
from dgxmm.controller.decide import Track
from dgxmm.controller.effects import Clock, Effects, Report
from dgxmm.controller.errors import DoesNotFit, StartFailed
from dgxmm.controller.state import ControllerState
from dgxmm.controller.stops import Stops
from dgxmm.deploy.budget import InsufficientMemory
from dgxmm.errors import Conflict, NotFound, StoreUnavailable
from dgxmm.logs import fields
from dgxmm.records.deployment import Deployment, State
from dgxmm.settings import OndemandSettings

log = logging.getLogger(__name__)

SETTLE_POLL_S = 0.1  # a measured budget changes without an event: look this often while settling


def name_of(effects: Effects, deployment_id: str) -> str:
    dep = effects.peek(deployment_id)
    return dep.name if dep is not None else deployment_id


def record(effects: Effects, deployment_id: str, action: str, text: str) -> None:
    """The controller's event row and its audit row."""
    effects.event("ondemand", deployment_id, text)
    effects.audit(action, actor="ondemand", user=None, deployment_id=deployment_id, text=text)


class Attempts:
    def __init__(
        self,
        settings: OndemandSettings,
        state: ControllerState,
        effects: Effects,
        clock: Clock,
        report: Report,
        stops: Stops,
        is_evictable: Callable[[Deployment], bool],
    ) -> None:
        self._settings = settings
        self._state = state
        self._effects = effects
        self._clock = clock
        self._metrics = report
        self._stops = stops
        self._is_evictable = is_evictable
        self._rules = decide.Rules(
            settings.idle_timeout_s,
            settings.metrics_max_age_s,
            settings.stop_settle_s,
            settings.evict_idle_s,
            settings.max_drain_wait_s,
        )

    def ensure(self, deployment_id: str) -> None:
        """One attempt per deployment, shared by its waiters; it is the controller's own task,
        so a waiter that hangs up never cancels a deployer call half-way."""
        self._state.ensure_attempt(deployment_id, lambda: self._attempt(deployment_id))

    async def _attempt(self, deployment_id: str) -> None:
        """Decide, do the slow part of the step outside the decision, decide again. An attempt
        that ends wakes nobody by itself: every step that changes what waiters see wakes them (a
        blanket wake-up here would have the waiters start the next attempt at once, forever)."""
        progress = decide.Progress()
        try:
            while True:
                step = self._decide(deployment_id, progress)
                if isinstance(step, decide.MakeRoom | decide.Drain):
                    made = (
                        await self._make_room(deployment_id, step.victims)
                        if isinstance(step, decide.MakeRoom)
                        else await self._drain(deployment_id, step.victims)
                    )
                    if not made:
                        return  # every victim turned busy (or the drain was moot): stay queued until something changes
                    until = self._clock() + self._settings.stop_settle_s
                    progress = decide.Progress(stopped_victim=True, settle_until=until)
                elif isinstance(step, decide.Settle):  # the head: a change of memory wakes it
                    changed = self._state.wakeup(deployment_id)
                    await self._clock.wait(changed, min(SETTLE_POLL_S, step.until - self._clock()))
                else:
                    return
        except Exception as exc:
            log.exception("start attempt for %s failed", deployment_id, extra=fields(deployment_id))
            self._metrics.start_failed(deployment_id)
            self._state.fail_waiters(deployment_id, StartFailed(f"start attempt failed: {exc}"))

    def _decide(self, deployment_id: str, progress: decide.Progress) -> decide.Step:
        """One decision in one plain call (the controller lock): a fresh snapshot, the plan, and
        the synchronous part of its step. Nothing here awaits, and a change of the ledger its step
        makes is applied after it (``deciding``)."""
        with self._state.deciding():
            return self._step(deployment_id, oomretry.plan_attempt(self._snapshot(deployment_id, progress)))

    def _step(self, deployment_id: str, step: decide.Step) -> decide.Step:
        match step:
            case decide.Abandon():
                self._state.leave_queue(deployment_id)
            case decide.Start():
                return self._start(deployment_id, step)
            case decide.Enqueue():
                self._state.enqueue(deployment_id)
            case decide.MakeRoom(victims) | decide.Drain(victims):  # what they free is the head's
                self._state.enqueue(deployment_id)
                memory = {dep.id: self._effects.held_gib(dep) for dep in self._effects.all()}
                self._state.reserve(deployment_id, {v: memory.get(v, 0.0) for v in victims})
            case decide.GiveUp(need, capacity):
                several = len(self._effects.snapshot().rooms()) > 1
                self._state.fail_waiters(
                    deployment_id,
                    DoesNotFit(texts.does_not_fit(name_of(self._effects, deployment_id), need, capacity, several)),
                )
        return step

    def _snapshot(self, deployment_id: str, progress: decide.Progress) -> decide.AttemptSnapshot:
        dep, others = None, []
        tracks = self._state.tracks
        for each in self._effects.all():
            if each.id == deployment_id:
                dep = each
            else:
                others.append(
                    decide.Other(
                        each,
                        tracks.get(each.id),
                        self._effects.latest(each.id),
                        self._effects.held_gib(each),
                        self._effects.devices_of(each),
                    )
                )
        budget = self._effects.snapshot(exclude=deployment_id)
        now = self._clock()
        track = tracks.get(deployment_id) or Track(idle_since=now)  # removed: none is kept
        queue = self._state.queue
        return decide.AttemptSnapshot(
            deployment_id=deployment_id,
            dep=dep,
            track=track,
            waiters=len(self._state.waiters.get(deployment_id, ())),
            now=now,
            queue=tuple(queue.ids()),
            head_victims=queue.victims_of_head(deployment_id),
            free_gib=budget.free,
            capacity_gib=budget.capacity,
            others=tuple(others),
            last_stop=self._state.last_stop,
            progress=progress,
            rules=self._rules,
            queued_since=queue.joined_at(deployment_id),
            rooms=budget.rooms(),
            need=self._effects.need_of(dep) if dep is not None else None,
        )

    def _start(self, deployment_id: str, step: decide.Start) -> decide.Step:
        """Start or wake through the deployer's check-and-write (it fits: the snapshot said so,
        and nothing ran since)."""
        state = self._state
        state.mark_started(deployment_id, True)  # before the change, so its published view says so
        try:
            if step.wake:
                self._effects.wake(deployment_id, actor="ondemand")
            else:
                self._effects.restart(deployment_id, actor="ondemand", devices=step.devices)
        except InsufficientMemory:  # a measured budget read differently a moment later
            state.mark_started(deployment_id, False)
            state.enqueue(deployment_id)
            return decide.Enqueue()
        except (Conflict, NotFound):  # the state moved on: waiters look again
            state.mark_started(deployment_id, False)
            return decide.Moot()
        except StoreUnavailable as exc:  # no start while the database cannot be written
            state.mark_started(deployment_id, False)
            name = name_of(self._effects, deployment_id)
            state.fail_waiters(deployment_id, StartFailed(f"{name} cannot start: {exc.message}"))
            return decide.Moot()
        state.leave_queue(deployment_id)
        dep = self._effects.peek(deployment_id)
        if dep is not None and dep.state is State.PLANNED:  # its files are fetched again: no engine yet
            state.mark_started(deployment_id, False)
            return decide.Moot()
        self._metrics.started_for_requests(deployment_id, woke=step.wake)
        text = texts.STARTED_FOR_REQUEST
        if state.tracks[deployment_id].oom is decide.OomRetry.DUE:  # its one retry: a failure now is final
            state.oom_retry(deployment_id, decide.OomRetry.TAKEN)
            text = texts.OOM_RETRY
        record(self._effects, deployment_id, "ondemand_start", text)
        return step

    async def _make_room(self, deployment_id: str, victims: tuple[str, ...]) -> bool:
        """Stop the victims (each through the precheck); True if any stop was approved. A victim
        the precheck refused frees nothing for the head."""
        text = texts.make_room_stop(name_of(self._effects, deployment_id))
        results = await asyncio.gather(
            *(self._stops.stop(victim, text, "make_room", self._is_evictable) for victim in victims)
        )
        for victim, approved in zip(victims, results, strict=True):
            if not approved:
                self._state.unreserve(deployment_id, victim)
        return any(results)

    async def _drain(self, deployment_id: str, victims: tuple[str, ...]) -> bool:
        """Drain ``victims`` for the head ``deployment_id``: they get no new slot (their new
        requests wait, with the queued notice), what they run finishes, then each is stopped
        through its precheck. The drain ends with the attempt: a head that starts, leaves or is
        removed meanwhile lets them serve again. True if any stop was approved."""
        state = self._state
        for victim in victims:
            state.drain(victim, deployment_id)  # its waiters see it drained: they queue
        try:
            while True:
                # Taken before the look: a victim's last release (or the head's change) wakes it.
                changed = state.wakeup(deployment_id)
                busy = [v for v in victims if (t := state.tracks.get(v)) is not None and t.inflight > 0]
                if not busy:
                    break
                dep = self._effects.peek(deployment_id)
                if (
                    dep is None
                    or not state.waiters.get(deployment_id)
                    or dep.state not in (State.STOPPED, State.FAILED, State.ASLEEP)
                ):
                    return False  # nobody waits any more, or it is starting by other means
                await self._clock.wait(changed, self._settings.waiter_wake_s)
            text = texts.drain_stop(name_of(self._effects, deployment_id))
            owed = {v: (t := state.tracks.get(v)) is not None and t.waiting > 0 for v in victims}
            drained = self._may_stop_drained
            results = await asyncio.gather(*(self._stops.stop(v, text, "drain", drained) for v in victims))
            for victim, approved in zip(victims, results, strict=True):
                if approved and owed[victim]:
                    state.owe(victim)  # its waiting requests are served before it is drained again
            return any(results)
        finally:
            for victim in victims:
                state.undrain(victim, deployment_id)

    def _may_stop_drained(self, dep: Deployment) -> bool:
        """A drain's precheck: drained, and nothing in flight any more."""
        return decide.may_stop_drained(dep, self._state.tracks.get(dep.id))
