"""A controller on the real deployer, with every wait under the test's control.

* ``Clock``: the controller's clock, moved by hand (idle timeouts, deadlines, backoff). Its
  timers fire only when the test advances it, so a waiter wakes early only when it is woken.
* ``GatedDeployer``: the real deployer (check-and-write, precheck, state machine, fit check)
  whose engine "becomes healthy" only when the test says so: ``finish_start(id)`` or
  ``fail_start(id)``. Stops can be held before their precheck, and prechecks are observed.
* ``FakeSampler``: metrics samples set per deployment; by default a fresh idle sample.
* ``metrics``: dgxmm's metrics on the same clock, watching the deployer, as in the service.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from unit.fakes import FakeRuntime

from dgxmm.deploy.budget import MemoryBudget
from dgxmm.records.changes import Precheck
from dgxmm.deploy.deployer import Deployer
from dgxmm.deploy.sleeplevels import WakeStep
from dgxmm.deploy.starts import EngineStartFailed
from dgxmm.deploy.sampler import Sample
from dgxmm.records.deployment import Deployment, Mode, RuntimeHandle, State
from dgxmm.events import EventBus
from dgxmm.controller.controller import Controller
from dgxmm.controller.effects import DeployerEffects
from dgxmm.settings import DeployerSettings, MemorySettings, OndemandSettings
from dgxmm.store.db import Store
from dgxmm.telemetry.metrics import Metrics


def behind_the_owners_back(controller: Controller, deployment_id: str, **fields: Any) -> None:
    """Set fields of a deployment's (frozen) track past its owner's writes, so nobody is told: a
    state a test needs that no event of its own makes."""
    track = controller.track(deployment_id)
    for name, value in fields.items():
        object.__setattr__(track, name, value)


class Clock:
    """The controller's ``Clock``: time moves only in ``advance``, which fires due timers."""

    def __init__(self) -> None:
        self.now = 10_000.0
        self._timers: list[tuple[float, asyncio.Future[None]]] = []
        self._on_read: Callable[[], None] | None = None

    def __call__(self) -> float:
        hook, self._on_read = self._on_read, None
        if hook is not None:
            hook()
        return self.now

    def on_next_read(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` inside the next reading of the clock (a gate inside a decision)."""
        self._on_read = hook

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for due, fut in self._timers:
            if due <= self.now and not fut.done():
                fut.set_result(None)

    async def wait(self, event: asyncio.Event, seconds: float) -> None:
        if event.is_set():
            return
        timer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self.now + max(seconds, 0.0), timer)
        if entry[0] <= self.now:
            return
        self._timers.append(entry)
        woken: asyncio.Future[Any] = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait([woken, timer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
            timer.cancel()
            self._timers.remove(entry)


Observer = Callable[[Deployment, bool], None]


class GatedServing:
    """An engine serves when the test says so (``finish_start``) or fails with the reason it
    gives (``fail_start``); a wake waits on the same verdict (the harness's engines have no
    /wake_up)."""

    def __init__(self, gate_of: Callable[[str], asyncio.Future[str | None]]) -> None:
        self._gate_of = gate_of

    async def wait(self, dep: Deployment, handle: RuntimeHandle, started: float, *, woken: bool) -> None:
        problem = await self._gate_of(dep.id)
        if problem is not None:
            raise EngineStartFailed(problem)

    async def wake(self, handle: RuntimeHandle, steps: Sequence[WakeStep]) -> None:
        pass


class GatedDeployer(Deployer):
    """Starts wait for the test's verdict instead of polling an engine over HTTP; stops may be
    held before their precheck (``hold_stops``), and every precheck verdict is reported to the
    ``observers`` as it is made, before the deployer acts on it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.gates: dict[str, asyncio.Future[str | None]] = {}
        super().__init__(*args, serving=GatedServing(self._gate_of), **kwargs)
        self.start_calls: list[str] = []
        self.wake_calls: list[str] = []
        self.held: list[str] = []  # stops waiting at the hold, in arrival order
        self.observers: list[Observer] = []
        self.before_precheck: Callable[[], Awaitable[None]] | None = None
        self._hold: asyncio.Event | None = None

    def release(self) -> None:
        """Let every held stop and every gated start go (the end of a test, passed or not)."""
        if self._hold is not None:
            self._hold.set()
        if self.runtime.stop_gate is not None:  # type: ignore[attr-defined]
            self.runtime.stop_gate.set()  # type: ignore[attr-defined]
        for fut in self.gates.values():
            if not fut.done():
                fut.set_result("test over")

    def hold_stops(self) -> asyncio.Event:
        """Every stop from now on waits on the returned event before its precheck runs."""
        self._hold = asyncio.Event()
        return self._hold

    async def stop(self, deployment_id: str, precheck: Precheck | None = None, **kw: Any) -> bool:
        if self._hold is not None:
            self.held.append(deployment_id)
            await self._hold.wait()
        if self.before_precheck is not None:
            await self.before_precheck()
        if precheck is not None:
            inner = precheck

            def observed(dep: Deployment) -> bool:
                verdict = inner(dep)
                for observer in list(self.observers):
                    observer(dep, verdict)
                return verdict

            precheck = observed
        return await super().stop(deployment_id, precheck, **kw)

    def _gate_of(self, deployment_id: str) -> asyncio.Future[str | None]:
        fut = self.gates.get(deployment_id)
        if fut is None or fut.done():
            fut = self.gates[deployment_id] = asyncio.get_running_loop().create_future()
        return fut

    def restart(self, deployment_id: str, *, actor: str, user: str | None = None, devices: Any = None) -> None:
        super().restart(deployment_id, actor=actor, user=user, devices=devices)
        self.start_calls.append(deployment_id)

    def wake(self, deployment_id: str, *, actor: str, user: str | None = None) -> None:
        super().wake(deployment_id, actor=actor, user=user)
        self.wake_calls.append(deployment_id)

    async def starting(self, deployment_id: str) -> None:
        """Wait until the engine of ``deployment_id`` was launched and waits for its verdict."""
        await until(lambda: deployment_id in self.gates and not self.gates[deployment_id].done())

    def finish_start(self, deployment_id: str) -> None:
        self._gate_of(deployment_id).set_result(None)

    def fail_start(self, deployment_id: str, reason: str = "engine exited (exit code 1)") -> None:
        self._gate_of(deployment_id).set_result(reason)


class FakeSampler:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.samples: dict[str, Sample | None] = {}
        self.listeners: list[Callable[[str], None]] = []

    def latest(self, deployment_id: str) -> Sample | None:
        if deployment_id in self.samples:
            return self.samples[deployment_id]
        return Sample(self.clock(), 0, 0)

    def busy(self, deployment_id: str, running: float = 1, waiting: float = 0) -> None:
        self.samples[deployment_id] = Sample(self.clock(), running, waiting)

    def add_idle_listener(self, listener: Callable[[str], None]) -> None:
        self.listeners.append(listener)

    def idle(self, deployment_id: str) -> None:
        """A new sample shows it idle, told as the real sampler tells it."""
        self.samples[deployment_id] = Sample(self.clock(), 0, 0)
        for listener in self.listeners:
            listener(deployment_id)


@dataclass
class Harness:
    clock: Clock
    deployer: GatedDeployer
    runtime: FakeRuntime
    sampler: FakeSampler
    controller: Controller
    bus: EventBus
    store: Store
    published: list[str]
    metrics: Metrics

    async def add(
        self,
        name: str,
        gib: float,
        *,
        state: State = State.STOPPED,
        mode: Mode = Mode.ON_DEMAND,
        **kw: Any,
    ) -> str:
        dep = Deployment(
            id=name, name=name, served_name=name, engine="command", command=["x"], memory_gib=gib, mode=mode, **kw
        )
        self.deployer.create(dep, user=None, start=False)
        if state is not State.STOPPED:
            self.deployer.restart(name, actor="test")
            await self.deployer.starting(name)
            if state in (State.READY, State.ASLEEP):
                await self.ready(name)
            if state is State.ASLEEP:
                self.deployer._ledger.mark_asleep(name)
            if state is State.FAILED:
                self.deployer.fail_start(name)
                await self.settled(name)
        return name

    async def ready(self, name: str) -> None:
        await self.deployer.starting(name)
        self.deployer.finish_start(name)
        await self.settled(name)

    async def settled(self, name: str) -> None:
        """Wait until no start or wake task runs for ``name`` any more."""
        task = self.deployer.starting_task(name)
        if task is not None:
            await asyncio.wait([task])

    def state(self, name: str) -> State:
        return self.deployer.get(name).state

    async def quiet(self) -> None:
        """Wait until no start attempt of the controller runs."""
        await until(lambda: all(task.done() for task in self.controller.state.attempts.values()))

    def idle_for(self, seconds: float) -> None:
        self.clock.advance(seconds)
        for name in self.sampler.samples:
            sample = self.sampler.samples[name]
            if sample is not None:
                self.sampler.samples[name] = Sample(self.clock(), sample.running, sample.waiting)

    def events(self, name: str | None = None) -> list[str]:
        return [row["text"] for row in self.store.list_events(1000, name)]

    def audit(self, action: str) -> list[dict[str, Any]]:
        return [row for row in self.store.list_audit(1000) if row["action"] == action]


@asynccontextmanager
async def harness(
    tmp_path: Path, capacity: float = 10, reader: Any = None, starts: int = 8, models: Any = None, **ondemand: Any
) -> AsyncIterator[Harness]:
    settings = OndemandSettings(
        **{
            "queue_timeout_s": 900,
            "idle_timeout_min_s": 1,
            "idle_timeout_s": 60,
            "stop_settle_s": 0.2,
            "counters_publish_s": 0,
            "waiter_wake_s": 15,
            "max_drain_wait_s": 0,  # the seed's rule; drain tests turn it on
            **ondemand,
        }
    )
    store = Store(tmp_path / f"h{id(settings)}.db")
    bus = EventBus(store)
    clock = Clock()
    runtime = FakeRuntime()
    metrics = Metrics(clock=clock)
    async with aiohttp.ClientSession() as http:
        deployer = GatedDeployer(
            DeployerSettings(max_concurrent_starts=starts),
            store,
            bus,
            MemoryBudget(MemorySettings(capacity_gib=capacity), reader),
            runtime,
            http,
            report=metrics,
            models=models,  # (a FakeModelFiles: hub models' files)
        )
        sampler = FakeSampler(clock)
        published: list[str] = []
        controller = Controller(
            settings,
            DeployerEffects(deployer, sampler, bus),
            published.append,  # type: ignore[arg-type]
            clock=clock,
            report=metrics,
        )
        metrics.watch(deployer)
        h = Harness(clock, deployer, runtime, sampler, controller, bus, store, published, metrics)
        try:
            yield h
        finally:
            controller.close()
            deployer.release()  # a failed test may leave stops held: shutdown must not wait on them
            await deployer.close()
            store.close()


async def until(check: Callable[[], object], limit: int = 10_000) -> None:
    """Let the loop run until ``check()`` holds (loop ticks, no wall-clock sleeps)."""
    for _ in range(limit):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def autostart(h: Harness, rng: Any, fail_rate: float = 0.0, max_ticks: int = 20) -> None:
    """Until cancelled: answer every engine start after a random number of loop ticks, failing
    a ``fail_rate`` share of them."""
    while True:
        pending = [dep_id for dep_id, fut in h.deployer.gates.items() if not fut.done()]
        for dep_id in pending:
            for _ in range(rng.randrange(max_ticks)):
                await asyncio.sleep(0)
            fut = h.deployer.gates.get(dep_id)
            if fut is not None and not fut.done():
                fut.set_result("engine exited (exit code 1)" if rng.random() < fail_rate else None)
        await asyncio.sleep(0)
