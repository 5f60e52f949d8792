"""Live counters (dgxmm.controller.counters.CounterPublisher).

Spec (Controller, "Live counters"): at most one deployment event per interval per deployment,
the first change at once, later ones folded into one event an interval after the previous one,
with the counts as they are then.

Most tests replace the module's clock and event loop with a manual clock and a recording
scheduler, so timing is exact and nothing sleeps. A few at the end use a short real interval
to check that real loop timers fire.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from dgxmm.controller import counters as counters_module
from dgxmm.controller.counters import CounterPublisher


class FakeHandle:
    def __init__(self, when: float, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.when, self.callback, self.args = when, callback, args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualLoop:
    """A manual clock plus the part of an event loop CounterPublisher uses (call_later)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.handles: list[FakeHandle] = []

    def monotonic(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> FakeHandle:
        handle = FakeHandle(self.now + delay, callback, args)
        self.handles.append(handle)
        return handle

    def pending(self) -> list[FakeHandle]:
        return [h for h in self.handles if not h.cancelled and h.when is not None]

    def advance(self, to: float) -> None:
        """Move the clock to ``to``, running due timers in order at their own times."""
        while True:
            due = sorted((h for h in self.pending() if h.when <= to), key=lambda h: h.when)
            if not due:
                break
            handle = due[0]
            self.now = handle.when
            handle.when = None  # type: ignore[assignment]  # fired
            handle.callback(*handle.args)
        self.now = to


@pytest.fixture
def loop(monkeypatch: pytest.MonkeyPatch) -> ManualLoop:
    manual = ManualLoop()
    # Replace only the counters module's view of time and asyncio, not the real modules.
    monkeypatch.setattr(counters_module, "time", SimpleNamespace(monotonic=manual.monotonic))
    monkeypatch.setattr(counters_module, "asyncio", SimpleNamespace(get_running_loop=lambda: manual))
    return manual


class Recorder:
    """The publish callback: records (time, deployment id) of each publish."""

    def __init__(self, loop: ManualLoop) -> None:
        self.loop = loop
        self.calls: list[tuple[float, str]] = []

    def __call__(self, deployment_id: str) -> None:
        self.calls.append((self.loop.now, deployment_id))

    def ids(self) -> list[str]:
        return [i for _, i in self.calls]


def make(loop: ManualLoop, interval: float = 1.0) -> tuple[CounterPublisher, Recorder]:
    rec = Recorder(loop)
    return CounterPublisher(rec, interval), rec


def test_first_change_publishes_at_once(loop: ManualLoop) -> None:
    """The first change of a deployment publishes immediately, with no timer."""
    pub, rec = make(loop)
    loop.now = 5.0
    pub.changed("a")
    assert rec.calls == [(5.0, "a")]
    assert loop.pending() == []


def test_changes_within_interval_fold_into_one_publish(loop: ManualLoop) -> None:
    """Several changes within the interval give exactly one more publish, one timer."""
    pub, rec = make(loop)
    pub.changed("a")  # t=0: at once
    for t in (0.1, 0.4, 0.7, 0.99):
        loop.now = t
        pub.changed("a")
    assert rec.calls == [(0.0, "a")]
    assert len(loop.handles) == 1  # one timer for all folded changes
    loop.advance(10.0)
    assert rec.calls == [(0.0, "a"), (1.0, "a")]


@pytest.mark.parametrize("first_folded_at", [0.01, 0.3, 0.5, 0.999])
def test_folded_publish_fires_one_interval_after_the_previous_publish(loop: ManualLoop, first_folded_at: float) -> None:
    """The folded publish is due at previous publish + interval, not change + interval."""
    pub, rec = make(loop)
    loop.now = 2.0
    pub.changed("a")
    loop.now = 2.0 + first_folded_at
    pub.changed("a")
    (handle,) = loop.pending()
    assert handle.when == pytest.approx(3.0)
    loop.advance(2.999)
    assert rec.ids() == ["a"]
    loop.advance(3.0)
    assert rec.calls == [(2.0, "a"), (3.0, "a")]


def test_folded_publish_counts_as_the_previous_publish(loop: ManualLoop) -> None:
    """After a folded publish at t=1, a change at t=1.5 is folded again, due at t=2."""
    pub, rec = make(loop)
    pub.changed("a")  # t=0
    loop.now = 0.5
    pub.changed("a")
    loop.advance(1.5)  # the folded publish fires at t=1.0
    pub.changed("a")
    assert rec.calls == [(0.0, "a"), (1.0, "a")]
    (handle,) = loop.pending()
    assert handle.when == pytest.approx(2.0)
    loop.advance(5.0)
    assert rec.calls == [(0.0, "a"), (1.0, "a"), (2.0, "a")]


def test_folded_publish_carries_the_counts_as_they_are_then(loop: ManualLoop) -> None:
    """The folded event is built when it fires, so it shows the latest counts."""
    counts = {"a": 0}
    seen: list[int] = []
    pub = CounterPublisher(lambda dep_id: seen.append(counts[dep_id]), 1.0)
    counts["a"] = 1
    pub.changed("a")
    for t, value in ((0.2, 2), (0.4, 3), (0.6, 2)):
        loop.now = t
        counts["a"] = value
        pub.changed("a")
    loop.advance(1.0)
    assert seen == [1, 2]


@pytest.mark.parametrize("later", [1.0, 1.0001, 7.5], ids=["exactly_interval", "just_after", "long_after"])
def test_change_after_interval_publishes_at_once(loop: ManualLoop, later: float) -> None:
    """Once a full interval has passed since the previous publish, a change publishes at once."""
    pub, rec = make(loop)
    pub.changed("a")
    loop.now = later
    pub.changed("a")
    assert rec.calls == [(0.0, "a"), (later, "a")]
    assert loop.pending() == []


def test_change_just_before_interval_is_folded(loop: ManualLoop) -> None:
    """A change a hair before the interval ends waits for the timer."""
    pub, rec = make(loop)
    pub.changed("a")
    loop.now = 0.9999
    pub.changed("a")
    assert rec.ids() == ["a"]
    assert len(loop.pending()) == 1


def test_deployments_publish_independently(loop: ManualLoop) -> None:
    """Each deployment has its own interval: one's publish does not delay or fold another's."""
    pub, rec = make(loop)
    pub.changed("a")  # t=0: a at once
    loop.now = 0.1
    pub.changed("b")  # b's first change: at once although a just published
    assert rec.calls == [(0.0, "a"), (0.1, "b")]
    loop.now = 0.2
    pub.changed("a")  # folded, due 1.0
    loop.now = 0.3
    pub.changed("b")  # folded, due 1.1
    assert sorted(h.when for h in loop.pending()) == pytest.approx([1.0, 1.1])
    loop.advance(1.05)
    assert rec.calls[-1] == (1.0, "a")
    loop.advance(2.0)
    assert rec.calls == [(0.0, "a"), (0.1, "b"), (1.0, "a"), (1.1, "b")]


def test_forget_cancels_a_pending_publish(loop: ManualLoop) -> None:
    """forget() cancels the folded publish of that deployment only."""
    pub, rec = make(loop)
    pub.changed("a")
    pub.changed("b")
    loop.now = 0.5
    pub.changed("a")
    pub.changed("b")
    handle_a = next(h for h in loop.handles if h.args == ("a",))
    pub.forget("a")
    assert handle_a.cancelled
    loop.advance(5.0)
    assert rec.calls == [(0.0, "a"), (0.0, "b"), (1.0, "b")]


def test_forget_without_pending_publish_is_harmless(loop: ManualLoop) -> None:
    """forget() of a deployment with nothing pending (or never seen) does nothing."""
    pub, rec = make(loop)
    pub.forget("never-seen")
    pub.changed("a")
    pub.forget("a")
    assert rec.ids() == ["a"]
    assert loop.handles == []


def test_after_forget_the_next_change_publishes_at_once(loop: ManualLoop) -> None:
    """A forgotten deployment starts afresh: its next change is a first change."""
    pub, rec = make(loop)
    pub.changed("a")
    loop.now = 0.5
    pub.changed("a")
    pub.forget("a")
    loop.now = 0.6
    pub.changed("a")
    assert rec.calls == [(0.0, "a"), (0.6, "a")]
    loop.advance(5.0)
    assert rec.calls == [(0.0, "a"), (0.6, "a")]


def test_close_cancels_all_pending_publishes(loop: ManualLoop) -> None:
    """close() cancels every deployment's folded publish."""
    pub, rec = make(loop)
    for dep_id in ("a", "b", "c"):
        pub.changed(dep_id)
    loop.now = 0.5
    for dep_id in ("a", "b", "c"):
        pub.changed(dep_id)
    assert len(loop.pending()) == 3
    pub.close()
    assert loop.pending() == []
    assert all(h.cancelled for h in loop.handles)
    loop.advance(5.0)
    assert rec.ids() == ["a", "b", "c"]


def test_close_with_nothing_pending_is_harmless(loop: ManualLoop) -> None:
    """close() on an idle publisher does nothing, and twice is fine."""
    pub, rec = make(loop)
    pub.close()
    pub.changed("a")
    pub.close()
    pub.close()
    assert rec.ids() == ["a"]


def test_interval_zero_publishes_every_change_at_once(loop: ManualLoop) -> None:
    """With interval 0 nothing is folded: every change publishes immediately, no timers."""
    pub, rec = make(loop, interval=0.0)
    pub.changed("a")
    pub.changed("a")
    pub.changed("b")
    loop.now = 0.001
    pub.changed("a")
    assert rec.calls == [(0.0, "a"), (0.0, "a"), (0.0, "b"), (0.001, "a")]
    assert loop.handles == []


# --- with the real event loop and a short real interval ------------------------------------------

REAL_INTERVAL = 0.05


async def test_real_timer_fires_the_folded_publish() -> None:
    """On a real loop the folded publish fires by itself about one interval later."""
    calls: list[str] = []
    pub = CounterPublisher(calls.append, REAL_INTERVAL)
    pub.changed("a")
    pub.changed("a")
    pub.changed("a")
    assert calls == ["a"]
    await asyncio.sleep(REAL_INTERVAL * 4)  # (the publish timer on this same loop is due first: it has run)
    assert calls == ["a", "a"]
    pub.close()


async def test_real_timer_forget_and_close_cancel() -> None:
    """On a real loop, forget() and close() keep cancelled publishes from firing."""
    calls: list[str] = []
    pub = CounterPublisher(calls.append, REAL_INTERVAL)
    for dep_id in ("a", "b", "c"):
        pub.changed(dep_id)
        pub.changed(dep_id)
    pub.forget("a")
    pub.close()
    await asyncio.sleep(REAL_INTERVAL * 4)  # (the cancelled timers were due first on this loop)
    assert calls == ["a", "b", "c"]


async def test_real_timer_interval_zero_never_schedules() -> None:
    """On a real loop with interval 0, every change publishes synchronously."""
    calls: list[str] = []
    pub = CounterPublisher(calls.append, 0.0)
    for _ in range(5):
        pub.changed("a")
    assert calls == ["a"] * 5
