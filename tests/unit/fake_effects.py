"""A synchronous in-memory ``Effects`` (and sampler and recorder) for driving the controller's
steps with no I/O: no store, no runtime, no HTTP. It records every effect the controller asks for
in ``calls``; stops finish when the test says so (``finish_stop``), starts become ready when it
says so (``ready``). Only the contract of ``ondemand.effects.Effects`` is imitated."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from unit.ondemand_harness import Clock

from dgxmm.deploy.budget import InsufficientMemory, Snapshot
from dgxmm.deploy.placement import Need
from dgxmm.records.changes import Change, Listener, Precheck
from dgxmm.deploy.sampler import Sample
from dgxmm.records.deployment import HOLDS_MEMORY, Deployment, Mode, State
from dgxmm.errors import Conflict, NotFound
from dgxmm.controller.controller import Controller
from dgxmm.settings import OndemandSettings


class FakeEffects:
    def __init__(self, capacity: float, samples: Samples | None = None, recorder: Recorder | None = None) -> None:
        self.capacity = capacity
        self.samples = samples or Samples(Clock())
        self.recorder = recorder or Recorder()
        self.deps: dict[str, Deployment] = {}
        self.calls: list[tuple[str, ...]] = []
        self.listeners: list[Listener] = []
        self.stops: dict[str, asyncio.Future[None]] = {}
        self.hold_stops = False  # stops wait for finish_stop(id)
        self.before_precheck: Callable[[str], None] | None = None
        self.before_start: Callable[[str], None] | None = None
        self.prefetches: list[tuple[str, str]] = []  # ("want" or "done", deployment id), in order

    # reading
    def find(self, deployment_id: str) -> Deployment | None:
        dep = self.deps.get(deployment_id)
        return None if dep is None else dep.model_copy()

    def peek(self, deployment_id: str) -> Deployment | None:
        return self.deps.get(deployment_id)

    def all(self) -> list[Deployment]:
        return [dep.model_copy() for dep in self.deps.values()]

    def snapshot(self, exclude: str | None = None) -> Snapshot:
        held = [d for d in self.deps.values() if d.id != exclude and d.state in HOLDS_MEMORY]
        return Snapshot(
            usable=self.capacity,
            held=sum(d.memory_gib for d in held),
            fixed=sum(d.memory_gib for d in held if d.is_fixed),
            measured_free=None,
        )

    def held_gib(self, dep: Deployment) -> float:
        return dep.memory_gib

    def need_of(self, dep: Deployment) -> Need:
        return Need(dep.memory_gib)

    def devices_of(self, dep: Deployment) -> tuple[int, ...]:
        return (0,)

    def add_listener(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def latest(self, deployment_id: str) -> Sample | None:
        return self.samples.latest(deployment_id)

    def add_idle_listener(self, listener: Callable[[str], None]) -> None:
        self.samples.listeners.append(listener)

    def event(self, actor: str, deployment_id: str | None, text: str) -> None:
        self.recorder.event(actor, deployment_id, text)

    def audit(self, action: str, **kw: Any) -> None:
        self.recorder.audit(action, **kw)

    # writing
    def add(self, name: str, gib: float, state: State = State.STOPPED, mode: Mode = Mode.ON_DEMAND) -> str:
        dep = Deployment(id=name, name=name, served_name=name, engine="command", memory_gib=gib, mode=mode, state=state)
        self.deps[name] = dep
        self._tell(Change("created", dep.model_copy()))
        return name

    def set_state(self, deployment_id: str, state: State) -> None:
        old = self.deps[deployment_id]
        self.deps[deployment_id] = old.model_copy(update={"state": state})
        self._tell(Change("state", self.deps[deployment_id].model_copy(), old_state=old.state))

    def restart(
        self, deployment_id: str, *, actor: str, user: str | None = None, devices: Sequence[int] | None = None
    ) -> None:
        self._start(deployment_id, "restart", (State.STOPPED, State.FAILED))

    def wake(self, deployment_id: str, *, actor: str, user: str | None = None) -> None:
        self._start(deployment_id, "wake", (State.ASLEEP,))

    def _start(self, deployment_id: str, call: str, states: tuple[State, ...]) -> None:
        dep = self.deps.get(deployment_id)
        if dep is None:
            raise NotFound(deployment_id)
        if dep.state not in states:
            raise Conflict(f"{deployment_id} is {dep.state}")
        if self.before_start is not None:
            self.before_start(deployment_id)
        free = self.snapshot(exclude=deployment_id).free
        if dep.memory_gib > free:
            raise InsufficientMemory(
                deployment_id, dep.memory_gib, free, self.capacity, name=dep.name, usable=self.capacity
            )
        self.calls.append((call, deployment_id))
        self.set_state(deployment_id, State.STARTING)

    async def sleep(self, deployment_id: str, *, actor: str, user: str | None = None) -> None:
        dep = self.deps.get(deployment_id)
        if dep is None:
            raise NotFound(deployment_id)
        if dep.state is not State.READY:
            raise Conflict(f"{deployment_id} is {dep.state}")
        self.calls.append(("sleep", deployment_id))
        self.set_state(deployment_id, State.ASLEEP)

    async def stop(
        self,
        deployment_id: str,
        precheck: Precheck | None = None,
        *,
        actor: str,
        user: str | None = None,
        reason: str = "stopped",
    ) -> bool:
        dep = self.deps.get(deployment_id)
        if dep is None:
            raise NotFound(deployment_id)
        if dep.state not in (State.READY, State.ASLEEP, State.STARTING, State.FAILED):
            return False
        if self.before_precheck is not None:
            self.before_precheck(deployment_id)
        if precheck is not None and not precheck(dep.model_copy()):
            self.calls.append(("refused", deployment_id))
            return False
        self.calls.append(("stop", deployment_id, reason))
        self.set_state(deployment_id, State.STOPPING)
        if self.hold_stops:
            self.stops[deployment_id] = asyncio.get_running_loop().create_future()
            await self.stops[deployment_id]
        self.set_state(deployment_id, State.STOPPED)
        return True

    def update(self, deployment_id: str, **changes: Any) -> Deployment:
        old = self.deps[deployment_id]
        self.deps[deployment_id] = old.model_copy(update=changes)
        self._tell(Change("config", self.deps[deployment_id].model_copy(), old=old.model_copy()))
        return self.deps[deployment_id].model_copy()

    def prefetch(self, deployment_id: str) -> None:
        self.prefetches.append(("want", deployment_id))

    def prefetch_done(self, deployment_id: str) -> None:
        self.prefetches.append(("done", deployment_id))

    def switch_mode(self, deployment_id: str, mode: Mode, idle_timeout_s: float | None) -> None:
        self.update(deployment_id, mode=mode, idle_timeout_s=idle_timeout_s, pending_mode=None)

    def pend_mode(self, deployment_id: str, pending: Mode | None, idle_timeout_s: float | None) -> None:
        self.update(deployment_id, pending_mode=pending, idle_timeout_s=idle_timeout_s)

    # the test's hands
    def ready(self, deployment_id: str) -> None:
        self.set_state(deployment_id, State.READY)

    def finish_stop(self, deployment_id: str) -> None:
        self.stops[deployment_id].set_result(None)

    def _tell(self, change: Change) -> None:
        for listener in self.listeners:
            listener(change)


class Samples:
    """Every engine reports a fresh idle sample unless told otherwise."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.busy: set[str] = set()
        self.listeners: list[Callable[[str], None]] = []

    def turned_idle(self, deployment_id: str) -> None:
        """A new sample shows the engine idle: what the real sampler tells its idle listeners."""
        self.busy.discard(deployment_id)
        for listener in self.listeners:
            listener(deployment_id)

    def latest(self, deployment_id: str) -> Sample | None:
        return Sample(self.clock(), 1 if deployment_id in self.busy else 0, 0)


@dataclass
class Recorder:
    events: list[tuple[str, str | None, str]] = field(default_factory=list)
    audits: list[str] = field(default_factory=list)

    def event(self, actor: str, deployment_id: str | None, text: str) -> None:
        self.events.append((actor, deployment_id, text))

    def audit(
        self,
        action: str,
        *,
        actor: str,
        user: str | None,
        deployment_id: str | None,
        old: Any = None,
        new: Any = None,
        text: str = "",
    ) -> None:
        self.audits.append(action)


@dataclass
class Steps:
    fx: FakeEffects
    clock: Clock
    samples: Samples
    recorder: Recorder
    controller: Controller


@asynccontextmanager
async def steps(capacity: float = 10, **ondemand: Any) -> AsyncIterator[Steps]:
    settings = OndemandSettings(
        **{"idle_timeout_min_s": 1, "idle_timeout_s": 60, "counters_publish_s": 0, "stop_settle_s": 0, **ondemand}
    )
    clock = Clock()
    samples = Samples(clock)
    recorder = Recorder()
    fx = FakeEffects(capacity, samples, recorder)
    controller = Controller(settings, fx, lambda _: None, clock=clock)
    try:
        yield Steps(fx, clock, samples, recorder, controller)
    finally:
        controller.close()
