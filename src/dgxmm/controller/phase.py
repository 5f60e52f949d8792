"""The on-demand phase a view shows of a deployment (``ondemand.phase`` in the admin API, the
phase in the model list's dgxmm object): a pure function of its record, the controller's track
of it and whether it is in the memory queue, in the spec's order of precedence."""

from __future__ import annotations

from enum import StrEnum

from dgxmm.controller.decide import OomRetry, Track
from dgxmm.records.deployment import Deployment, State


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
    if track is not None and track.oom is OomRetry.ENDING:  # failed for memory: started again once its engine is gone
        return Phase.STARTING_FOR_REQUEST
    if track is not None and track.inflight > 0:
        return Phase.SERVING
    if dep is None or dep.state is State.FAILED:
        return Phase.FAILED
    if dep.state in (State.STOPPED, State.ASLEEP, State.STOPPING):
        return Phase.SLEEPING
    return Phase.IDLE
