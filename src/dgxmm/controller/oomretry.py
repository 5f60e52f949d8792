"""A start that ran out of memory: room made for it, and one more try (issue 52, item 4).

The budget said the model fits, the driver disagreed (fragmentation, the page cache on unified
memory, a process dgxmm does not know of): the engine's output says so (deploy/oomlines.py).
Such a failure of a start the controller made for requests is not a failed start yet: its
waiters keep waiting while its engine is ended (``OomRetry.ENDING``), then its next attempt
(``OomRetry.DUE``) sees every device it may use short by the deployment's own share, so
make-room stops idle models for that shortfall as it would for any start, and starts it once
they are stopped (``OomRetry.TAKEN``). When nothing idle is left to stop, it starts on what is
free: the shortfall is a guess, and the engine's next answer is the fact. A second failure is a
failed start with backoff, as any other (onchange.py). Pure functions of the track and the
attempt's snapshot, as decide.py's; the controller's tests drive them by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dgxmm.controller import decide
from dgxmm.controller.decide import AttemptSnapshot, OomRetry, Track
from dgxmm.deploy import placement
from dgxmm.deploy.oomlines import out_of_memory
from dgxmm.deploy.placement import Need, Room


def after_failed_start(track: Track, output: str) -> OomRetry:
    """What a failed start (``output``: its reason and the engine's last lines) leads to:
    ``ENDING`` (retried once its engine is gone) for the controller's own start whose engine
    ran out of memory and that was not retried for memory yet; else ``NONE``, a failed start
    with backoff. A start by hand fails as before: a person is there to read why."""
    if track.started_for_request and track.oom is OomRetry.NONE and out_of_memory(output) is not None:
        return OomRetry.ENDING
    return OomRetry.NONE


def short_rooms(rooms: Sequence[Room], need: Need) -> tuple[Room, ...]:
    """The devices as the retry sees them: each one's free memory short by the need's share
    (the driver found less than the budget did, by up to what the engine asked for)."""
    return tuple(Room(room.index, max(0.0, room.free_gib - need.per_device), room.capacity_gib) for room in rooms)


def plan_attempt(snap: AttemptSnapshot) -> decide.Step:
    """``decide.plan_attempt``, and for the retry it would start (due, the queue's head): start
    where the short devices still fit it; else settle while the victims it stopped free their
    memory; else stop idle victims for the shortfall; else start where the plain plan would."""
    step = decide.plan_attempt(snap)
    if not isinstance(step, decide.Start) or step.wake or step.devices is None or snap.dep is None:
        return step
    if snap.track.oom is not OomRetry.DUE or (snap.queue and snap.queue[0] != snap.deployment_id):
        return step  # not the retry, or behind the head (only the head makes room)
    need = snap.need_of(snap.dep)
    short = short_rooms(snap.devices(), need)
    placed = placement.fitting(short, need)
    if placed is not None:
        return decide.Start(wake=False, devices=placed)
    until = snap.progress.settle_until
    if until is not None and snap.now < until:
        return decide.Settle(until)
    victims = decide.victims_among(replace(snap, rooms=short), decide.candidates(snap), need)
    return decide.MakeRoom(victims) if victims else step
