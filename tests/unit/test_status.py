"""The honest status of a deployment (dgxmm.status.honest), as tables: record and facts in, status out.

No I/O and no clock: ``now`` is a plain number. Expected values are what an operator must read,
written from the issue's list (Cold, Loading, Serving N, Idle, Queued N with what it waits for,
Asleep, Failed with its refusal deadline, Switching to always on), not from the code.
"""

from __future__ import annotations

from typing import Any

import pytest

from dgxmm.records.deployment import Deployment, Mode, Role, State
from dgxmm.status.honest import Facts, Room, differs, honest_status, wait_ends_at, waits_for

NOW = 10_000.0


def dep(name: str = "m", **overrides: Any) -> Deployment:
    """An on-demand model, stopped, 10 GiB, unless overridden."""
    fields: dict[str, Any] = {
        "id": f"id-{name}",
        "name": name,
        "served_name": name,
        "engine": "command",
        "memory_gib": 10,
        "role": Role.MODEL,
        "mode": Mode.ON_DEMAND,
        "state": State.STOPPED,
        "state_changed_at": NOW - 7,
    }
    fields.update(overrides)
    return Deployment(**fields)


ALWAYS = {"mode": Mode.ALWAYS_ON}

# (case, record overrides, facts, expected subset of the status)
TABLE: list[tuple[str, dict[str, Any], Facts, dict[str, Any]]] = [
    ("on demand, stopped: cold", {}, Facts(), {"code": "cold", "label": "Cold", "count": None}),
    (
        "on demand, planned: its files are fetched, requests wait",
        {"state": State.PLANNED},
        Facts(queued=2),
        {"code": "planned", "label": "Planned", "count": 2, "since": NOW - 7},
    ),
    ("cold with a request about to start it", {}, Facts(queued=1), {"code": "cold", "count": 1}),
    ("always on, stopped", ALWAYS, Facts(), {"code": "stopped", "label": "Stopped"}),
    ("always on, planned", {**ALWAYS, "state": State.PLANNED}, Facts(), {"code": "planned", "label": "Planned"}),
    ("system role, stopped (never cold)", {"role": Role.SYSTEM, **ALWAYS}, Facts(), {"code": "stopped"}),
    (
        "loading, since the state change, with the last cold start",
        {"state": State.STARTING},
        Facts(queued=2, last_cold_start_s=6.6),
        {"code": "loading", "label": "Loading", "since": NOW - 7, "count": 2, "last_cold_start_s": 6.6},
    ),
    (
        "loading behind another engine's start",
        {"state": State.STARTING},
        Facts(waiting_for_gate=True),
        {"code": "loading", "waiting_for_gate": True},
    ),
    ("always on, loading", {**ALWAYS, "state": State.STARTING}, Facts(), {"code": "loading", "count": None}),
    (
        "serving two",
        {"state": State.READY},
        Facts(inflight=2, idle_stops_at=None),
        {"code": "serving", "label": "Serving 2", "count": 2, "until": None},
    ),
    (
        "idle, with when it stops",
        {"state": State.READY},
        Facts(idle_stops_at=NOW + 272),
        {"code": "idle", "label": "Idle", "until": NOW + 272},
    ),
    (
        "always on, ready: no idle stop",
        {**ALWAYS, "state": State.READY},
        Facts(idle_stops_at=NOW + 5),
        {"code": "ready", "label": "Ready", "until": None},
    ),
    (
        "always on, serving through the gateway",
        {**ALWAYS, "state": State.READY},
        Facts(inflight=1),
        {"code": "serving", "label": "Serving 1"},
    ),
    (
        "asleep on demand: stops after its idle timeout",
        {"state": State.ASLEEP},
        Facts(idle_stops_at=NOW + 30),
        {"code": "asleep", "label": "Asleep", "until": NOW + 30},
    ),
    ("asleep always on", {**ALWAYS, "state": State.ASLEEP}, Facts(), {"code": "asleep", "until": None}),
    ("stopping", {"state": State.STOPPING}, Facts(), {"code": "stopping", "label": "Stopping"}),
    (
        "failed, starts refused for 52 s more",
        {"state": State.FAILED},
        Facts(refused_until=NOW + 52),
        {"code": "failed", "label": "Failed", "until": NOW + 52},
    ),
    (
        "failed, backoff over: the next request retries",
        {"state": State.FAILED},
        Facts(refused_until=NOW - 1),
        {"code": "failed", "until": None},
    ),
    (
        "failed always on: no gateway backoff",
        {**ALWAYS, "state": State.FAILED},
        Facts(refused_until=NOW + 50),
        {"code": "failed", "until": None},
    ),
    (
        "switching to always on while it loads",
        {"state": State.STARTING, "pending_mode": Mode.ALWAYS_ON},
        Facts(queued=1),
        {"code": "switching", "label": "Switching to always on", "since": NOW - 7},
    ),
    (
        "switching wins over queued",
        {"pending_mode": Mode.ALWAYS_ON},
        Facts(in_queue=True, queued=1),
        {"code": "switching", "since": None},
    ),
    (
        "queued, without room facts",
        {},
        Facts(in_queue=True, queued=3),
        {"code": "queued", "label": "Queued 3", "count": 3, "needs_gib": 10, "waits_for": None},
    ),
    (
        "the last failure is kept after a stop",
        {},
        Facts(last_failure=(NOW - 60, "engine exited")),
        {"code": "cold", "last_failure": {"at": NOW - 60, "reason": "engine exited"}},
    ),
    (
        "a failed deployment shows its own reason, not a remembered one",
        {"state": State.FAILED},
        Facts(last_failure=(NOW - 60, "engine exited")),
        {"code": "failed", "last_failure": None},
    ),
    (
        "last request time passes through",
        {"state": State.READY},
        Facts(last_request_at=NOW - 3),
        {"last_request_at": NOW - 3},
    ),
    (
        "an on-demand model bigger than on-demand models can get",
        {},
        Facts(capacity_gib=8),
        {
            "code": "too_big",
            "label": "Too big",
            "never_fits": {"needs_gib": 10, "capacity_gib": 8, "per_device": False},
        },
    ),
    ("one that fits exactly", {}, Facts(capacity_gib=10), {"never_fits": None}),
    (
        "too big for any device it may use (several devices)",
        {},
        Facts(capacity_gib=80, share_gib=90),
        {"code": "too_big", "never_fits": {"needs_gib": 90, "capacity_gib": 80, "per_device": True}},
    ),
    (
        "its share fits a device, though its memory_gib is more than one",
        {},
        Facts(capacity_gib=80, share_gib=60),
        {"never_fits": None},
    ),
    ("an always-on model is not judged by the on-demand capacity", ALWAYS, Facts(capacity_gib=8), {"never_fits": None}),
]


@pytest.mark.parametrize(("record", "facts", "expected"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_status_table(record: dict[str, Any], facts: Facts, expected: dict[str, Any]) -> None:
    status = honest_status(dep(**record), facts, NOW)
    assert {key: status[key] for key in expected} == expected


def test_every_status_has_the_same_keys() -> None:
    keys = {frozenset(honest_status(dep(**row[1]), row[2], NOW)) for row in TABLE}
    assert len(keys) == 1


# --- what a queued deployment waits for ---------------------------------------------------------------

BIG = dep("big", memory_gib=20)


def room(free: float, *others: tuple[Deployment, Facts], queue: tuple[str, ...] = ("id-big",)) -> Room:
    return Room(free, queue, ((BIG, Facts(in_queue=True, queued=1)), *others))


def names(wait: dict[str, Any]) -> list[str]:
    return [d["name"] for d in wait["deployments"]]


def test_waits_behind_earlier_queue_entries() -> None:
    ahead = dep("first", memory_gib=30)
    wait = waits_for(BIG, room(0, (ahead, Facts(in_queue=True)), queue=("id-first", "id-big")), NOW)
    assert (wait["kind"], names(wait)) == ("queue", ["first"])


def test_memory_free_already_means_its_start_is_next() -> None:
    assert waits_for(BIG, room(25), NOW)["kind"] == "free"


def test_a_stop_in_progress_frees_memory_first() -> None:
    victim = dep("v", state=State.STOPPING)
    wait = waits_for(BIG, room(10, (victim, Facts())), NOW)
    assert (wait["kind"], names(wait)) == ("stop", ["v"]) and "then" not in wait


def test_a_stop_that_frees_too_little_says_what_comes_after_it() -> None:
    """The issue's case: "waits for v to finish stopping" hid a 6-minute wait for another model."""
    stopping = dep("v", memory_gib=4, state=State.STOPPING)
    later = dep("later", memory_gib=10, state=State.READY)
    wait = waits_for(BIG, room(10, (stopping, Facts()), (later, Facts(idle_stops_at=NOW + 360))), NOW)
    assert (wait["kind"], names(wait)) == ("stop", ["v"])
    assert wait["then"] == {"kind": "victim", "at": NOW + 360, "deployments": [{"id": "id-later", "name": "later"}]}
    assert wait_ends_at(wait) == NOW + 360  # the live status looks again then
    alone = waits_for(BIG, room(10, (stopping, Facts())), NOW)
    assert alone["then"]["kind"] == "nothing"


def test_models_stopped_for_it_wait_for_their_memory_to_show() -> None:
    """Make-room stopped v for it; until the host shows v's memory free (the controller settles),
    it waits for that, not for "nothing dgxmm can stop" (which flashed before the start)."""
    stopped = dep("v", memory_gib=20, state=State.STOPPED)
    queued = Facts(in_queue=True, queued=1, stopped_for_it=("id-v",))
    wait = waits_for(BIG, Room(0, ("id-big",), ((BIG, queued), (stopped, Facts()))), NOW)
    assert (wait["kind"], names(wait)) == ("release", ["v"])
    restarted = dep("v", memory_gib=20, state=State.READY)  # its memory is held again
    wait = waits_for(BIG, Room(0, ("id-big",), ((BIG, queued), (restarted, Facts(inflight=1)))), NOW)
    assert wait["kind"] == "busy"


def test_victims_idling_out_in_order_until_the_shortfall_is_covered() -> None:
    """12 GiB short: the two that idle out first (8 + 6 GiB) cover it; the answer is when the
    second of them runs out, not the third."""
    a = dep("a", memory_gib=8, state=State.READY)
    b = dep("b", memory_gib=6, state=State.ASLEEP)
    c = dep("c", memory_gib=30, state=State.READY)
    wait = waits_for(
        BIG,
        room(
            8,
            (c, Facts(idle_stops_at=NOW + 500)),
            (a, Facts(idle_stops_at=NOW + 60)),
            (b, Facts(idle_stops_at=NOW + 190)),
        ),
        NOW,
    )
    assert (wait["kind"], names(wait), wait["at"]) == ("victim", ["a", "b"], NOW + 190)


def test_a_victim_already_past_its_timeout_idles_out_now() -> None:
    a = dep("a", memory_gib=20, state=State.READY)
    wait = waits_for(BIG, room(0, (a, Facts(idle_stops_at=NOW - 5))), NOW)
    assert (wait["kind"], wait["at"]) == ("victim", NOW)


@pytest.mark.parametrize(
    ("other", "facts"),
    [
        (dep("busy", memory_gib=20, state=State.READY), Facts(inflight=1, idle_stops_at=None)),
        (dep("pinned", memory_gib=20, state=State.READY, pending_mode=Mode.ALWAYS_ON), Facts(idle_stops_at=NOW)),
        (dep("always", memory_gib=20, state=State.READY, mode=Mode.ALWAYS_ON), Facts(idle_stops_at=None)),
        (dep("system", memory_gib=20, state=State.READY, role=Role.SYSTEM, mode=Mode.ALWAYS_ON), Facts()),
    ],
    ids=["busy", "pending-switch", "always-on", "system"],
)
def test_models_that_cannot_idle_out_are_not_victims(other: Deployment, facts: Facts) -> None:
    wait = waits_for(BIG, room(0, (other, facts)), NOW)
    assert wait["kind"] in ("busy", "nothing") and wait["at"] is None


def test_models_drained_for_it_come_before_idle_ones() -> None:
    drained = dep("drained", memory_gib=20, state=State.READY)
    other = dep("other", memory_gib=20, state=State.READY)
    wait = waits_for(
        BIG, room(0, (drained, Facts(inflight=1, drained_for="id-big")), (other, Facts(idle_stops_at=NOW + 5))), NOW
    )
    assert (wait["kind"], names(wait)) == ("drain", ["drained"])
    for_someone_else = waits_for(BIG, room(0, (drained, Facts(inflight=1, drained_for="id-x"))), NOW)
    assert for_someone_else["kind"] == "busy"


def test_with_evict_idle_set_a_victim_is_expected_when_make_room_may_stop_it() -> None:
    a = dep("a", memory_gib=20, state=State.READY)
    wait = waits_for(BIG, room(0, (a, Facts(idle_stops_at=NOW + 600, evictable_at=NOW + 3))), NOW)
    assert (wait["kind"], wait["at"]) == ("victim", NOW + 3)


def test_a_start_in_progress_when_no_idle_model_can_cover_it() -> None:
    loading = dep("loading", memory_gib=20, state=State.STARTING)
    wait = waits_for(BIG, room(0, (loading, Facts())), NOW)
    assert (wait["kind"], names(wait)) == ("start", ["loading"])


def test_models_serving_now_are_what_it_waits_for() -> None:
    busy = dep("busy", memory_gib=12, state=State.READY)
    idle = dep("idle", memory_gib=8, state=State.READY)
    wait = waits_for(BIG, room(0, (busy, Facts(inflight=2)), (idle, Facts(idle_stops_at=NOW + 9))), NOW)
    assert (wait["kind"], names(wait)) == ("busy", ["busy"])


def test_nothing_can_free_memory_held_by_always_on_models() -> None:
    always = dep("always", memory_gib=30, state=State.READY, mode=Mode.ALWAYS_ON)
    wait = waits_for(BIG, room(5, (always, Facts())), NOW)
    assert wait == {"kind": "nothing", "at": None, "deployments": []}


def test_queued_status_carries_what_it_waits_for() -> None:
    a = dep("a", memory_gib=20, state=State.READY)
    status = honest_status(BIG, Facts(in_queue=True, queued=1), NOW, room(0, (a, Facts(idle_stops_at=NOW + 42))))
    assert status["label"] == "Queued 1" and status["needs_gib"] == 20
    assert status["waits_for"] == {"kind": "victim", "at": NOW + 42, "deployments": [{"id": "id-a", "name": "a"}]}


# --- when a change must be published ------------------------------------------------------------------


def status_of(record: dict[str, Any], facts: Facts, now: float = NOW) -> dict[str, Any]:
    return honest_status(dep(**record), facts, now)


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [
        (None, status_of({}, Facts()), True),
        (status_of({}, Facts()), status_of({}, Facts()), False),
        (status_of({}, Facts()), status_of({}, Facts(in_queue=True, queued=1)), True),  # joined the queue
        (status_of({}, Facts(in_queue=True, queued=1)), status_of({}, Facts(in_queue=True, queued=2)), True),
        (
            status_of({"state": State.READY}, Facts(idle_stops_at=NOW + 60)),
            status_of({"state": State.READY}, Facts(idle_stops_at=NOW + 60.0004)),
            False,
        ),  # jitter
        (
            status_of({"state": State.READY}, Facts(idle_stops_at=NOW + 60)),
            status_of({"state": State.READY}, Facts(idle_stops_at=NOW + 90)),
            True,
        ),  # the timer restarted
        (
            status_of({"state": State.FAILED}, Facts(refused_until=NOW + 1)),
            status_of({"state": State.FAILED}, Facts(refused_until=NOW + 1), now=NOW + 2),
            True,
        ),  # backoff over
        (
            status_of({"state": State.STARTING}, Facts(waiting_for_gate=True)),
            status_of({"state": State.STARTING}, Facts()),
            True,
        ),  # the gate opened
        (
            status_of({"state": State.STARTING}, Facts()),
            status_of({"state": State.STARTING}, Facts(), now=NOW + 5),
            False,
        ),  # time passing alone is counted by the page
    ],
)
def test_differs(old: dict[str, Any] | None, new: dict[str, Any], changed: bool) -> None:
    assert differs(old, new) is changed


def test_what_comes_after_a_stop_is_part_of_the_wait() -> None:
    stopping = dep("v", memory_gib=4, state=State.STOPPING)
    later = dep("later", memory_gib=10, state=State.READY)

    def queued(idle_stops_at: float) -> dict[str, Any]:
        others = room(10, (stopping, Facts()), (later, Facts(idle_stops_at=idle_stops_at)))
        return honest_status(BIG, Facts(in_queue=True, queued=1), NOW, others)

    assert differs(queued(NOW + 360), queued(NOW + 60))  # the later wait moved
    assert not differs(queued(NOW + 360), queued(NOW + 360.2))
    nothing_after = honest_status(BIG, Facts(in_queue=True, queued=1), NOW, room(10, (stopping, Facts())))
    assert differs(queued(NOW + 360), nothing_after)


def test_a_queued_deployment_waiting_for_someone_else_is_a_change() -> None:
    a = dep("a", memory_gib=20, state=State.READY)
    b = dep("b", memory_gib=20, state=State.STARTING)
    waiting_for_a = honest_status(BIG, Facts(in_queue=True, queued=1), NOW, room(0, (a, Facts(idle_stops_at=NOW + 5))))
    waiting_for_b = honest_status(BIG, Facts(in_queue=True, queued=1), NOW, room(0, (b, Facts())))
    assert differs(waiting_for_a, waiting_for_b)
