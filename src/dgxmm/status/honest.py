"""One honest status per deployment, as a pure function of what dgxmm knows about it.

The deployer's ``state`` says what the engine is doing and the controller's ``phase`` what the
on-demand machinery is doing; an operator needs one answer that never contradicts itself, says
what a waiting request waits for, and carries the times a page needs to count down or up without
asking again. ``honest_status`` gives it from the deployment record, the ``Facts`` the
controller and the history hold about it, and (only for a queued deployment) the ``Room`` on the
host. No I/O, no clock: the caller passes ``now``, and the tests drive it as a table.

The answer is a JSON object (docs/api.md, "The deployment view", ``status``):

* ``code``: ``cold``, ``too_big``, ``loading``, ``serving``, ``idle``, ``queued``, ``asleep``,
  ``failed``, ``switching``, ``ready``, ``stopping``, ``stopped`` or ``planned``;
* ``label``: the badge text without times ("Queued 2", "Serving 1", "Loading");
* ``count``: requests in flight (serving) or waiting (queued, loading, cold), else null;
* ``waiting``: serving, the requests waiting for their turn under the model's ``max_concurrent``
  (the label says "Serving 2, 3 waiting"), else null;
* ``since``: when loading began; ``until``: when an idle model stops, or until when a failed
  one's starts are refused (Unix times, null when they do not apply);
* ``needs_gib`` and ``waits_for`` for a queued deployment; ``waiting_for_gate`` while a start
  waits for another engine to finish loading; ``last_cold_start_s``, ``last_request_at`` and
  ``last_failure`` (``{"at", "reason"}`` of a start that failed last, kept after a Stop);
  ``never_fits`` (``{"needs_gib", "capacity_gib"}``) for an on-demand model bigger than what
  on-demand models can get now: its requests are refused with does_not_fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dgxmm.records.deployment import Deployment, Role, State

EPS = 1e-9


@dataclass(frozen=True)
class Facts:
    """What dgxmm knows of one deployment besides its record. Times are Unix times."""

    inflight: int = 0
    queued: int = 0  # requests waiting for it: for memory, its start or their turn (max_concurrent)
    in_queue: bool = False  # it is in the memory queue
    idle_stops_at: float | None = None  # when the reaper may stop it (idle long enough)
    evictable_at: float | None = None  # when make-room may stop it ([ondemand] evict_idle_s; else as above)
    drained_for: str | None = None  # drained for this queued deployment: finishing, then stopped
    stopped_for_it: tuple[str, ...] = ()  # queued: the deployments stopped to make room for it
    refused_until: float | None = None  # the gateway refuses new starts until then (start backoff)
    waiting_for_gate: bool = False  # starting, but waiting for another engine to finish loading
    last_cold_start_s: float | None = None
    last_request_at: float | None = None
    last_failure: tuple[float, str] | None = None  # (when, reason) if the latest start failed
    capacity_gib: float | None = None  # the most on-demand models can get now (usable - fixed), on a device it may use
    share_gib: float | None = None  # what it needs on each device it spans (None: its memory_gib, one pooled device)


@dataclass(frozen=True)
class Room:
    """The host as a queued deployment sees it."""

    free_gib: float  # what a start may take now
    queue: tuple[str, ...]  # the memory queue, head first
    deployments: tuple[tuple[Deployment, Facts], ...]  # every deployment, with its facts


def _on_demand_model(dep: Deployment) -> bool:
    return dep.is_on_demand and dep.role is Role.MODEL


def honest_status(dep: Deployment, facts: Facts, now: float, room: Room | None = None) -> dict[str, Any]:
    """The status of ``dep`` (see the module docstring); ``room`` is only read when it is queued."""
    status: dict[str, Any] = {
        "code": "",
        "label": "",
        "count": None,
        "waiting": None,
        "since": None,
        "until": None,
        "needs_gib": None,
        "waits_for": None,
        "waiting_for_gate": False,
        "last_cold_start_s": facts.last_cold_start_s,
        "last_request_at": facts.last_request_at,
        "last_failure": None
        if facts.last_failure is None or dep.state is State.FAILED
        else {"at": facts.last_failure[0], "reason": facts.last_failure[1]},
        "never_fits": None,
    }
    on_demand = _on_demand_model(dep)
    share = dep.memory_gib if facts.share_gib is None else facts.share_gib
    if on_demand and facts.capacity_gib is not None and share > facts.capacity_gib + EPS:
        # per_device: the size of device it would need (on a host with several devices)
        status["never_fits"] = {
            "needs_gib": share,
            "capacity_gib": facts.capacity_gib,
            "per_device": facts.share_gib is not None,
        }
    state = dep.state
    if dep.pending_mode is not None:
        status.update(code="switching", label="Switching to always on")
        if state is State.STARTING:
            status.update(since=dep.state_changed_at, waiting_for_gate=facts.waiting_for_gate)
    elif on_demand and facts.in_queue:
        status.update(
            code="queued",
            label=f"Queued {facts.queued}",
            count=facts.queued,
            needs_gib=dep.memory_gib,
            waits_for=None if room is None else waits_for(dep, room, now),
        )
    elif state is State.FAILED:
        refused = on_demand and facts.refused_until is not None and facts.refused_until > now
        status.update(code="failed", label="Failed", until=facts.refused_until if refused else None)
    elif state is State.STARTING:
        status.update(
            code="loading",
            label="Loading",
            since=dep.state_changed_at,
            count=facts.queued or None,
            waiting_for_gate=facts.waiting_for_gate,
        )
    elif state is State.READY and facts.inflight > 0:
        # Ready and serving, its waiting requests wait for their turn (max_concurrent) or a drain.
        label = f"Serving {facts.inflight}" + (f", {facts.queued} waiting" if facts.queued else "")
        status.update(code="serving", label=label, count=facts.inflight, waiting=facts.queued or None)
    elif state is State.READY:
        if on_demand:
            status.update(code="idle", label="Idle", until=facts.idle_stops_at)
        else:
            status.update(code="ready", label="Ready")
    elif state is State.ASLEEP:
        status.update(code="asleep", label="Asleep", until=facts.idle_stops_at if on_demand else None)
    elif state is State.STOPPING:
        status.update(code="stopping", label="Stopping")
    elif state is State.PLANNED:  # preparing (a hub model's download: its state_reason says how far)
        status.update(code="planned", label="Planned", since=dep.state_changed_at, count=facts.queued or None)
    elif on_demand and status["never_fits"] is not None:  # its requests are refused: no "Cold"
        status.update(code="too_big", label="Too big")
    elif on_demand:  # stopped: the next request starts it
        status.update(code="cold", label="Cold", count=facts.queued or None)
    else:
        status.update(code=state.value, label=state.value.capitalize())
    return status


def waits_for(dep: Deployment, room: Room, now: float) -> dict[str, Any]:
    """What a queued deployment waits for, the first that applies: deployments ahead of it in
    the queue; memory that is free already (its start is next); the memory of models stopped
    for it, which the host has not shown free yet; a stop in progress; models drained for it
    (finishing what they serve); idle models whose timeouts run out (``at``: when enough of
    them have; make-room's ``evict_idle_s`` when set); a start in progress; models serving
    requests now; nothing that dgxmm can stop.

    A stop in progress that frees too little does not hide the rest: the wait says what comes
    after it (``then``, itself such a wait, with its own deployments and time)."""
    others = [(d, f) for d, f in room.deployments if d.id != dep.id]
    if dep.id in room.queue:
        ahead = set(room.queue[: room.queue.index(dep.id)])
        if ahead:
            return _waits("queue", [d for d, _ in others if d.id in ahead])
    shortfall = dep.memory_gib - room.free_gib
    if shortfall <= EPS:
        return _waits("free", [])
    own = next((f for d, f in room.deployments if d.id == dep.id), None)
    stopped_for_it = set(own.stopped_for_it) if own is not None else set()
    released = [d for d, _ in others if d.id in stopped_for_it and not d.holds_memory]
    if released:
        return _waits("release", released)
    stopping = [d for d, _ in others if d.state is State.STOPPING]
    if stopping:
        rest = shortfall - sum(d.memory_gib for d in stopping)
        wait = _waits("stop", stopping)
        if rest > EPS:
            wait["then"] = _beyond_stops(dep, others, rest, now)
        return wait
    return _beyond_stops(dep, others, shortfall, now)


def _beyond_stops(
    dep: Deployment, others: list[tuple[Deployment, Facts]], shortfall: float, now: float
) -> dict[str, Any]:
    """What covers ``shortfall`` once the stops in progress are done (``waits_for``'s order)."""
    candidates = [
        (d, f)
        for d, f in others
        if _on_demand_model(d) and d.pending_mode is None and d.state in (State.READY, State.ASLEEP)
    ]
    drained = [d for d, f in others if f.drained_for == dep.id]
    if drained:
        return _waits("drain", drained)
    idle = sorted(
        ((d, f) for d, f in candidates if f.inflight == 0 and _evictable(f) is not None),
        key=lambda item: (_evictable(item[1]), item[0].id),
    )
    freed, chosen = 0.0, []
    for d, f in idle:
        chosen.append((d, f))
        freed += d.memory_gib
        if freed >= shortfall - EPS:
            at = max(_evictable(f2) or now for _, f2 in chosen)
            return _waits("victim", [d2 for d2, _ in chosen], at=max(at, now))
    starting = [d for d, _ in others if d.state is State.STARTING]
    if starting:
        return _waits("start", starting)
    if sum(d.memory_gib for d, _ in candidates) >= shortfall - EPS:
        return _waits("busy", [d for d, f in candidates if f.inflight > 0])
    return _waits("nothing", [])


def _evictable(facts: Facts) -> float | None:
    return facts.evictable_at if facts.evictable_at is not None else facts.idle_stops_at


def _waits(kind: str, deployments: list[Deployment], at: float | None = None) -> dict[str, Any]:
    return {"kind": kind, "at": at, "deployments": [{"id": d.id, "name": d.name} for d in deployments]}


def differs(old: dict[str, Any] | None, new: dict[str, Any], *, counts: bool = True) -> bool:
    """Whether a page showing ``old`` would mislead now: another label (code or count), another
    thing waited for, a deadline that appeared, went or moved by more than a second, a start
    that began or stopped waiting for another engine, a failure remembered or forgotten.
    Without ``counts``, a label whose count alone changed ("Serving 2" to "Serving 3") is no
    change: a change of phase, which a page must show at once."""
    if old is None:
        return True
    waits_old, waits_new = _chain(old.get("waits_for")), _chain(new.get("waits_for"))
    shown = "label" if counts else "code"
    if (old[shown], old["waiting_for_gate"], old["last_failure"] is None, old["never_fits"]) != (
        new[shown],
        new["waiting_for_gate"],
        new["last_failure"] is None,
        new["never_fits"],
    ) or [(w["kind"], w["deployments"]) for w in waits_old] != [(w["kind"], w["deployments"]) for w in waits_new]:
        return True
    return _moved(old["until"], new["until"]) or any(
        _moved(a.get("at"), b.get("at")) for a, b in zip(waits_old, waits_new, strict=True)
    )


def _chain(wait: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A wait and what it says comes after it (``then``), in order."""
    chain = []
    while wait:
        chain.append(wait)
        wait = wait.get("then")
    return chain


def wait_ends_at(wait: dict[str, Any] | None) -> float | None:
    """The first expected end (``at``) along a wait's chain: when the status changes with time."""
    return next((w["at"] for w in _chain(wait) if w.get("at") is not None), None)


def _moved(old: float | None, new: float | None) -> bool:
    if old is None or new is None:
        return (old is None) != (new is None)
    return abs(old - new) > 1.0
