"""The on-demand controller's state and its one writer: ``ControllerState``.

It owns every piece of it (docs/controller.md's state table): the tracks (a frozen
``decide.Track`` per deployment, replaced whole on each change), the memory queue with the head's
reservation, the waiters and what each was handed, the start attempts' tasks, the grace clock (the
last approved on-demand stop), the publish times of the live counters, the watchers told of each
change, and the wake-ups. Nothing is persisted. Its fields are private: its methods, named for
what happened (``grant``, ``release``, ``drain``, ``stop_approved``, ...), are the only writers,
on the event loop's thread; everyone else reads a frozen view (``tracks``, ``queue``, ``waiters``:
read-only types over frozen tracks). tests/unit/test_controller_owner.py checks that no other
module assigns any of it.

**No listener inside a decision.** A decision (``deciding()``: an attempt's step, a preload, a
mode switch) may change the ledger itself (a restart marks the deployment starting), and the
ledger tells its listeners at once. The controller's listener only posts the change here
(``hear``); one heard while deciding waits until the outermost decision ends, then every change
heard is applied in order, so a decision never runs the controller's own listener half-way.

**Wake-ups are targeted.** A waiter waits on its own wake-up (``Waiter.woken``, cleared before
it reads anything, so a change between its look and its wait is never lost), a settling attempt
on its deployment's (``wakeup(id)``, taken likewise). A slot released under ``max_concurrent``
wakes the one waiter it is handed to. A change wakes who it concerns: ``wake(id)`` the waiters of
that deployment (its record, its track, its queue entry, its error), ``wake_queued()`` those of
every queued deployment, only for what a queued start decides on (``onchange.concerns_queue``: memory
held, freed or taken, a model turned idle, the queue's head or its reservation changed). Nobody
else wakes: a waiter for a starting model sleeps through every change of the others.
``wake_all()`` remains for a change no event says (tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import math
import time
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Collection, Coroutine, Iterable, Iterator, Mapping
from typing import Any

from dgxmm.controller import priority
from dgxmm.controller.counters import CounterPublisher
from dgxmm.controller.decide import OomRetry, Track
from dgxmm.controller.effects import Clock
from dgxmm.controller.errors import OndemandError
from dgxmm.controller.queue import MemoryQueue, QueueView
from dgxmm.controller.slots import Slot, Waiter
from dgxmm.onethread import Owner
from dgxmm.records.changes import Change
from dgxmm.records.deployment import Deployment


class ControllerState:
    def __init__(
        self,
        clock: Clock,
        deps: Iterable[Deployment],
        publish_view: Callable[[str], None],
        counters_publish_s: float,
        queued: Callable[[str, bool], None] = lambda deployment_id, joined: None,
        apply: Callable[[ControllerState, Change], None] = lambda state, change: None,
        aging_s: float = 0.0,
    ) -> None:
        self._owner = Owner("on-demand controller")
        self._clock = clock
        now = clock()
        # Seen for the first time (also after a dgxmm restart): the idle timer starts now.
        self._tracks: dict[str, Track] = {
            dep.id: Track(idle_since=now, config=dep.config_fingerprint()) for dep in deps
        }
        self._aging_s = aging_s  # a waiter's priority rises by one per this many seconds waited
        # Each deployment's waiters in arrival order (a dict as an ordered set): the line its
        # released slots are handed along (turns.py, in ``line``'s order); ``by_id`` finds one
        # for a cancel; ``_priorities`` counts their priorities (the best one ranks the model in
        # the memory queue).
        self._waiters: dict[str, dict[Waiter, None]] = defaultdict(dict)
        self._priorities: dict[str, Counter[int]] = defaultdict(Counter)
        self._queue = MemoryQueue(self.best_priority, clock, aging_s)
        self._by_id: dict[str, Waiter] = {}
        self._total_waiting = 0
        self._attempts: dict[str, asyncio.Task[None]] = {}
        self._last_stop = -math.inf  # the grace clock: when the last approved on-demand stop happened
        self._counters = CounterPublisher(publish_view, counters_publish_s)  # the publish times
        self._watchers: list[Callable[[str], None]] = []
        self._shutting_down = False
        self._version = 0  # counts the changes of tracks and records (what idle expiries are read from)
        self._wakeups: dict[str, asyncio.Event] = {}
        # Told of each join (True) and leave (False) of the memory queue: a wait for room begins
        # or ends (the controller's prefetch of the waiting model's files).
        self._queued = queued
        self._apply = apply  # what a heard change does (``onchange.OnChange``)
        self._heard: deque[Change] = deque()
        self._deciding = 0  # nested decisions (and the applying of heard changes) under way

    # --- the frozen view ----------------------------------------------------------------------

    @property
    def tracks(self) -> Mapping[str, Track]:
        return self._tracks

    @property
    def queue(self) -> QueueView:
        return self._queue

    @property
    def waiters(self) -> Mapping[str, Collection[Waiter]]:
        """Each deployment's waiters, in arrival order."""
        return self._waiters

    @property
    def by_id(self) -> Mapping[str, Waiter]:
        return self._by_id

    @property
    def total_waiting(self) -> int:
        return self._total_waiting

    @property
    def attempts(self) -> Mapping[str, asyncio.Task[None]]:
        return self._attempts

    @property
    def last_stop(self) -> float:
        return self._last_stop

    @property
    def shutting_down(self) -> bool:
        return self._shutting_down

    @property
    def version(self) -> int:
        return self._version

    def tracked(self, deployment_id: str) -> Track | None:
        return self._tracks.get(deployment_id)

    def best_priority(self, deployment_id: str) -> int:
        """The highest priority among the deployment's waiters (0 when none waits)."""
        counts = self._priorities.get(deployment_id)
        return max(counts) if counts else 0

    def line(self, deployment_id: str) -> Collection[Waiter]:
        """The deployment's waiters in the order they are served (``priority.line``): arrival
        order when their priorities are equal (the effective ones then fall in that order), the
        line itself then, not a copy (a release walks only its first few)."""
        line = self._waiters.get(deployment_id, {})
        if len(self._priorities.get(deployment_id, ())) < 2:
            return line
        waiters = list(line)
        order = priority.line([(w.priority, w.arrival) for w in waiters], self._clock(), self._aging_s)
        return [waiters[i] for i in order]

    # --- heard changes, and decisions -----------------------------------------------------------

    @contextlib.contextmanager
    def deciding(self) -> Iterator[None]:
        """A decision runs inside: a change of the ledger heard meanwhile (its own restart's) is
        applied after the outermost decision ends, not inside it."""
        self._deciding += 1
        try:
            yield
        finally:
            self._deciding -= 1
            self._apply_heard()

    def hear(self, change: Change) -> None:
        """The ledger changed (the controller's listener posts each change here)."""
        self._heard.append(change)
        self._apply_heard()

    def _apply_heard(self) -> None:
        """Apply the changes heard, in order, unless a decision (or this) is under way: a change
        heard while one is applied waits its turn behind the others."""
        if self._deciding:
            return
        self._deciding += 1
        try:
            while self._heard:
                self._apply(self, self._heard.popleft())
        finally:
            self._deciding -= 1

    # --- tracks -------------------------------------------------------------------------------

    def track(self, deployment_id: str) -> Track:
        """Its track, made now (its idle timer starting) when it has none."""
        track = self._tracks.get(deployment_id)
        if track is None:
            track = self._tracks[deployment_id] = Track(idle_since=self._clock())
            self._version += 1
        return track

    def _set(self, deployment_id: str, **changes: Any) -> Track:
        return self._put(deployment_id, self.track(deployment_id), **changes)

    def _put(self, deployment_id: str, track: Track, **changes: Any) -> Track:
        """Its track replaced by a copy of ``track`` with ``changes``. The copy is a new object
        filled past the frozen ``__setattr__`` (the one that is shared is never changed):
        ``dataclasses.replace`` goes through ``__init__`` and costs ten times as much, twice on
        every request."""
        new = object.__new__(Track)
        new.__dict__.update(track.__dict__, **changes)
        self._tracks[deployment_id] = new
        return new

    def created(self, dep: Deployment) -> None:
        self._tracks[dep.id] = Track(idle_since=self._clock(), config=dep.config_fingerprint())
        self._version += 1

    def forget(self, deployment_id: str) -> None:
        """Removed: its track and its publish times go."""
        self._tracks.pop(deployment_id, None)
        self._counters.forget(deployment_id)
        self._version += 1

    def reconfigured(self, dep: Deployment, old: Deployment | None) -> None:
        """Its config changed: a new config is a fresh start (no backoff); switched to on demand,
        its idle timer starts now."""
        track = self.track(dep.id)
        if dep.config_fingerprint() != track.config:
            track = self._set(dep.id, config=dep.config_fingerprint(), backoff_s=0.0, refused_until=0.0)
        if old is not None and not old.is_on_demand and dep.is_on_demand:
            self._set(dep.id, idle_since=self._clock())

    def became_ready(self, deployment_id: str) -> None:
        """Ready: idle from now, its start done, its backoff over."""
        done = {"started_for_request": False, "backoff_s": 0.0, "refused_until": 0.0, "oom": OomRetry.NONE}
        self._set(deployment_id, idle_since=self._clock(), **done)

    def start_failed(self, deployment_id: str, backoff_s: float) -> None:
        """Its start failed: new starts are refused for ``backoff_s`` (its retry for memory is spent)."""
        until = self._clock() + backoff_s
        self._set(deployment_id, started_for_request=False, backoff_s=backoff_s, refused_until=until, oom=OomRetry.NONE)

    def oom_retry(self, deployment_id: str, stage: OomRetry) -> None:
        """Its one retry after a start that ran out of memory is at ``stage`` (oomretry.py)."""
        self._set(deployment_id, oom=stage)

    def mark_started(self, deployment_id: str, by_request: bool) -> None:
        """Whether its current start is the controller's (set before the start's change, so its
        published view says so)."""
        self._set(deployment_id, started_for_request=by_request)

    def reset_backoff(self, deployment_id: str) -> None:
        """(``modeswitch.Tracks``) New starts are not refused any more."""
        self._set(deployment_id, backoff_s=0.0, refused_until=0.0)
        self.touched(deployment_id)

    def restart_idle_timer(self, deployment_id: str) -> None:
        """(``modeswitch.Tracks``) The idle timer starts now."""
        self._set(deployment_id, idle_since=self._clock())
        self.touched(deployment_id)

    def touched(self, deployment_id: str, *, counts: bool = False) -> None:
        """Something of ``deployment_id`` a status shows changed; ``counts``: its in-flight or
        waiting count, which the counter publisher pushes on its own."""
        self._version += 1
        if counts:
            self._counters.changed(deployment_id)
        for watcher in self._watchers:
            watcher(deployment_id)

    def add_watcher(self, watcher: Callable[[str], None]) -> None:
        self._watchers.append(watcher)

    def status_changed(self, deployment_id: str) -> None:
        """Publish its view as a change of its counts would (at most once a second with them)."""
        self._counters.changed(deployment_id)

    # --- slots --------------------------------------------------------------------------------

    def grant(self, deployment_id: str, on_release: Callable[[str], None], *, cold: bool = False) -> Slot:
        """One more request in flight: its idle timer restarts, its last request is now."""
        self._owner.check()
        track = self.track(deployment_id)
        # A new busy period: the last idle period's keep_alive (a caller's, the Ollama API) is done.
        kept = track.keep_alive_s if track.inflight else None
        self._put(
            deployment_id,
            track,
            inflight=track.inflight + 1,
            idle_since=self._clock(),
            last_request_at=time.time(),
            keep_alive_s=kept,
        )
        self.touched(deployment_id, counts=True)
        return Slot(deployment_id, on_release, cold=cold)

    def keep_alive(self, deployment_id: str, seconds: float) -> None:
        """A caller's keep_alive (``decide.kept_alive``): the idle timeout of the coming idle period."""
        self._owner.check()
        track = self._tracks.get(deployment_id)
        if track is not None:
            self._put(deployment_id, track, keep_alive_s=seconds)
            self.touched(deployment_id)

    def release(self, deployment_id: str) -> Track | None:
        """A request ended: its track after it (None when removed while the request ran)."""
        self._owner.check()
        track = self._tracks.get(deployment_id)
        if track is None:
            return None
        track = self._put(deployment_id, track, inflight=track.inflight - 1, idle_since=self._clock())
        self.touched(deployment_id, counts=True)
        return track

    def hand(self, waiter: Waiter, slot: Slot) -> None:
        """``slot`` is the waiter's: it leaves the line at once and alone is woken."""
        waiter.slot = slot
        self.remove_waiter(waiter)
        waiter.woken.set()

    # --- waiters ------------------------------------------------------------------------------

    def add_waiter(self, waiter: Waiter) -> None:
        self._waiters[waiter.deployment_id][waiter] = None
        self._by_id[waiter.id] = waiter
        self._total_waiting += 1
        self._priorities[waiter.deployment_id][waiter.priority] += 1
        track = self.track(waiter.deployment_id)
        self._set(waiter.deployment_id, waiting=track.waiting + 1)
        self.touched(waiter.deployment_id, counts=True)

    def remove_waiter(self, waiter: Waiter) -> None:
        """It stopped waiting: served (a slot handed to it, or taken), refused or gone. Once:
        a waiter handed a slot leaves here at the handing, and again in ``acquire``'s end."""
        dep_id = waiter.deployment_id
        line = self._waiters.get(dep_id)
        if line is None or waiter not in line:
            return
        del line[waiter]
        del self._by_id[waiter.id]
        self._total_waiting -= 1
        counts = self._priorities[dep_id]
        counts[waiter.priority] -= 1
        if not counts[waiter.priority]:
            del counts[waiter.priority]
        track = self._tracks.get(dep_id)
        if track is not None:
            # the requests a drain made wait were served (or left): it owes nothing any more
            owed = track.owed and track.waiting > 1
            self._set(dep_id, waiting=track.waiting - 1, owed=owed)
            self.touched(dep_id, counts=True)
        if not self._waiters[dep_id]:
            del self._waiters[dep_id]
            del self._priorities[dep_id]
            if not self.leave_queue(dep_id):  # the last waiter gave up: so does its queue entry
                self.wake_queued()  # nobody waits for it any more: it may be a victim now

    def saw_cold(self, waiter: Waiter) -> None:
        """The waiter saw its model not ready: it waits for a start, not only for its turn."""
        waiter.cold = True

    def first_queued(self, waiter: Waiter) -> bool:
        """True the first time the waiter waits for memory (its queued notice fires once)."""
        if waiter.queued_fired:
            return False
        waiter.queued_fired = True
        return True

    def cancel(self, waiter: Waiter, error: OndemandError) -> None:
        """An administrator ended the wait: the waiter alone wakes, to ``error``."""
        waiter.error = error
        waiter.woken.set()  # (the cancelled waiter answers now, not at its next timer)

    def fail_waiters(self, deployment_id: str, error: OndemandError) -> None:
        """Every waiter gets its own copy: one instance raised by a thousand waiters would
        collect all their frames in its traceback (and keep them alive)."""
        for waiter in self._waiters.get(deployment_id, ()):
            waiter.error = waiter.error or copy.copy(error)
        if not self.leave_queue(deployment_id):
            self.wake(deployment_id)

    def shut_down(self, error: OndemandError) -> None:
        """No slot is granted any more; every waiter gets ``error``."""
        self._shutting_down = True
        for deployment_id in list(self._waiters):
            self.fail_waiters(deployment_id, error)

    # --- attempts, the memory queue, drains, the grace clock ----------------------------------

    def ensure_attempt(self, deployment_id: str, attempt: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """One attempt task per deployment, shared by its waiters."""
        task = self._attempts.get(deployment_id)
        if task is None or task.done():
            self._attempts[deployment_id] = asyncio.create_task(attempt(), name=f"ondemand-attempt-{deployment_id}")

    def enqueue(self, deployment_id: str) -> None:
        if self._queue.join(deployment_id, self._clock()):
            self.wake(deployment_id)  # its waiters see it queued and fire their notices
            self.touched(deployment_id)
            self._queued(deployment_id, True)

    def leave_queue(self, deployment_id: str) -> bool:
        """Take it out of the memory queue; True (and who it concerns woken) if it was in."""
        was_head = self._queue.is_head(deployment_id)
        if not self._queue.leave(deployment_id):
            return False
        self._queued(deployment_id, False)
        self.wake(deployment_id)
        if was_head:  # a new head, and the reservation is gone: the queue looks again
            self.wake_queued()
        self.touched(deployment_id)
        return True

    def reserve(self, head: str, victims: dict[str, float]) -> None:
        """What ``victims`` free (id -> GiB) is ``head``'s."""
        self._queue.reserve(head, victims)

    def unreserve(self, head: str, victim: str) -> None:
        """The victim's stop was refused: it frees nothing for ``head``."""
        self._queue.unreserve(head, victim)

    def drain(self, victim: str, head: str) -> None:
        """No new slot for ``victim`` until the drain for ``head`` ends: its waiters queue."""
        self._set(victim, drained_for=head)
        self.touched(victim)
        self.wake(victim)

    def undrain(self, victim: str, head: str) -> None:
        """The drain for ``head`` ended: ``victim`` serves again (if still drained for it)."""
        track = self._tracks.get(victim)
        if track is not None and track.drained_for == head:
            self._set(victim, drained_for=None)
            self.touched(victim)
        self.wake(victim)  # its waiters look again: at a stopped engine, or at one serving again

    def owe(self, victim: str) -> None:
        """Stopped by a drain with requests waiting: they are served before it is drained again."""
        if victim in self._tracks:
            self._set(victim, owed=True)

    def stop_approved(self) -> None:
        """(``stops.GraceClock``) An on-demand stop was approved now."""
        self._last_stop = self._clock()

    def close(self) -> None:
        for task in self._attempts.values():
            task.cancel()
        self._counters.close()

    # --- wake-ups -----------------------------------------------------------------------------

    def wakeup(self, deployment_id: str) -> asyncio.Event:
        """The event the next change concerning ``deployment_id``'s waiters sets (its settling
        attempt waits on it; each waiter on its own ``woken``, which ``wake`` sets too)."""
        event = self._wakeups.get(deployment_id)
        if event is None:
            event = self._wakeups[deployment_id] = asyncio.Event()
        return event

    def wake(self, deployment_id: str) -> None:
        """Wake the waiters (and the attempt) of ``deployment_id``: something of it changed."""
        self._owner.check()
        event = self._wakeups.pop(deployment_id, None)
        if event is not None:
            event.set()
        for waiter in self._waiters.get(deployment_id, ()):
            waiter.woken.set()

    def wake_queued(self) -> None:
        """Wake the waiters of every queued deployment: what a queued start decides on changed."""
        for deployment_id in self._queue.ids():
            self.wake(deployment_id)

    def wake_all(self) -> None:
        """Wake every waiter and settling attempt."""
        self._owner.check()
        events, self._wakeups = self._wakeups, {}
        for event in events.values():
            event.set()
        for waiter in self._by_id.values():
            waiter.woken.set()
