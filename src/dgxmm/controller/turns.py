"""Turns under a deployment's ``max_concurrent``, and what a waiting request waits for: pure
functions (no I/O, no clock), as ``decide`` is for starts.

A deployment's ``max_concurrent`` caps the requests in flight on it through dgxmm. A request that
finds the cap reached waits in the controller like one waiting for a start, in arrival order
(``ControllerState.waiters`` keeps that order). A released slot is handed to the longest waiter
in the same plain call as the release (``Controller._hand_out``), so a newcomer arriving at that
moment finds the slot taken, and a newcomer never takes a slot while anyone waits before it.
"""

from __future__ import annotations

from enum import StrEnum

from dgxmm.records.deployment import Deployment, State


def free_slots(limit: int | None, inflight: int) -> int | None:
    """How many more requests may hold a slot now: None without a limit; never below 0 (a limit
    lowered while more requests ran lets none in until enough ended)."""
    return None if limit is None else max(0, limit - inflight)


def takes_at_once(limit: int | None, inflight: int, waiting: int) -> bool:
    """Whether a newcomer to a ready deployment takes a slot without waiting: a slot is free and
    nobody waits before it (no barging past the line)."""
    free = free_slots(limit, inflight)
    return waiting == 0 and (free is None or free > 0)


def handed(limit: int | None, inflight: int, waiting: int) -> int:
    """How many of the longest waiters of a ready deployment get a slot now."""
    free = free_slots(limit, inflight)
    return waiting if free is None else min(waiting, free)


class WaitsFor(StrEnum):
    """What a waiting request waits for (the admin API's waiting list)."""

    MEMORY = "memory"  # its deployment is in the memory queue
    DRAIN = "drain"  # its deployment is drained for another: it stops, then starts again
    TURN = "turn"  # ready, at its max_concurrent: a slot to be released
    START = "start"  # a start or wake, under way or about to be made for it
    STOP = "stop"  # the engine is stopping; the request starts it again afterwards
    PLANNED = "planned"  # its preparation (an image pull, a download) has not finished
    ENGINE = "engine"  # an always-on engine that is not ready: dgxmm does not start it


def waits_for(dep: Deployment, drained: bool, in_memory_queue: bool) -> WaitsFor:
    """What a request waiting for ``dep`` waits for now, the first that applies."""
    if in_memory_queue:
        return WaitsFor.MEMORY
    if drained:
        return WaitsFor.DRAIN
    if dep.state is State.READY:
        return WaitsFor.TURN
    if dep.state is State.STARTING or dep.pending_mode is not None:
        return WaitsFor.START
    if not dep.is_on_demand:
        return WaitsFor.ENGINE
    if dep.state is State.STOPPING:
        return WaitsFor.STOP
    if dep.state is State.PLANNED:
        return WaitsFor.PLANNED
    return WaitsFor.START  # stopped, failed or asleep: its waiters start or wake it
