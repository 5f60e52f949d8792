"""The controller's decisions as pure functions of a snapshot: no I/O, no clock, no awaits.

The controller gathers what it knows (deployment records, its own per-deployment tracks, the
latest metrics samples, the budget, the queue and the time) into a snapshot and asks these
functions what to do; tests drive every rule here without engines or sleeps. ``plan_attempt`` is
the whole decision tree of a start attempt; ``is_idle`` is the whole rule of which deployment
may be stopped (reaper, make-room and the stop precheck alike).
"""

from __future__ import annotations

import math

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from dgxmm.deploy import placement
from dgxmm.deploy.placement import Holder, Need, Room
from dgxmm.deploy.sampler import Sample
from dgxmm.records.deployment import Deployment, Role, State

EPS = 1e-9  # memory sums are floats: 0.1 + 0.2 must cover 0.3


class OomRetry(StrEnum):
    """Where a start that ran out of memory is in its one retry (controller/oomretry.py)."""

    NONE = "none"  # no start of it ran out of memory since it last started or failed for good
    ENDING = "ending"  # its start ran out of memory and its engine is being ended: waiters wait
    DUE = "due"  # that engine is gone: the next attempt makes room for the shortfall and starts
    TAKEN = "taken"  # the retry is starting: a failure now is a failed start, with backoff


@dataclass(frozen=True)
class Track:
    """What the controller knows of one deployment (its clock's times); its owner replaces it."""

    idle_since: float
    inflight: int = 0
    waiting: int = 0  # requests in acquire() for this deployment (queued or waiting for a start)
    last_request_at: float | None = None  # wall-clock time, for status()
    started_for_request: bool = False  # the current start was made by the controller
    backoff_s: float = 0.0  # the next refusal period after a failed start (0: none yet)
    refused_until: float = 0.0  # new starts refused with start_failed until then
    config: tuple[object, ...] = field(default_factory=tuple)
    drained_for: str | None = None  # drained for this queue head: no new slot, stopped once nothing is in flight
    owed: bool = False  # stopped by a drain with requests waiting: not drained again until they are served
    # A caller's ``keep_alive`` (the Ollama API) for the idle period after this busy one: its idle
    # timeout instead of the deployment's (``timeout_of``); cleared as the next busy period begins.
    keep_alive_s: float | None = None
    oom: OomRetry = OomRetry.NONE  # its one retry after a start that ran out of memory


class Action(StrEnum):
    GRANT = "grant"  # ready: take a slot now
    START = "start"  # stopped or failed: restart it
    WAKE = "wake"  # asleep: wake it
    WAIT = "wait"  # anything else: wait for a change without starting it
    REFUSE = "refuse"  # in start-failure backoff: start_failed at once


def next_action(dep: Deployment, track: Track, now: float) -> Action:
    """What a waiter of ``dep`` does now (spec: Controller, "Per state")."""
    if dep.state is State.READY:
        return Action.WAIT if track.drained_for is not None else Action.GRANT
    if dep.pending_mode is not None or not dep.is_on_demand or dep.role is not Role.MODEL:
        return Action.WAIT  # set_mode is starting it, or it was switched to always on
    if track.oom is OomRetry.ENDING:
        return Action.WAIT  # its start ran out of memory: retried once its engine is gone
    if dep.state in (State.STOPPED, State.FAILED):
        return Action.REFUSE if now < track.refused_until else Action.START
    if dep.state is State.ASLEEP:
        return Action.WAKE
    return Action.WAIT  # starting (by us or by hand), stopping, planned


NEVER = 0.0  # an idle timeout that never ends: the reaper skips it, make-room does not


def idle_timeout(dep: Deployment, default_s: float) -> float:
    return dep.idle_timeout_s if dep.idle_timeout_s is not None else default_s


def timeout_of(dep: Deployment, track: Track, default_s: float) -> float:
    """The idle timeout of ``dep``'s idle period now: a caller's ``keep_alive`` where one set it,
    else the deployment's (``idle_timeout``)."""
    return track.keep_alive_s if track.keep_alive_s is not None else idle_timeout(dep, default_s)


def kept_alive(current: float | None, asked: float, inflight: int, low: float, high: float) -> float:
    """The ``keep_alive`` kept after a caller asked for ``asked`` seconds: within ``[low, high]``
    (``[ondemand] idle_timeout_min_s``, ``_max_s``); negative or infinite: ``NEVER`` for idleness
    (Ollama's -1, llama-swap's ``ttl: 0``: make-room may still stop it); never below what another
    caller in flight asked for (``current``; ``inflight`` counts this caller too)."""
    wanted = NEVER if asked < 0 or asked == math.inf else min(max(asked, low), high)
    if current is None or inflight <= 1:
        return wanted
    return NEVER if NEVER in (wanted, current) else max(wanted, current)


def evict_after(dep: Deployment, default_timeout_s: float, evict_idle_s: float | None) -> float:
    """How long ``dep`` must have had nothing in flight before make-room may stop it:
    ``[ondemand] evict_idle_s`` when set, else its idle timeout (the seed's rule)."""
    return evict_idle_s if evict_idle_s is not None else idle_timeout(dep, default_timeout_s)


def is_idle(
    dep: Deployment,
    track: Track | None,
    sample: Sample | None,
    now: float,
    *,
    default_timeout_s: float,
    max_sample_age_s: float,
    idle_for_s: float | None = None,
) -> bool:
    """Whether the reaper or make-room may stop ``dep`` (spec: victims / reaper rules): on demand,
    ready or asleep, no switch pending, no slot in flight, nobody waiting for it (it is about to
    be used), idle for its full timeout (``idle_for_s`` instead when given: make-room's
    ``evict_after``), and for a ready engine a fresh metrics sample that shows nothing running
    or waiting. An asleep engine is not sampled (it serves nothing), so it needs no sample. A
    deployment the controller has no track of is never idle; one whose ``idle_timeout_s`` is 0
    is never idle to the reaper (llama-swap's ``ttl: 0``), only to make-room."""
    if track is None or not dep.is_on_demand or dep.role is not Role.MODEL:
        return False
    if dep.pending_mode is not None or dep.state not in (State.READY, State.ASLEEP):
        return False
    if track.inflight > 0 or track.waiting > 0:
        return False
    wait_s = idle_for_s if idle_for_s is not None else timeout_of(dep, track, default_timeout_s)
    if idle_for_s is None and wait_s == NEVER:  # never reaped; make-room's idle_for_s is 0
        return False
    if now - track.idle_since < wait_s:
        return False
    if dep.state is State.ASLEEP:
        return True
    return sample is not None and sample.age(now) < max_sample_age_s and sample.idle


def idle_expiry(
    dep: Deployment, track: Track, default_timeout_s: float, idle_for_s: float | None = None
) -> float | None:
    """When ``dep`` will have been idle for its full timeout (``idle_for_s`` instead when given),
    if it can become a victim at all."""
    if not dep.is_on_demand or dep.role is not Role.MODEL or dep.pending_mode is not None:
        return None
    if dep.state not in (State.READY, State.ASLEEP) or track.inflight:
        return None
    wait_s = idle_for_s if idle_for_s is not None else timeout_of(dep, track, default_timeout_s)
    if idle_for_s is None and wait_s == NEVER:  # (never reaped)
        return None
    return track.idle_since + wait_s


def may_stop_drained(dep: Deployment, track: Track | None) -> bool:
    """The precheck of a drain's stop: still drained, still running, and nothing in flight (its
    waiting requests wait for the engine that comes back after the head's turn)."""
    return (
        track is not None
        and track.drained_for is not None
        and track.inflight == 0
        and dep.pending_mode is None
        and dep.state in (State.READY, State.ASLEEP)
    )


@dataclass(frozen=True)
class Candidate:
    id: str
    memory_gib: float
    idle_since: float
    devices: tuple[int, ...] = (0,)

    def holder(self) -> Holder:
        return Holder(self.id, self.idle_since, placement.spread(self.memory_gib, self.devices))


def next_backoff(current_s: float, initial_s: float, max_s: float) -> float:
    """60 s after the first failed start, doubling to at most 900 s (by default)."""
    return min(max_s, initial_s if current_s <= 0 else current_s * 2)


# --- the start attempt --------------------------------------------------------------------------


@dataclass(frozen=True)
class Rules:
    """The settings the decisions depend on."""

    idle_timeout_s: float  # the default idle timeout
    metrics_max_age_s: float  # a ready engine needs a sample younger than this to be idle
    stop_settle_s: float  # the does_not_fit grace after a stop, and the wait for freed memory
    evict_idle_s: float | None = None  # make-room's idle rule (None: each deployment's idle timeout)
    max_drain_wait_s: float = 0.0  # the head waits this long before busy models are drained (0: never)


@dataclass(frozen=True)
class Other:
    """Another deployment, as make-room and the head's reservation see it."""

    dep: Deployment
    track: Track | None
    sample: Sample | None
    held_gib: float | None = None  # what stopping it frees, when measured above its declaration
    devices: tuple[int, ...] = (0,)  # where it holds memory (a pooled host: its one device)

    @property
    def frees_gib(self) -> float:
        return self.dep.memory_gib if self.held_gib is None else self.held_gib

    def frees(self) -> dict[int, float]:
        """What stopping it frees on each device."""
        return placement.spread(self.frees_gib, self.devices)


@dataclass(frozen=True)
class Progress:
    """What the running attempt did so far (the attempt is the only one that knows)."""

    stopped_victim: bool = False  # it stopped at least one victim (does_not_fit is not final)
    settle_until: float | None = None  # it may wait until then for freed memory to show


@dataclass(frozen=True)
class AttemptSnapshot:
    """Everything one decision of a start attempt for ``deployment_id`` depends on."""

    deployment_id: str
    dep: Deployment | None  # None: removed
    track: Track
    waiters: int  # requests waiting for this deployment right now
    now: float
    queue: tuple[str, ...]  # the memory queue, head first
    head_victims: Mapping[str, float]  # the head's victims (id -> GiB), unless we are the head
    free_gib: float  # free now, this deployment left out (the fit check's figure), in all
    capacity_gib: float  # usable minus what always-on, system and decider deployments hold
    others: tuple[Other, ...]
    last_stop: float  # the grace clock: when the last approved on-demand stop happened
    progress: Progress
    rules: Rules
    queued_since: float | None = None  # when this deployment joined the memory queue (None: not in it)
    # Each device (none given: one pooled device of free_gib and capacity_gib), and what this
    # deployment asks of them (none given: its memory_gib on one device).
    rooms: tuple[Room, ...] = ()
    need: Need | None = None

    def devices(self) -> tuple[Room, ...]:
        return self.rooms or (Room(0, self.free_gib, self.capacity_gib),)

    def need_of(self, dep: Deployment) -> Need:
        return self.need or Need(dep.memory_gib)


@dataclass(frozen=True)
class Abandon:
    """Nobody waits any more (or the deployment is gone): leave the queue, start nothing."""


@dataclass(frozen=True)
class Moot:
    """Not a state the controller starts from (ready, starting, stopping, pending switch,
    refused in backoff): the attempt ends and waiters decide for themselves."""


@dataclass(frozen=True)
class Start:
    """Start (restart) it on ``devices``, or wake it when asleep; it leaves the queue."""

    wake: bool
    devices: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Enqueue:
    """It cannot start yet: join the queue (or stay in it) until something changes."""


@dataclass(frozen=True)
class MakeRoom:
    """The head stops these idle deployments, least recently used first, to cover its need."""

    victims: tuple[str, ...]


@dataclass(frozen=True)
class Settle:
    """The head's victims were stopped: wait (until ``until`` at most) for the budget to show
    the freed memory, then decide again."""

    until: float


@dataclass(frozen=True)
class Drain:
    """The head waited ``max_drain_wait_s`` and only busy models' memory would let it start:
    these models get no new slot, finish what they run, then stop (``may_stop_drained``)."""

    victims: tuple[str, ...]


@dataclass(frozen=True)
class GiveUp:
    """More than the capacity: it can never fit (does_not_fit)."""

    need_gib: float
    capacity_gib: float


Step = Abandon | Moot | Start | Enqueue | MakeRoom | Drain | Settle | GiveUp


def freed_for_head(
    head_victims: Mapping[str, float], others: Iterable[Other], devices: Iterable[int] = (0,)
) -> dict[int, float]:
    """What was freed for the head on each device: its victims that no longer hold memory (a
    victim still stopping holds it; one the precheck refused is no longer listed). A victim
    removed meanwhile held memory somewhere no record says any more: it counts on every device,
    so what it freed stays the head's wherever it was."""
    known = {other.dep.id: other for other in others}
    freed: dict[int, float] = {}
    for victim, gib in head_victims.items():
        other = known.get(victim)
        if other is not None and other.dep.holds_memory:
            continue
        shares = placement.spread(gib, other.devices) if other is not None else dict.fromkeys(devices, gib)
        for device, share in shares.items():
            freed[device] = freed.get(device, 0.0) + share
    return freed


def candidates(snap: AttemptSnapshot) -> list[Candidate]:
    """The other deployments make-room may stop: idle by the one rule, ``is_idle``."""
    rules = snap.rules

    def idle(o: Other) -> bool:
        return is_idle(
            o.dep,
            o.track,
            o.sample,
            snap.now,
            default_timeout_s=rules.idle_timeout_s,
            max_sample_age_s=rules.metrics_max_age_s,
            idle_for_s=evict_after(o.dep, rules.idle_timeout_s, rules.evict_idle_s),
        )

    return [Candidate(o.dep.id, o.frees_gib, o.track.idle_since, o.devices) for o in snap.others if o.track and idle(o)]


def drain_due(snap: AttemptSnapshot) -> float | None:
    """When the head may drain busy models (``max_drain_wait_s`` after it joined the queue), or
    None when it never may (draining is off, or it is not queued)."""
    if snap.rules.max_drain_wait_s <= 0 or snap.queued_since is None:
        return None
    return snap.queued_since + snap.rules.max_drain_wait_s


def drainable(snap: AttemptSnapshot, since: float) -> list[Candidate]:
    """The models a drain may stop: make-room's idle candidates, and on-demand models that were
    busy while the head waited (a slot in flight now, or one granted or ended since ``since``),
    ready, no switch pending and not owed their own turn (``Track.owed``). A model left alone
    all that time is not drained: it waits for its idle rule, as before."""
    busy = [
        Candidate(o.dep.id, o.frees_gib, o.track.idle_since, o.devices)
        for o in snap.others
        if o.track is not None
        and not o.track.owed
        and o.dep.is_on_demand
        and o.dep.role is Role.MODEL
        and o.dep.pending_mode is None
        and o.dep.state is State.READY
        and (o.track.inflight > 0 or o.track.idle_since > since)
    ]
    idle = candidates(snap)
    return idle + [cand for cand in busy if cand.id not in {c.id for c in idle}]


def does_not_fit(snap: AttemptSnapshot, never_fits: bool) -> bool:
    """More than the capacity (of every device set it may use) can never fit, unless a recent
    on-demand stop may still read as used, or this attempt stopped a victim."""
    recent = snap.now - snap.last_stop < snap.rules.stop_settle_s
    return never_fits and not snap.progress.stopped_victim and not recent


def victims_among(snap: AttemptSnapshot, cands: Iterable[Candidate], need: Need) -> tuple[str, ...] | None:
    """The victims that let ``need`` start: least recently used first, taken only from the
    devices it will use, on the device set with the fewest (``placement.making_room``)."""
    found = placement.making_room(snap.devices(), need, [cand.holder() for cand in cands])
    return found[1] if found is not None and found[1] else None


def plan_attempt(snap: AttemptSnapshot) -> Step:
    """The whole decision tree of one step of a start attempt (spec: Controller):

    1. nobody waits, or it was removed: abandon (start nothing);
    2. not stopped, failed or asleep (or in backoff, or a switch is starting it): moot;
       a hub model whose files are not here (a failed fetch): start, which fetches them again
       (planned) and takes no memory, so nothing is stopped for it;
    3. it fits, and it is the head, or the queue is empty, or it fits beside what was freed for
       the head: start or wake;
    4. more than the capacity, with no recent stop and no victim stopped by this attempt: give up;
    5. behind the head: queue (only the head makes room);
    6. the head whose victims were just stopped: settle (wait for the freed memory to show);
    7. the head: stop idle victims, least recently used first, if they cover the shortfall;
    8. the head, queued ``max_drain_wait_s`` or longer: drain the idle candidates and the models
       busy while it waited, least recently used first, if they cover the shortfall;
    9. else queue."""
    dep = snap.dep
    if dep is None or snap.waiters == 0:
        return Abandon()
    action = next_action(dep, snap.track, snap.now)
    if action not in (Action.START, Action.WAKE):
        return Moot()
    if action is Action.START and dep.awaits_files:
        return Start(wake=False)  # its files are fetched first (planned), which takes no memory
    need, rooms = snap.need_of(dep), snap.devices()
    fits = placement.fitting(rooms, need) is not None
    head = not snap.queue or snap.queue[0] == snap.deployment_id
    reserved = {} if head else freed_for_head(snap.head_victims, snap.others, [room.index for room in rooms])
    devices = placement.fitting(rooms, need, reserved) if fits else None
    if devices is not None:
        return Start(wake=action is Action.WAKE, devices=devices)
    if not fits and does_not_fit(snap, not placement.ever_fits(rooms, need)):
        return GiveUp(need.per_device, placement.largest_share(rooms, need))
    if not head:
        return Enqueue()
    settle_until = snap.progress.settle_until
    if settle_until is not None and snap.now < settle_until:
        return Settle(settle_until)
    victims = victims_among(snap, candidates(snap), need)
    if victims:
        return MakeRoom(victims)
    due = drain_due(snap)
    if due is not None and snap.queued_since is not None and snap.now >= due:
        drained = victims_among(snap, drainable(snap, snap.queued_since), need)
        if drained:
            return Drain(drained)
    return Enqueue()
