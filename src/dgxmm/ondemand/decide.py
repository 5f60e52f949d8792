"""The controller's decisions as pure functions of a snapshot: no I/O, no clock, no awaits.

The controller gathers what it knows (deployment records, its own per-deployment tracks, the
latest metrics samples, the time) and asks these functions what to do; tests drive every rule
here without engines or sleeps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from dgxmm.deploy.metrics import Sample
from dgxmm.deploy.models import Deployment, Role, State


@dataclass
class Track:
    """What the controller knows of one deployment. Times are ``time.monotonic()``."""

    idle_since: float
    inflight: int = 0
    waiting: int = 0  # requests in acquire() for this deployment (queued or waiting for a start)
    last_request_at: float | None = None  # wall-clock time, for status()
    started_for_request: bool = False  # the current start was made by the controller
    backoff_s: float = 0.0  # the next refusal period after a failed start (0: none yet)
    refused_until: float = 0.0  # new starts refused with start_failed until then
    config: tuple[object, ...] = field(default_factory=tuple)


class Action(StrEnum):
    GRANT = "grant"  # ready: take a slot now
    START = "start"  # stopped or failed: restart it
    WAKE = "wake"  # asleep: wake it
    WAIT = "wait"  # anything else: wait for a change without starting it
    REFUSE = "refuse"  # in start-failure backoff: start_failed at once


def next_action(dep: Deployment, track: Track, now: float) -> Action:
    """What a waiter of ``dep`` does now (spec: Controller, "Per state")."""
    if dep.state is State.READY:
        return Action.GRANT
    if dep.pending_mode is not None or not dep.is_on_demand or dep.role is not Role.MODEL:
        return Action.WAIT  # set_mode is starting it, or it was switched to always on
    if dep.state in (State.STOPPED, State.FAILED):
        return Action.REFUSE if now < track.refused_until else Action.START
    if dep.state is State.ASLEEP:
        return Action.WAKE
    return Action.WAIT  # starting (by us or by hand), stopping, planned


def idle_timeout(dep: Deployment, default_s: float) -> float:
    return dep.idle_timeout_s if dep.idle_timeout_s is not None else default_s


def is_idle(
    dep: Deployment,
    track: Track | None,
    sample: Sample | None,
    now: float,
    *,
    default_timeout_s: float,
    max_sample_age_s: float,
) -> bool:
    """Whether the reaper or make-room may stop ``dep`` (spec: victims / reaper rules): on demand,
    ready or asleep, no switch pending, no slot in flight, idle for its full timeout, and for a
    ready engine a fresh metrics sample that shows nothing running or waiting. An asleep engine
    is not sampled (it serves nothing), so it needs no sample."""
    if track is None or not dep.is_on_demand or dep.role is not Role.MODEL:
        return False
    if dep.pending_mode is not None or dep.state not in (State.READY, State.ASLEEP):
        return False
    if track.inflight > 0 or now - track.idle_since < idle_timeout(dep, default_timeout_s):
        return False
    if dep.state is State.ASLEEP:
        return True
    return sample is not None and sample.age(now) < max_sample_age_s and sample.idle


def idle_expiry(dep: Deployment, track: Track, default_timeout_s: float) -> float | None:
    """When ``dep`` will have been idle for its full timeout, if it can become a victim at all."""
    if not dep.is_on_demand or dep.role is not Role.MODEL or dep.pending_mode is not None:
        return None
    if dep.state not in (State.READY, State.ASLEEP) or track.inflight:
        return None
    return track.idle_since + idle_timeout(dep, default_timeout_s)


@dataclass(frozen=True)
class Candidate:
    id: str
    memory_gib: float
    idle_since: float


def pick_victims(candidates: Iterable[Candidate], shortfall_gib: float) -> list[str] | None:
    """Least recently used first until ``shortfall_gib`` is covered; None (stop nobody) if all
    of them together are not enough."""
    chosen: list[str] = []
    freed = 0.0
    for cand in sorted(candidates, key=lambda c: (c.idle_since, c.id)):
        if freed >= shortfall_gib - 1e-9:
            break
        chosen.append(cand.id)
        freed += cand.memory_gib
    return chosen if freed >= shortfall_gib - 1e-9 else None


def may_start_behind_head(need_gib: float, free_gib: float, reserved_gib: float) -> bool:
    """A later queue entry (or a newcomer) may start while the head is blocked only if it fits
    in what is free now minus what was freed for the head."""
    return need_gib <= free_gib - reserved_gib + 1e-9


def next_backoff(current_s: float, initial_s: float, max_s: float) -> float:
    """60 s after the first failed start, doubling to at most 900 s (by default)."""
    return min(max_s, initial_s if current_s <= 0 else current_s * 2)


class Phase(StrEnum):
    QUEUED = "queued"
    STARTING_FOR_REQUEST = "starting_for_request"
    SERVING = "serving"
    FAILED = "failed"
    SLEEPING = "sleeping"
    IDLE = "idle"


def phase(dep: Deployment | None, track: Track | None, queued: bool) -> Phase:
    """The on-demand phase shown in views, in the spec's order of precedence."""
    if queued:
        return Phase.QUEUED
    if dep is not None and track is not None and dep.state is State.STARTING and track.started_for_request:
        return Phase.STARTING_FOR_REQUEST
    if track is not None and track.inflight > 0:
        return Phase.SERVING
    if dep is None or dep.state is State.FAILED:
        return Phase.FAILED
    if dep.state in (State.STOPPED, State.ASLEEP, State.STOPPING):
        return Phase.SLEEPING
    return Phase.IDLE

