"""The in-memory history (dgxmm.status.history): minute buckets, start records and memory points, with a
hand-driven clock."""

from __future__ import annotations

from typing import Any

from dgxmm.records.changes import Change
from dgxmm.records.deployment import Deployment, Mode, State
from dgxmm.status.history import MAX_STARTS, History

T0 = 1_800_000_000.0  # a whole minute


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def dep(state: State, **kw: Any) -> Deployment:
    fields: dict[str, Any] = {
        "id": "d",
        "name": "tiny",
        "served_name": "tiny",
        "engine": "command",
        "memory_gib": 4,
        "mode": Mode.ON_DEMAND,
        "state": state,
    }
    return Deployment(**(fields | kw))


def move(history: History, old: State, new: State, reason: str = "") -> None:
    history.on_change(Change("state", dep(new, state_reason=reason), old_state=old))


def test_requests_and_refusals_are_counted_per_minute() -> None:
    clock = Clock()
    history = History(clock)
    for _ in range(3):
        history.request("d")
    history.refused("d", "ondemand_queue_full")
    clock.now += 61
    history.request("d")
    minutes = history.deployment("d")["minutes"]
    assert len(minutes) == 60 and minutes[-1]["start"] == T0 + 60
    assert [(m["requests"], m["refusals"]) for m in minutes[-2:]] == [(3, 1), (1, 0)]
    assert all(m["requests"] == 0 for m in minutes[:-2])
    assert history.last_request_at("d") == T0 + 61


def test_usage_today_and_in_the_last_hour_counts_each_end() -> None:
    clock = Clock()
    history = History(clock)
    history.request("d")
    assert history.usage() == {}  # counted as it ends: an arrival costs nothing yet
    history.answered("d", 12, 30, failed=False)
    history.answered("d", 5, 0, failed=True)
    history.answered("e", 1, 1, failed=False)
    both = {"requests": 2, "prompt_tokens": 17, "completion_tokens": 30, "errors": 1}
    assert history.deployment("d")["usage"] == {"today": both, "last_hour": both}
    assert set(history.usage()) == {"d", "e"}
    clock.now += 3600
    assert history.usage()["d"] == {"today": both, "last_hour": {k: 0 for k in both}}
    history.on_change(Change("removed", dep(State.STOPPED)))
    assert set(history.usage()) == {"e"}


def test_counts_keep_their_peak_and_carry_into_quiet_minutes() -> None:
    clock = Clock()
    history = History(clock)
    history.load("d", 1, 0)
    history.load("d", 4, 2)
    history.load("d", 2, 0)  # the minute ends with 2 in flight
    clock.now += 3 * 60 + 5  # two minutes without a reading
    history.load("d", 0, 0)
    minutes = history.deployment("d")["minutes"]
    assert [(m["inflight_max"], m["queued_max"]) for m in minutes[-4:]] == [(4, 2), (2, 0), (2, 0), (2, 0)]
    clock.now += 60
    assert history.deployment("d")["minutes"][-1]["inflight_max"] == 0


def test_an_hour_later_old_minutes_are_gone() -> None:
    clock = Clock()
    history = History(clock)
    history.request("d")
    clock.now += 3600
    assert sum(m["requests"] for m in history.deployment("d")["minutes"]) == 0


def test_cold_starts_and_wakes_with_their_durations() -> None:
    clock = Clock()
    history = History(clock)
    move(history, State.STOPPED, State.STARTING)
    clock.now += 6.6
    move(history, State.STARTING, State.READY)
    move(history, State.READY, State.ASLEEP)
    move(history, State.ASLEEP, State.STARTING)
    clock.now += 0.5
    move(history, State.STARTING, State.READY)
    move(history, State.READY, State.STOPPING)
    move(history, State.STOPPING, State.STOPPED)
    move(history, State.STOPPED, State.STARTING)
    clock.now += 2
    move(history, State.STARTING, State.FAILED, "engine exited during start-up (exit code 1)\nboom")
    starts = history.deployment("d")["starts"]
    assert [(s["kind"], s["outcome"], s["duration_s"]) for s in starts] == [
        ("start", "ready", 6.6),
        ("wake", "ready", 0.5),
        ("start", "failed", 2.0),
    ]
    assert starts[-1]["reason"].endswith("boom")
    last = history.last_cold_start("d")
    assert last is not None and last.kind == "wake"


def test_a_start_in_progress_and_a_stop_during_it() -> None:
    clock = Clock()
    history = History(clock)
    move(history, State.STOPPED, State.STARTING)
    assert history.starts("d")[-1].outcome == "loading"
    clock.now += 1
    move(history, State.STARTING, State.STOPPING)
    assert (history.starts("d")[-1].outcome, history.starts("d")[-1].duration_s) == ("stopped", 1.0)
    assert history.last_cold_start("d") is None


def test_start_records_are_bounded_and_removal_forgets_traffic() -> None:
    history = History(Clock())
    for _ in range(MAX_STARTS + 5):
        move(history, State.STOPPED, State.STARTING)
        move(history, State.STARTING, State.READY)
    assert len(history.starts("d")) == MAX_STARTS
    history.request("d")
    history.on_change(Change("removed", dep(State.STOPPED), old_state=State.STOPPED))
    assert history.deployment("d")["starts"] == [] and history.last_request_at("d") is None


def test_memory_points_only_on_change_and_the_hour_before() -> None:
    clock = Clock()
    history = History(clock)
    history.memory(24, {"a": 6}, 0, {"a": "alpha"})
    clock.now += 10
    history.memory(24, {"a": 6}, 0, {"a": "alpha"})  # unchanged: no point
    clock.now += 10
    history.memory(24, {"a": 6, "b": 8}, 10, {"a": "alpha", "b": "beta"})
    host = history.host()
    assert [(p["time"] - T0, p["held"], p["wanted_gib"]) for p in host["points"]] == [
        (0, {"a": 6}, 0),
        (20, {"a": 6, "b": 8}, 10),
    ]
    assert host["names"] == {"a": "alpha", "b": "beta"}
    clock.now += 3600
    history.memory(24, {}, 0, {})
    points = history.host()["points"]
    # The last point older than the hour stays: it says what was held when the hour began.
    assert [p["time"] - T0 for p in points] == [20, 3620]
