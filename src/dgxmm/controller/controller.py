"""The on-demand controller (``ctx.ondemand``): slots, shared starts, make-room, queue, reaper.

Its state (tracks, the memory queue with the head's reservation, the waiters, the start attempts,
the grace clock, the counters' publish times, the wake-ups) is one object's, ``ControllerState``
(state.py), and only its methods write it; nothing is persisted (docs/controller.md lists every
piece, its owner and the invariants tests check). This module hands out slots and runs each
waiter's loop; ``OnChange`` (onchange.py) applies the deployer's changes, ``Attempts``
(attempts.py) decides and starts, ``Stops`` stops, ``ModeSwitch`` switches, each writing the
state only through its owner's named methods.

Every decision is one plain method call (``Attempts._decide``): a fresh snapshot,
``decide.plan_attempt`` and the synchronous part of the step. A plain call cannot await, so
nothing else runs during it: that is the controller lock, held only while deciding. The ledger's
changes the decision itself makes (its restart's) are heard but applied after it
(``ControllerState.deciding``). The slow parts (the victims' stops, the wait for freed memory)
run afterwards in the attempt task, which then decides again.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from dgxmm.controller import decide, phase, preloads, texts, turns
from dgxmm.controller.attempts import Attempts, record
from dgxmm.controller.decide import Action, Track
from dgxmm.controller.effects import Clock, Effects, MonotonicClock, Report, Unreported
from dgxmm.controller.errors import (
    NoSuchDeployment,
    NotOnDemand,
    OndemandError,
    QueueFull,
    QueueTimeout,
    ShuttingDown,
    StartFailed,
)
from dgxmm.controller.modeswitch import ModeSwitch
from dgxmm.controller.onchange import OnChange
from dgxmm.controller.slots import Slot, Waiter
from dgxmm.controller.state import ControllerState
from dgxmm.controller.stops import Stops
from dgxmm.controller.waiting import WaitingList
from dgxmm.deploy.budget import InsufficientMemory
from dgxmm.errors import Conflict, NotFound, StoreUnavailable
from dgxmm.logs import fields
from dgxmm.records.deployment import Deployment, Mode, Role, State
from dgxmm.settings import OndemandSettings

SLEEP_DRAIN = "(sleep)"  # the drain of a deployment a sleep waits for (no queue head is named so)

log = logging.getLogger(__name__)


class Controller:
    def __init__(
        self,
        settings: OndemandSettings,
        effects: Effects,
        publish_view: Callable[[str], None],
        clock: Clock | None = None,
        report: Report | None = None,
    ) -> None:
        self.settings = settings
        self._effects = effects
        self._metrics = report if report is not None else Unreported()
        self.clock: Clock = clock or MonotonicClock()
        self.state = ControllerState(
            self.clock,
            effects.all(),
            publish_view,
            settings.counters_publish_s,
            queued=lambda dep_id, joined: (effects.prefetch if joined else effects.prefetch_done)(dep_id),
            apply=OnChange(settings, self._metrics, self.preload),
            aging_s=settings.priority_aging_s,
        )
        self._modes = ModeSwitch(effects, self.state)
        self._stops = Stops(settings, effects, self.is_idle, self.clock, self._metrics, self._audit, self.state)
        self._attempts = Attempts(
            settings, self.state, effects, self.clock, self._metrics, self._stops, self.is_evictable
        )
        self._expiries: tuple[int, list[float]] = (-1, [])  # (state version, sorted victim expiries)
        self._waiting = WaitingList(self.state, effects.peek, self.clock)
        effects.add_listener(self.state.hear)
        effects.add_idle_listener(self._on_idle_sample)

    # --- reading ------------------------------------------------------------------------------

    def tracked(self, deployment_id: str) -> Track | None:
        """What the controller knows of a deployment, for readers; never creates a track."""
        return self.state.tracked(deployment_id)

    def track(self, deployment_id: str) -> Track:
        return self.state.track(deployment_id)

    async def set_mode(
        self, deployment_id: str, mode: Mode, idle_timeout_s: float | None, *, user: str | None
    ) -> Deployment:
        """Switch between always on and on demand (modeswitch.py)."""
        return self._modes.set_mode(deployment_id, mode, idle_timeout_s, user=user)

    def status(self, deployment_id: str) -> dict[str, Any]:
        track = self.state.tracks.get(deployment_id)
        dep = self._effects.peek(deployment_id)
        return {
            "inflight": track.inflight if track else 0,
            "queued": track.waiting if track else 0,
            "last_request_at": track.last_request_at if track else None,
            "phase": phase.phase(dep, track, deployment_id in self.state.queue).value,
        }

    def add_watcher(self, watcher: Callable[[str], None]) -> None:
        """Hear, synchronously, the id of every deployment whose on-demand facts changed: its
        counts, its place in the memory queue, its idle timer or its start backoff (the live
        status follows phases through this instead of looking at every deployment in turns)."""
        self.state.add_watcher(watcher)

    def status_changed(self, deployment_id: str) -> None:
        """Something a view shows changed besides the counts (a change of phase the live status
        saw): publish it like a change of the counts, at most once a second together with them."""
        self.state.status_changed(deployment_id)

    def waiting(self, deployment_id: str | None = None) -> list[dict[str, Any]]:
        """The requests waiting now, oldest first, and what each waits for (waiting.py)."""
        return self._waiting.rows(deployment_id)

    def cancel(self, waiter_id: str) -> str | None:
        """End a waiting request with 503 ``ondemand_cancelled``; its deployment's id, or None
        when no request of that id waits (unknown, or served already)."""
        waiter = self._waiting.cancel(waiter_id)
        return None if waiter is None else waiter.deployment_id

    @property
    def total_waiting(self) -> int:
        return self.state.total_waiting

    def queue_ids(self) -> list[str]:
        return self.state.queue.ids()

    def stopped_for(self, deployment_id: str) -> tuple[str, ...]:
        """The deployments make-room (or a drain) stopped for a queued deployment, whose memory
        is reserved for it until it starts."""
        return self.state.queue.victims_of(deployment_id)

    def is_idle(self, dep: Deployment) -> bool:
        """The reaper's rule (``decide.is_idle``) on the controller's own state; also the precheck
        of the reaper's stops."""
        return decide.is_idle(
            dep,
            self.state.tracks.get(dep.id),
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
            self.state.tracks.get(dep.id),
            self._effects.latest(dep.id),
            self.clock(),
            default_timeout_s=self.settings.idle_timeout_s,
            max_sample_age_s=self.settings.metrics_max_age_s,
            idle_for_s=decide.evict_after(dep, self.settings.idle_timeout_s, self.settings.evict_idle_s),
        )

    def _is_drained(self, deployment_id: str) -> bool:
        track = self.state.tracks.get(deployment_id)
        return track is not None and track.drained_for is not None

    # --- slots --------------------------------------------------------------------------------

    def try_slot(self, deployment_id: str) -> Slot | None:
        """A slot at once if the deployment is ready and its turn is free, as ``acquire`` would
        grant it; else None."""
        dep = self._effects.peek(deployment_id)
        if dep is None or dep.role is Role.DECIDER or self.state.shutting_down:
            return None
        if not self._takes_at_once(dep):
            return None
        return self._grant(deployment_id)

    def _takes_at_once(self, dep: Deployment) -> bool:
        """Ready, not drained, a slot free under its ``max_concurrent`` and nobody waiting
        before this request (``turns.takes_at_once``)."""
        if dep.state is not State.READY:
            return False
        track = self.state.tracks.get(dep.id)
        if track is None:  # nothing in flight, nobody waiting
            return True
        if track.drained_for is not None:
            return False
        return turns.takes_at_once(dep.max_concurrent, track.inflight, len(self.state.waiters.get(dep.id, ())))

    async def acquire(
        self,
        deployment_id: str,
        on_queued: Callable[[], None] | None = None,
        arrival: float | None = None,
        request_id: str = "",
        priority: int = 0,
    ) -> Slot:
        """A slot for one request, or one of the named errors. ``arrival`` (this clock) starts the
        deadline, so a cold start (or a wait for its turn) counts against the queue timeout;
        ``priority`` (priority.py) orders its lines."""
        if self.state.shutting_down:
            raise ShuttingDown("dgxmm is shutting down")
        dep = self._effects.peek(deployment_id)
        if dep is None:
            raise NoSuchDeployment(f"no deployment {deployment_id}")
        if dep.role is Role.DECIDER:
            raise NotOnDemand(f"{dep.name} is the decision model")
        if self._takes_at_once(dep):
            return self._grant(deployment_id)
        if self.state.total_waiting >= self.settings.max_queued:
            raise QueueFull(f"{self.state.total_waiting} requests are already waiting")
        start = self.clock() if arrival is None else arrival
        since = time.time() - (self.clock() - start)
        deadline = start + self.settings.queue_timeout_s
        waiter = Waiter(deployment_id, deadline, on_queued, request_id, since, priority=priority, arrival=start)
        self.state.add_waiter(waiter)
        outcome = "gone"
        try:
            slot = await self._wait(waiter)
            outcome = "granted"
            return slot
        except OndemandError:
            outcome = "refused"
            raise
        finally:
            self.state.remove_waiter(waiter)
            if outcome != "granted" and waiter.slot is not None:
                waiter.slot.release()  # handed to it as it went: the next in line gets it
            self._metrics.waited(deployment_id, self.clock() - start, outcome)

    async def _wait(self, waiter: Waiter) -> Slot:
        dep_id = waiter.deployment_id
        state = self.state
        while True:
            # Cleared before anything is read: a change from here on (of its deployment, or a
            # slot handed to it) sets it again and ends the wait below, so a wake-up between
            # this look and the wait is never lost.
            waiter.woken.clear()
            if waiter.error is not None:
                raise waiter.error
            if waiter.slot is not None:
                return waiter.slot
            dep = self._effects.peek(dep_id)
            if dep is None:
                raise NoSuchDeployment(f"deployment {dep_id} was removed")
            now = self.clock()
            action = decide.next_action(dep, state.track(dep_id), now)
            if action is Action.GRANT:
                self._hand_out(dep_id)  # the free slots go to the longest waiters: maybe not this one
                if waiter.slot is not None:
                    return waiter.slot
            else:
                self.state.saw_cold(waiter)
            if action is Action.REFUSE:
                raise StartFailed(self._backoff_message(dep))
            if now >= waiter.deadline:
                self._timed_out(dep)
                raise QueueTimeout(f"no slot for {dep.name} within {self.settings.queue_timeout_s:g} s")
            if action in (Action.START, Action.WAKE):
                self._attempts.ensure(dep_id)
            if dep_id in state.queue or self._is_drained(dep_id):  # a drained model's requests queue
                self._fire_queued(waiter)
            await self.clock.wait(waiter.woken, self._wake_in(waiter, now))

    def _grant(self, deployment_id: str, *, cold: bool = False) -> Slot:
        return self.state.grant(deployment_id, self._release, cold=cold)

    def _hand_out(self, deployment_id: str) -> None:
        """Hand the slots free now (``turns.handed``) to the first waiters of a ready deployment's
        line (``ControllerState.line``: by priority, then arrival), and wake each of them alone. In the same plain call as a
        release, so a newcomer at that moment finds the slot taken. A waiter handed a slot
        leaves the line at once (the counts drop); if it is gone before it resumes, ``acquire``
        releases the slot to the next."""
        dep = self._effects.peek(deployment_id)
        track = self.state.tracks.get(deployment_id)
        if dep is None or track is None or dep.state is not State.READY or dep.role is Role.DECIDER:
            return
        if track.drained_for is not None or self.state.shutting_down:
            return
        waiters = self.state.line(deployment_id)
        count = turns.handed(dep.max_concurrent, track.inflight, len(waiters))
        chosen: list[Waiter] = []
        for waiter in waiters:  # the line's order; one refused already is leaving
            if len(chosen) >= count:
                break
            if waiter.error is None and waiter.slot is None:
                chosen.append(waiter)
        for waiter in chosen:
            self.state.hand(waiter, self._grant(deployment_id, cold=waiter.cold))

    def _release(self, deployment_id: str) -> None:
        track = self.state.release(deployment_id)
        if track is None:  # removed while the request ran
            return
        if deployment_id in self.state.waiters:
            self._hand_out(deployment_id)  # to the longest waiter, before anyone else looks
        if track.drained_for is not None and track.inflight == 0:
            self.state.wake(deployment_id)  # a sleep's drain waits for this last release
        if track.inflight == 0 and len(self.state.queue):
            # Queued waiters time their next look by this model's idle expiry; a drain's head
            # waits for its victims' last release.
            self.state.wake_queued()

    def _on_idle_sample(self, deployment_id: str) -> None:
        """An engine's metrics turned idle: a queued start waiting for it as a victim (make-room
        needs a fresh idle sample, not only no slot in flight) looks again now, not at its next
        ``waiter_wake_s``."""
        track = self.state.tracks.get(deployment_id)
        if track is not None and track.inflight == 0 and len(self.state.queue):
            self.state.wake_queued()

    def _fire_queued(self, waiter: Waiter) -> None:
        """The queued notice hook: once per request, the first time it waits for memory."""
        if not self.state.first_queued(waiter):
            return
        self._metrics.queued(waiter.deployment_id)
        if waiter.on_queued is not None:
            try:
                waiter.on_queued()
            except Exception:
                log.exception("on_queued callback failed")

    def notify(self) -> None:
        """Wake every waiter and settling attempt, whatever they wait for (a change no event
        says; every change the controller hears wakes only those it concerns)."""
        self.state.wake_all()

    def _wake_in(self, waiter: Waiter, now: float) -> float:
        """At most ``waiter_wake_s``, sooner at the deadline, when a model may become a victim
        (its ``evict_after`` runs out: a queued request must look again) and when the head may
        drain busy models."""
        delay = min(self.settings.waiter_wake_s, waiter.deadline - now)
        dep_id = waiter.deployment_id
        queue = self.state.queue
        if dep_id in queue:
            expiries = self._victim_expiries()
            at = bisect.bisect_right(expiries, now)
            if at < len(expiries):
                delay = min(delay, expiries[at] - now + 0.05)
            joined = queue.joined_at(dep_id)
            o = self.settings
            if o.max_drain_wait_s > 0 and joined is not None and queue.is_head(dep_id):
                due = joined + o.max_drain_wait_s
                if due > now:
                    delay = min(delay, due - now + 0.05)
        return max(delay, 0.001)

    def _victim_expiries(self) -> list[float]:
        """When each deployment may become a victim, sorted: read once per change of the tracks
        or records (``ControllerState.version``), not once per waiter."""
        version, expiries = self._expiries
        if version != self.state.version:
            o, tracks = self.settings, self.state.tracks
            expiries = []
            for dep in self._effects.all():
                track = tracks.get(dep.id)
                expiry = track and decide.idle_expiry(
                    dep, track, o.idle_timeout_s, decide.evict_after(dep, o.idle_timeout_s, o.evict_idle_s)
                )
                if expiry:
                    expiries.append(expiry)
            expiries.sort()
            self._expiries = (self.state.version, expiries)
        return expiries

    def _audit(self, deployment_id: str, action: str, text: str) -> None:
        self._effects.audit(action, actor="ondemand", user=None, deployment_id=deployment_id, text=text)

    def _timed_out(self, dep: Deployment) -> None:
        text = texts.queue_timeout(self.settings.queue_timeout_s, dep.name)
        record(self._effects, dep.id, "ondemand_queue_timeout", text)

    def _backoff_message(self, dep: Deployment) -> str:
        left = self.state.track(dep.id).refused_until - self.clock()
        return f"{dep.name} failed to start; new starts are refused for {left:.0f} s more"

    # --- preload ------------------------------------------------------------------------------

    def preload(self, ids: Collection[str] | None = None) -> list[str]:
        """Start the stopped on-demand deployments marked ``preload`` (those of ``ids``, or all)
        that fit in what is free now, without making room; the others wait for their first
        request, which an event says. Returns the ids started. Afterwards a preloaded model is
        reaped and evicted like any other."""
        deps = [dep for dep in self._effects.all() if ids is None or dep.id in ids]
        plan = preloads.preloads(deps, self._effects.snapshot().rooms(), self._effects.need_of)
        started = []
        with self.state.deciding():  # (the starts' changes are applied after the last one)
            for dep_id in plan.start:
                try:
                    self._effects.restart(dep_id, actor="preload")
                except (InsufficientMemory, Conflict, NotFound, StoreUnavailable) as exc:
                    log.warning("preload of %s not started: %s", dep_id, exc, extra=fields(dep_id))
                    continue
                started.append(dep_id)
                record(self._effects, dep_id, "ondemand_preload", texts.PRELOADED)
        for dep_id, need in plan.skipped:
            self._effects.event("ondemand", dep_id, texts.not_preloaded(need, self._effects.snapshot().free))
        return started

    # --- stopping (stops.py) -----------------------------------------------------------------

    async def reap_once(self) -> list[str]:
        """Stop every idle on-demand deployment; returns the ids stopped."""
        return await self._stops.reap_once(self.state.tracks)

    def idle_timeout_of(self, dep: Deployment) -> float:
        """The idle timeout of ``dep``'s coming idle period: a caller's keep_alive, or its own."""
        track = self.state.tracks.get(dep.id)
        default = self.settings.idle_timeout_s
        return decide.timeout_of(dep, track, default) if track is not None else decide.idle_timeout(dep, default)

    def keep_alive(self, deployment_id: str, seconds: float) -> None:
        """A caller with a slot asked that ``deployment_id`` stay for ``seconds`` once idle
        (Ollama's ``keep_alive``): its idle timeout for the coming idle period (``decide.kept_alive``)."""
        track = self.state.tracks.get(deployment_id)
        if track is not None:
            o = self.settings
            kept = decide.kept_alive(
                track.keep_alive_s, seconds, track.inflight, o.idle_timeout_min_s, o.idle_timeout_max_s
            )
            self.state.keep_alive(deployment_id, kept)

    async def sleep(self, deployment_id: str, *, actor: str, user: str | None = None) -> None:
        """Put it to sleep once nothing it serves is in flight (issue 52): vLLM's ``/sleep``
        aborts what runs, so while requests are in flight no new slot is handed out (they wait,
        and wake it once it sleeps) until the last ends, within ``[ondemand] sleep_drain_s``;
        past it nothing sleeps and ``Conflict`` says how many are still in flight."""
        track = self.state.tracks.get(deployment_id)
        if track is not None and track.drained_for is not None:
            raise Conflict("it is being drained to make room for another model: not put to sleep")
        if track is not None and track.inflight:
            self.state.drain(deployment_id, SLEEP_DRAIN)
            deadline = self.clock() + self.settings.sleep_drain_s
            while (now := self.state.tracks.get(deployment_id)) is not None and now.inflight:
                if self.clock() >= deadline:
                    self.state.undrain(deployment_id, SLEEP_DRAIN)
                    raise Conflict(
                        f"{now.inflight} request(s) still in flight after {self.settings.sleep_drain_s:g} s: "
                        "not put to sleep"
                    )
                await self.clock.wait(self.state.wakeup(deployment_id), deadline - self.clock())
        try:
            await self._effects.sleep(deployment_id, actor=actor, user=user)
        finally:
            self.state.undrain(deployment_id, SLEEP_DRAIN)

    async def unload(self, deployment_id: str) -> bool:
        """Stop a ready on-demand deployment a caller asked to unload, unless it is busy
        (``Stops.unload``); True once stopped."""
        return await self._stops.unload(deployment_id, self.state.tracks)

    async def run(self) -> None:
        """The reaper, run by the supervisor (a failed pass is logged, recorded and restarted)."""
        while True:
            await asyncio.sleep(self.settings.reaper_interval_s)
            await self.reap_once()

    def shutdown(self) -> None:
        """dgxmm is stopping (SIGTERM): every waiter gets 503 now and no slot is granted any more;
        requests already holding a slot run on. Attempts under way find the deployer refusing."""
        self.state.shut_down(ShuttingDown("dgxmm is shutting down"))

    def close(self) -> None:
        self.state.close()
