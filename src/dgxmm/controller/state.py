"""The on-demand controller's state, in one object: ``ControllerState``.

It owns every piece of it (docs/controller.md's state table): the tracks (a ``decide.Track`` per
deployment), the memory queue with the head's reservation, the waiters, the start attempts' tasks,
the grace clock (the last approved on-demand stop), the publish times of the live counters, the
watchers told of each change, and the wake-ups. Nothing is persisted. The controller's parts
(``Controller``, its ``Attempts``, ``Stops``, ``ModeSwitch``) change it only through its methods,
on the event loop's thread.

**Wake-ups are targeted.** A waiter waits on its own wake-up (``Waiter.woken``, cleared before
it reads anything, so a change between its look and its wait is never lost), a settling attempt
on its deployment's (``wakeup(id)``, taken likewise). A slot released under ``max_concurrent``
wakes the one waiter it is handed to. A change wakes who it concerns: ``wake(id)`` the waiters of that deployment
(its record, its track, its queue entry, its error), ``wake_queued()`` those of every queued
deployment (memory freed or taken, a model turned idle, the queue's head or its reservation
changed: what a queued start decides on). Nobody else wakes: a waiter for a starting model sleeps
through every change of the others. ``wake_all()`` remains for a change no event says (tests).
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections import defaultdict
from collections.abc import Callable, Iterable

from dgxmm.controller.counters import CounterPublisher
from dgxmm.controller.decide import Track
from dgxmm.controller.effects import Clock
from dgxmm.controller.errors import OndemandError
from dgxmm.controller.queue import MemoryQueue
from dgxmm.controller.slots import Waiter
from dgxmm.onethread import Owner
from dgxmm.records.deployment import Deployment


class ControllerState:
    def __init__(
        self,
        clock: Clock,
        deps: Iterable[Deployment],
        publish_view: Callable[[str], None],
        counters_publish_s: float,
        queued: Callable[[str, bool], None] = lambda deployment_id, joined: None,
    ) -> None:
        self.owner = Owner("on-demand controller")
        self._clock = clock
        now = clock()
        # Seen for the first time (also after a dgxmm restart): the idle timer starts now.
        self.tracks: dict[str, Track] = {dep.id: Track(idle_since=now, config=dep.config_fingerprint()) for dep in deps}
        self.queue = MemoryQueue()
        # Each deployment's waiters in arrival order (a dict as an ordered set): the line its
        # released slots are handed along (turns.py); ``by_id`` finds one for a cancel.
        self.waiters: dict[str, dict[Waiter, None]] = defaultdict(dict)
        self.by_id: dict[str, Waiter] = {}
        self.total_waiting = 0
        self.attempts: dict[str, asyncio.Task[None]] = {}
        self.last_stop = -math.inf  # the grace clock: when the last approved on-demand stop happened
        self.counters = CounterPublisher(publish_view, counters_publish_s)  # the publish times
        self.watchers: list[Callable[[str], None]] = []
        self.shutting_down = False
        self.version = 0  # counts the changes of tracks and records (what idle expiries are read from)
        self._wakeups: dict[str, asyncio.Event] = {}
        # Told of each join (True) and leave (False) of the memory queue: a wait for room begins
        # or ends (the controller's prefetch of the waiting model's files).
        self._queued = queued

    # --- tracks -------------------------------------------------------------------------------

    def tracked(self, deployment_id: str) -> Track | None:
        return self.tracks.get(deployment_id)

    def track(self, deployment_id: str) -> Track:
        track = self.tracks.get(deployment_id)
        if track is None:
            track = self.tracks[deployment_id] = Track(idle_since=self._clock())
            self.version += 1
        return track

    def created(self, dep: Deployment) -> None:
        self.tracks[dep.id] = Track(idle_since=self._clock(), config=dep.config_fingerprint())
        self.version += 1

    def forget(self, deployment_id: str) -> None:
        """Removed: its track and its publish times go."""
        self.tracks.pop(deployment_id, None)
        self.counters.forget(deployment_id)
        self.version += 1

    def reset_backoff(self, deployment_id: str) -> None:
        """(``modeswitch.Tracks``) New starts are not refused any more."""
        track = self.track(deployment_id)
        track.backoff_s = track.refused_until = 0.0
        self.touched(deployment_id)

    def restart_idle_timer(self, deployment_id: str) -> None:
        """(``modeswitch.Tracks``) The idle timer starts now."""
        self.track(deployment_id).idle_since = self._clock()
        self.touched(deployment_id)

    def touched(self, deployment_id: str, *, counts: bool = False) -> None:
        """Something of ``deployment_id`` a status shows changed; ``counts``: its in-flight or
        waiting count, which the counter publisher pushes on its own."""
        self.version += 1
        if counts:
            self.counters.changed(deployment_id)
        for watcher in self.watchers:
            watcher(deployment_id)

    # --- waiters ------------------------------------------------------------------------------

    def add_waiter(self, waiter: Waiter) -> None:
        self.waiters[waiter.deployment_id][waiter] = None
        self.by_id[waiter.id] = waiter
        self.total_waiting += 1
        self.track(waiter.deployment_id).waiting += 1
        self.touched(waiter.deployment_id, counts=True)

    def remove_waiter(self, waiter: Waiter) -> None:
        """It stopped waiting: served (a slot handed to it, or taken), refused or gone. Once:
        a waiter handed a slot leaves here at the handing, and again in ``acquire``'s end."""
        dep_id = waiter.deployment_id
        line = self.waiters.get(dep_id)
        if line is None or waiter not in line:
            return
        del line[waiter]
        del self.by_id[waiter.id]
        self.total_waiting -= 1
        track = self.tracks.get(dep_id)
        if track is not None:
            track.waiting -= 1
            self.touched(dep_id, counts=True)
        if track is not None and track.waiting == 0 and track.owed:
            track.owed = False  # the requests a drain made wait were served (or left)
        if not self.waiters[dep_id]:
            del self.waiters[dep_id]
            if not self.leave_queue(dep_id):  # the last waiter gave up: so does its queue entry
                self.wake_queued()  # nobody waits for it any more: it may be a victim now

    def fail_waiters(self, deployment_id: str, error: OndemandError) -> None:
        """Every waiter gets its own copy: one instance raised by a thousand waiters would
        collect all their frames in its traceback (and keep them alive)."""
        for waiter in self.waiters.get(deployment_id, ()):
            waiter.error = waiter.error or copy.copy(error)
        if not self.leave_queue(deployment_id):
            self.wake(deployment_id)

    # --- the memory queue ---------------------------------------------------------------------

    def enqueue(self, deployment_id: str) -> None:
        if self.queue.join(deployment_id, self._clock()):
            self.wake(deployment_id)  # its waiters see it queued and fire their notices
            self.touched(deployment_id)
            self._queued(deployment_id, True)

    def leave_queue(self, deployment_id: str) -> bool:
        """Take it out of the memory queue; True (and who it concerns woken) if it was in."""
        was_head = self.queue.is_head(deployment_id)
        if not self.queue.leave(deployment_id):
            return False
        self._queued(deployment_id, False)
        self.wake(deployment_id)
        if was_head:  # a new head, and the reservation is gone: the queue looks again
            self.wake_queued()
        self.touched(deployment_id)
        return True

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
        self.owner.check()
        event = self._wakeups.pop(deployment_id, None)
        if event is not None:
            event.set()
        for waiter in self.waiters.get(deployment_id, ()):
            waiter.woken.set()

    def wake_queued(self) -> None:
        """Wake the waiters of every queued deployment: what a queued start decides on changed."""
        for deployment_id in self.queue.ids():
            self.wake(deployment_id)

    def wake_all(self) -> None:
        """Wake every waiter and settling attempt."""
        self.owner.check()
        events, self._wakeups = self._wakeups, {}
        for event in events.values():
            event.set()
        for waiter in self.by_id.values():
            waiter.woken.set()
