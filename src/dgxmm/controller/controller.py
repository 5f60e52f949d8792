"""The on-demand controller (``ctx.ondemand``): slots, shared starts, make-room, queue, reaper.

It alone owns its tracks (counts, idle timers, backoff), the memory queue with the head's
reservation, the waiters, the start attempts, the grace clock and the wake-up event; nothing is
persisted (docs/controller.md lists every piece, its owner and the invariants tests check).

Every decision is one plain method call (``_decide``): a fresh snapshot, ``decide.plan_attempt``
and the synchronous part of the step. A plain call cannot await, so nothing else runs during it:
that is the controller lock, held only while deciding. The slow parts (the victims' stops, the
wait for freed memory) run afterwards in the attempt task, which then decides again.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from typing import Any

from dgxmm.deploy.budget import InsufficientMemory
from dgxmm.records.changes import Change
from dgxmm.records.deployment import Deployment, Mode, Role, State
from dgxmm.errors import Conflict, NotFound, StoreUnavailable
from dgxmm.controller import decide, texts
from dgxmm.controller.counters import CounterPublisher
from dgxmm.controller.decide import Action, Track
from dgxmm.controller.effects import Clock, Effects, MonotonicClock, Report, Unreported
from dgxmm.controller.errors import (
    DoesNotFit,
    NoSuchDeployment,
    NotOnDemand,
    OndemandError,
    QueueFull,
    QueueTimeout,
    ShuttingDown,
    StartFailed,
    Stopped,
)
from dgxmm.controller.modeswitch import ModeSwitch
from dgxmm.controller.queue import MemoryQueue
from dgxmm.controller.slots import Slot, Waiter
from dgxmm.controller.stops import Stops
from dgxmm.onethread import Owner
from dgxmm.settings import OndemandSettings
from dgxmm.logs import fields

log = logging.getLogger(__name__)

SETTLE_POLL_S = 0.1  # a measured budget changes without an event: look this often while settling


class Controller:
    def __init__(
        self,
        settings: OndemandSettings,
        effects: Effects,
        publish_view: Callable[[str], None],
        clock: Clock | None = None,
        report: Report | None = None,
    ) -> None:
        self._owner = Owner("on-demand controller")
        self.settings = settings
        self._effects = effects
        self._metrics = report if report is not None else Unreported()
        self.clock: Clock = clock or MonotonicClock()
        self._rules = decide.Rules(
            settings.idle_timeout_s,
            settings.metrics_max_age_s,
            settings.stop_settle_s,
            settings.evict_idle_s,
            settings.max_drain_wait_s,
        )
        now = self.clock()
        # Seen for the first time (also after a dgxmm restart): the idle timer starts now.
        self._tracks: dict[str, Track] = {
            dep.id: Track(idle_since=now, config=dep.config_fingerprint()) for dep in effects.all()
        }
        self._queue = MemoryQueue()
        self._waiters: dict[str, set[Waiter]] = defaultdict(set)
        self._total_waiting = 0
        self._attempts: dict[str, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()
        self._counters = CounterPublisher(publish_view, settings.counters_publish_s)
        self._watchers: list[Callable[[str], None]] = []
        self._shutting_down = False
        self._modes = ModeSwitch(effects, self)
        self._stops = Stops(settings, effects, self.is_idle, self.clock, self._metrics, self._audit)
        effects.add_listener(self._on_change)

    # --- reading ------------------------------------------------------------------------------

    def tracked(self, deployment_id: str) -> Track | None:
        """What the controller knows of a deployment, for readers; never creates a track."""
        return self._tracks.get(deployment_id)

    def track(self, deployment_id: str) -> Track:
        track = self._tracks.get(deployment_id)
        if track is None:
            track = self._tracks[deployment_id] = Track(idle_since=self.clock())
        return track

    def reset_backoff(self, deployment_id: str) -> None:
        """(``modeswitch.Tracks``) New starts are not refused any more."""
        track = self.track(deployment_id)
        track.backoff_s = track.refused_until = 0.0
        self._touched(deployment_id)

    def restart_idle_timer(self, deployment_id: str) -> None:
        """(``modeswitch.Tracks``) The idle timer starts now."""
        self.track(deployment_id).idle_since = self.clock()
        self._touched(deployment_id)

    async def set_mode(
        self, deployment_id: str, mode: Mode, idle_timeout_s: float | None, *, user: str | None
    ) -> Deployment:
        """Switch between always on and on demand (modeswitch.py)."""
        return self._modes.set_mode(deployment_id, mode, idle_timeout_s, user=user)

    def status(self, deployment_id: str) -> dict[str, Any]:
        track = self._tracks.get(deployment_id)
        dep = self._effects.peek(deployment_id)
        return {
            "inflight": track.inflight if track else 0,
            "queued": track.waiting if track else 0,
            "last_request_at": track.last_request_at if track else None,
            "phase": decide.phase(dep, track, deployment_id in self._queue).value,
        }

    def add_watcher(self, watcher: Callable[[str], None]) -> None:
        """Hear, synchronously, the id of every deployment whose on-demand facts changed: its
        counts, its place in the memory queue, its idle timer or its start backoff (the live
        status follows phases through this instead of looking at every deployment in turns)."""
        self._watchers.append(watcher)

    def _touched(self, deployment_id: str, *, counts: bool = False) -> None:
        """Something of ``deployment_id`` a status shows changed; ``counts``: its in-flight or
        waiting count, which the counter publisher pushes on its own."""
        if counts:
            self._counters.changed(deployment_id)
        for watcher in self._watchers:
            watcher(deployment_id)

    def status_changed(self, deployment_id: str) -> None:
        """Something a view shows changed besides the counts (a change of phase the live status
        saw): publish it like a change of the counts, at most once a second together with them."""
        self._counters.changed(deployment_id)

    @property
    def total_waiting(self) -> int:
        return self._total_waiting

    def queue_ids(self) -> list[str]:
        return self._queue.ids()

    def stopped_for(self, deployment_id: str) -> tuple[str, ...]:
        """The deployments make-room (or a drain) stopped for a queued deployment, whose memory
        is reserved for it until it starts."""
        return self._queue.victims_of(deployment_id)

    def is_idle(self, dep: Deployment) -> bool:
        """The reaper's rule (``decide.is_idle``) on the controller's own state; also the precheck
        of the reaper's stops."""
        return decide.is_idle(
            dep,
            self._tracks.get(dep.id),
            self._effects.latest(dep.id),
            self.clock(),
            default_timeout_s=self.settings.idle_timeout_s,
            max_sample_age_s=self.settings.metrics_max_age_s,
        )

    def is_evictable(self, dep: Deployment) -> bool:
        """Make-room's victim rule: idle as the reaper's, for ``evict_idle_s`` when that is set;
        also the precheck of make-room's stops."""
        return decide.is_idle(
            dep,
            self._tracks.get(dep.id),
            self._effects.latest(dep.id),
            self.clock(),
            default_timeout_s=self.settings.idle_timeout_s,
            max_sample_age_s=self.settings.metrics_max_age_s,
            idle_for_s=decide.evict_after(dep, self.settings.idle_timeout_s, self.settings.evict_idle_s),
        )

    def _is_drained(self, deployment_id: str) -> bool:
        track = self._tracks.get(deployment_id)
        return track is not None and track.drained_for is not None

    def _drained(self, dep: Deployment) -> bool:
        """A drain's precheck: drained, and nothing in flight any more."""
        return decide.may_stop_drained(dep, self._tracks.get(dep.id))

    # --- slots --------------------------------------------------------------------------------

    def try_slot(self, deployment_id: str) -> Slot | None:
        """A slot at once if the deployment is ready, as ``acquire`` would grant it; else None."""
        dep = self._effects.peek(deployment_id)
        if dep is None or dep.role is not Role.MODEL or dep.state is not State.READY or self._shutting_down:
            return None
        if self._is_drained(deployment_id):
            return None
        return self._grant(deployment_id)

    async def acquire(
        self,
        deployment_id: str,
        on_queued: Callable[[], None] | None = None,
        arrival: float | None = None,
    ) -> Slot:
        """A slot for one request, or one of the named errors. ``arrival`` (this clock) starts the
        deadline, so a cold start counts against the queue timeout."""
        if self._shutting_down:
            raise ShuttingDown("dgxmm is shutting down")
        dep = self._effects.find(deployment_id)
        if dep is None:
            raise NoSuchDeployment(f"no deployment {deployment_id}")
        if dep.role is not Role.MODEL:
            raise NotOnDemand(f"{dep.name} is not an on-demand deployment")
        if dep.state is State.READY and not self._is_drained(deployment_id):
            return self._grant(deployment_id)
        if self._total_waiting >= self.settings.max_queued:
            raise QueueFull(f"{self._total_waiting} requests are already waiting")
        start = self.clock() if arrival is None else arrival
        waiter = Waiter(deployment_id, start + self.settings.queue_timeout_s, on_queued)
        self._add_waiter(waiter)
        outcome = "gone"
        try:
            slot = await self._wait(waiter)
            outcome = "granted"
            return slot
        except OndemandError:
            outcome = "refused"
            raise
        finally:
            self._remove_waiter(waiter)
            self._metrics.waited(deployment_id, self.clock() - start, outcome)

    async def _wait(self, waiter: Waiter) -> Slot:
        dep_id = waiter.deployment_id
        while True:
            # Captured before anything is read: a change from here on ends the wait below, so a
            # wake-up between this look and the wait is never lost.
            changed = self._changed
            if waiter.error is not None:
                raise waiter.error
            dep = self._effects.find(dep_id)
            if dep is None:
                raise NoSuchDeployment(f"deployment {dep_id} was removed")
            now = self.clock()
            action = decide.next_action(dep, self.track(dep_id), now)
            if action is Action.GRANT:
                return self._grant(dep_id)
            if action is Action.REFUSE:
                raise StartFailed(self._backoff_message(dep))
            if now >= waiter.deadline:
                self._timed_out(dep)
                raise QueueTimeout(f"no slot for {dep.name} within {self.settings.queue_timeout_s:g} s")
            if action in (Action.START, Action.WAKE):
                self._ensure_attempt(dep_id)
            if dep_id in self._queue or self._is_drained(dep_id):  # a drained model's requests queue
                self._fire_queued(waiter)
            await self.clock.wait(changed, self._wake_in(waiter, now))

    def _grant(self, deployment_id: str) -> Slot:
        self._owner.check()
        track = self.track(deployment_id)
        track.inflight += 1
        track.idle_since = self.clock()
        track.last_request_at = time.time()
        self._touched(deployment_id, counts=True)
        return Slot(deployment_id, self._release)

    def _release(self, deployment_id: str) -> None:
        self._owner.check()
        track = self._tracks.get(deployment_id)
        if track is None:  # removed while the request ran
            return
        track.inflight -= 1
        track.idle_since = self.clock()
        self._touched(deployment_id, counts=True)
        if track.inflight == 0 and len(self._queue):
            self.notify()  # queued waiters time their next look by this model's idle expiry

    def _add_waiter(self, waiter: Waiter) -> None:
        self._waiters[waiter.deployment_id].add(waiter)
        self._total_waiting += 1
        self.track(waiter.deployment_id).waiting += 1
        self._touched(waiter.deployment_id, counts=True)

    def _remove_waiter(self, waiter: Waiter) -> None:
        dep_id = waiter.deployment_id
        self._waiters[dep_id].discard(waiter)
        self._total_waiting -= 1
        track = self._tracks.get(dep_id)
        if track is not None:
            track.waiting -= 1
            self._touched(dep_id, counts=True)
        if track is not None and track.waiting == 0 and track.owed:
            track.owed = False  # the requests a drain made wait were served (or left)
        if not self._waiters[dep_id]:
            del self._waiters[dep_id]
            self._leave_queue(dep_id)  # the last waiter gave up: so does its queue entry

    def _fire_queued(self, waiter: Waiter) -> None:
        """The queued notice hook: once per request, the first time it waits for memory."""
        if waiter.queued_fired:
            return
        waiter.queued_fired = True
        self._metrics.queued(waiter.deployment_id)
        if waiter.on_queued is not None:
            try:
                waiter.on_queued()
            except Exception:
                log.exception("on_queued callback failed")

    def notify(self) -> None:
        """Wake every waiter and settling attempt: something they decide on changed."""
        self._owner.check()
        self._changed.set()
        self._changed = asyncio.Event()

    def _wake_in(self, waiter: Waiter, now: float) -> float:
        """At most ``waiter_wake_s``, sooner at the deadline, when a model may become a victim
        (its ``evict_after`` runs out: a queued request must look again) and when the head may
        drain busy models."""
        delay = min(self.settings.waiter_wake_s, waiter.deadline - now)
        dep_id = waiter.deployment_id
        if dep_id in self._queue:
            o = self.settings
            for dep in self._effects.all():
                track = self._tracks.get(dep.id)
                expiry = track and decide.idle_expiry(
                    dep, track, o.idle_timeout_s, decide.evict_after(dep, o.idle_timeout_s, o.evict_idle_s)
                )
                if expiry and expiry > now:
                    delay = min(delay, expiry - now + 0.05)
            joined = self._queue.joined_at(dep_id)
            if o.max_drain_wait_s > 0 and joined is not None and self._queue.is_head(dep_id):
                due = joined + o.max_drain_wait_s
                if due > now:
                    delay = min(delay, due - now + 0.05)
        return max(delay, 0.001)

    # --- start attempts -----------------------------------------------------------------------

    def _ensure_attempt(self, deployment_id: str) -> None:
        """One attempt per deployment, shared by its waiters; it is the controller's own task,
        so a waiter that hangs up never cancels a deployer call half-way."""
        task = self._attempts.get(deployment_id)
        if task is None or task.done():
            self._attempts[deployment_id] = asyncio.create_task(
                self._attempt(deployment_id), name=f"ondemand-attempt-{deployment_id}"
            )

    async def _attempt(self, deployment_id: str) -> None:
        """Decide, do the slow part of the step outside the decision, decide again. An attempt
        that ends wakes nobody by itself: every step that changes what waiters see notifies (a
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
                    until = self.clock() + self.settings.stop_settle_s
                    progress = decide.Progress(stopped_victim=True, settle_until=until)
                elif isinstance(step, decide.Settle):
                    await self.clock.wait(self._changed, min(SETTLE_POLL_S, step.until - self.clock()))
                else:
                    return
        except Exception as exc:
            log.exception("start attempt for %s failed", deployment_id, extra=fields(deployment_id))
            self._metrics.start_failed(deployment_id)
            self._fail_waiters(deployment_id, StartFailed(f"start attempt failed: {exc}"))

    def _decide(self, deployment_id: str, progress: decide.Progress) -> decide.Step:
        """One decision in one plain call (the controller lock): a fresh snapshot, the plan, and
        the synchronous part of its step. Nothing here awaits."""
        step = decide.plan_attempt(self._snapshot(deployment_id, progress))
        match step:
            case decide.Abandon():
                self._leave_queue(deployment_id)
            case decide.Start():
                return self._start(deployment_id, step)
            case decide.Enqueue():
                self._enqueue(deployment_id)
            case decide.MakeRoom(victims) | decide.Drain(victims):  # what they free is the head's
                self._enqueue(deployment_id)
                memory = {dep.id: self._effects.held_gib(dep) for dep in self._effects.all()}
                self._queue.reserve(deployment_id, {v: memory.get(v, 0.0) for v in victims})
            case decide.GiveUp(need, capacity):
                self._fail_waiters(
                    deployment_id,
                    DoesNotFit(texts.does_not_fit(self._name(deployment_id), need, capacity, self._several_devices())),
                )
        return step

    def _snapshot(self, deployment_id: str, progress: decide.Progress) -> decide.AttemptSnapshot:
        dep, others = None, []
        for each in self._effects.all():
            if each.id == deployment_id:
                dep = each
            else:
                others.append(
                    decide.Other(
                        each,
                        self._tracks.get(each.id),
                        self._effects.latest(each.id),
                        self._effects.held_gib(each),
                        self._effects.devices_of(each),
                    )
                )
        budget = self._effects.snapshot(exclude=deployment_id)
        now = self.clock()
        track = self._tracks.get(deployment_id) or Track(idle_since=now)  # removed: none is kept
        return decide.AttemptSnapshot(
            deployment_id=deployment_id,
            dep=dep,
            track=track,
            waiters=len(self._waiters.get(deployment_id, ())),
            now=now,
            queue=tuple(self._queue.ids()),
            head_victims=self._queue.victims_of_head(deployment_id),
            free_gib=budget.free,
            capacity_gib=budget.capacity,
            others=tuple(others),
            last_stop=self._stops.last_stop,
            progress=progress,
            rules=self._rules,
            queued_since=self._queue.joined_at(deployment_id),
            rooms=budget.rooms(),
            need=self._effects.need_of(dep) if dep is not None else None,
        )

    def _start(self, deployment_id: str, step: decide.Start) -> decide.Step:
        """Start or wake through the deployer's check-and-write (it fits: the snapshot said so,
        and nothing ran since)."""
        track = self.track(deployment_id)
        track.started_for_request = True  # before the change, so its published view says so
        try:
            if step.wake:
                self._effects.wake(deployment_id, actor="ondemand")
            else:
                self._effects.restart(deployment_id, actor="ondemand", devices=step.devices)
        except InsufficientMemory:  # a measured budget read differently a moment later
            track.started_for_request = False
            self._enqueue(deployment_id)
            return decide.Enqueue()
        except (Conflict, NotFound):  # the state moved on: waiters look again
            track.started_for_request = False
            return decide.Moot()
        except StoreUnavailable as exc:  # no start while the database cannot be written
            track.started_for_request = False
            self._fail_waiters(deployment_id, StartFailed(f"{self._name(deployment_id)} cannot start: {exc.message}"))
            return decide.Moot()
        self._leave_queue(deployment_id)
        self._metrics.started_for_requests(deployment_id, woke=step.wake)
        self._record(deployment_id, "ondemand_start", texts.STARTED_FOR_REQUEST)
        return step

    def _enqueue(self, deployment_id: str) -> None:
        if self._queue.join(deployment_id, self.clock()):
            self.notify()  # its waiters see it queued and fire their notices
            self._touched(deployment_id)

    def _leave_queue(self, deployment_id: str) -> bool:
        """Take it out of the memory queue; True (and everyone told) if it was in."""
        if not self._queue.leave(deployment_id):
            return False
        self.notify()
        self._touched(deployment_id)
        return True

    async def _make_room(self, deployment_id: str, victims: tuple[str, ...]) -> bool:
        """Stop the victims (each through the precheck); True if any stop was approved. A victim
        the precheck refused frees nothing for the head."""
        text = texts.make_room_stop(self._name(deployment_id))
        results = await asyncio.gather(
            *(self._stops.stop(victim, text, "make_room", self.is_evictable) for victim in victims)
        )
        for victim, approved in zip(victims, results, strict=True):
            if not approved:
                self._queue.unreserve(deployment_id, victim)
        return any(results)

    async def _drain(self, deployment_id: str, victims: tuple[str, ...]) -> bool:
        """Drain ``victims`` for the head ``deployment_id``: they get no new slot (their new
        requests wait, with the queued notice), what they run finishes, then each is stopped
        through its precheck. The drain ends with the attempt: a head that starts, leaves or is
        removed meanwhile lets them serve again. True if any stop was approved."""
        for victim in victims:
            self.track(victim).drained_for = deployment_id
            self._touched(victim)
        self.notify()
        try:
            while True:
                busy = [v for v in victims if (t := self._tracks.get(v)) is not None and t.inflight > 0]
                if not busy:
                    break
                dep = self._effects.peek(deployment_id)
                if (
                    dep is None
                    or not self._waiters.get(deployment_id)
                    or dep.state not in (State.STOPPED, State.FAILED, State.ASLEEP)
                ):
                    return False  # nobody waits any more, or it is starting by other means
                await self.clock.wait(self._changed, self.settings.waiter_wake_s)
            text = texts.drain_stop(self._name(deployment_id))
            owed = {v: (t := self._tracks.get(v)) is not None and t.waiting > 0 for v in victims}
            results = await asyncio.gather(*(self._stops.stop(v, text, "drain", self._drained) for v in victims))
            for victim, approved in zip(victims, results, strict=True):
                if approved and owed[victim] and (track := self._tracks.get(victim)) is not None:
                    track.owed = True  # its waiting requests are served before it is drained again
            return any(results)
        finally:
            for victim in victims:
                track = self._tracks.get(victim)
                if track is not None and track.drained_for == deployment_id:
                    track.drained_for = None
                    self._touched(victim)
            self.notify()  # its waiters look again: at a stopped engine, or at one serving again

    def _fail_waiters(self, deployment_id: str, error: OndemandError) -> None:
        """Every waiter gets its own copy: one instance raised by a thousand waiters would
        collect all their frames in its traceback (and keep them alive)."""
        for waiter in self._waiters.get(deployment_id, ()):
            waiter.error = waiter.error or copy.copy(error)
        if not self._leave_queue(deployment_id):
            self.notify()

    def _several_devices(self) -> bool:
        return len(self._effects.snapshot().rooms()) > 1

    def _name(self, deployment_id: str) -> str:
        dep = self._effects.find(deployment_id)
        return dep.name if dep is not None else deployment_id

    def _record(self, deployment_id: str, action: str, text: str) -> None:
        self._effects.event("ondemand", deployment_id, text)
        self._audit(deployment_id, action, text)

    def _audit(self, deployment_id: str, action: str, text: str) -> None:
        self._effects.audit(action, actor="ondemand", user=None, deployment_id=deployment_id, text=text)

    def _timed_out(self, dep: Deployment) -> None:
        self._record(dep.id, "ondemand_queue_timeout", texts.queue_timeout(self.settings.queue_timeout_s, dep.name))

    def _backoff_message(self, dep: Deployment) -> str:
        left = self.track(dep.id).refused_until - self.clock()
        return f"{dep.name} failed to start; new starts are refused for {left:.0f} s more"

    # --- preload ------------------------------------------------------------------------------

    def preload(self, ids: Collection[str] | None = None) -> list[str]:
        """Start the stopped on-demand deployments marked ``preload`` (those of ``ids``, or all)
        that fit in what is free now, without making room; the others wait for their first
        request, which an event says. Returns the ids started. Afterwards a preloaded model is
        reaped and evicted like any other."""
        deps = [dep for dep in self._effects.all() if ids is None or dep.id in ids]
        plan = decide.preloads(deps, self._effects.snapshot().rooms(), self._effects.need_of)
        started = []
        for dep_id in plan.start:
            try:
                self._effects.restart(dep_id, actor="preload")
            except (InsufficientMemory, Conflict, NotFound, StoreUnavailable) as exc:
                log.warning("preload of %s not started: %s", dep_id, exc, extra=fields(dep_id))
                continue
            started.append(dep_id)
            self._record(dep_id, "ondemand_preload", texts.PRELOADED)
        for dep_id, need in plan.skipped:
            self._effects.event("ondemand", dep_id, texts.not_preloaded(need, self._effects.snapshot().free))
        return started

    # --- stopping (stops.py) -----------------------------------------------------------------

    async def reap_once(self) -> list[str]:
        """Stop every idle on-demand deployment; returns the ids stopped."""
        return await self._stops.reap_once()

    async def run(self) -> None:
        """The reaper, run by the supervisor (a failed pass is logged, recorded and restarted)."""
        while True:
            await asyncio.sleep(self.settings.reaper_interval_s)
            await self.reap_once()

    # --- deployer listener --------------------------------------------------------------------

    def _on_change(self, change: Change) -> None:
        dep, now = change.deployment, self.clock()
        if change.kind == "created":
            self._tracks[dep.id] = Track(idle_since=now, config=dep.config_fingerprint())
        elif change.kind == "removed":
            error: OndemandError = (Stopped if change.old_state is State.STARTING else NoSuchDeployment)(
                f"deployment {dep.name} was removed"
            )
            self._fail_waiters(dep.id, error)
            self._tracks.pop(dep.id, None)
            self._counters.forget(dep.id)
        elif change.kind == "config":
            self._on_config(change, now)
        elif change.kind == "state":
            self._on_state(change, now)
        self.notify()  # (a release frees memory: queued starts look again)
        if change.kind != "removed":
            self._touched(dep.id)

    def _on_config(self, change: Change, now: float) -> None:
        dep, track = change.deployment, self.track(change.deployment.id)
        if dep.config_fingerprint() != track.config:
            track.config = dep.config_fingerprint()
            track.backoff_s = track.refused_until = 0.0
        if change.old is not None and not change.old.is_on_demand and dep.is_on_demand:
            track.idle_since = now

    def _on_state(self, change: Change, now: float) -> None:
        dep, old = change.deployment, change.old_state
        track = self.track(dep.id)
        if dep.state is State.READY:
            track.idle_since = now
            track.started_for_request = False
            track.backoff_s = track.refused_until = 0.0
        elif old is State.STARTING and dep.state is State.FAILED:
            if track.started_for_request:
                self._metrics.start_failed(dep.id)
            track.started_for_request = False
            track.backoff_s = decide.next_backoff(
                track.backoff_s, self.settings.backoff_initial_s, self.settings.backoff_max_s
            )
            track.refused_until = now + track.backoff_s
            reason = dep.state_reason.split("\n")[0]
            self._fail_waiters(dep.id, StartFailed(f"{dep.name} failed to start: {reason}"))
        elif old is State.STARTING and dep.state in (State.STOPPING, State.STOPPED):
            track.started_for_request = False
            self._fail_waiters(dep.id, Stopped(f"{dep.name} was stopped while starting"))

    def shutdown(self) -> None:
        """dgxmm is stopping (SIGTERM): every waiter gets 503 now and no slot is granted any more;
        requests already holding a slot run on. Attempts under way find the deployer refusing."""
        self._shutting_down = True
        for deployment_id in list(self._waiters):
            self._fail_waiters(deployment_id, ShuttingDown("dgxmm is shutting down"))

    def close(self) -> None:
        for task in self._attempts.values():
            task.cancel()
        self._counters.close()
