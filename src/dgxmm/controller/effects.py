"""Everything the controller reads of the world and does to it: one narrow interface, ``Effects``.

The controller decides (``decide.plan_attempt`` and friends) and acts only through it: the
deployment records and the budget, their starts, stops and mode switches (the deployer's), the
latest load of each engine (the metrics sampler's), and the record of what it did (the event
bus). Its shape is the controller's needs, not any one part's surface: every write is a named
operation (no generic update), and ``DeployerEffects`` puts it together from three Protocols of
what it needs of the deployer, the sampler and the bus, never the concrete classes (app.py hands
it the running service's parts; the type checker verifies they fit). Tests fake the whole with
one plain synchronous object (tests/unit/fake_effects.py), so decisions run with no I/O, and a
fake clock (``Clock``) moves timers by hand. ``Report`` is where it counts what happens (dgxmm's
metrics).

The contract that matters: ``restart`` and ``wake`` are plain (non-async) methods that check and
write in one step (fit check, state check, mark ``starting``), and ``stop`` runs its precheck
and marks ``stopping`` in one plain step before it awaits anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from dgxmm.deploy.budget import Snapshot
from dgxmm.deploy.placement import Need
from dgxmm.deploy.sampler import Sample
from dgxmm.records.changes import Listener, Precheck
from dgxmm.records.deployment import Deployment, Mode


class RecordPort(Protocol):
    """What the controller needs of the event bus: its event and audit rows."""

    def event(self, actor: str, deployment_id: str | None, text: str) -> object:
        """Store an event row (the deployment's activity log) and send it live."""

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
        """Store an audit row."""


class Effects(RecordPort, Protocol):
    """Everything the controller reads and does (module docstring); its records' rows as the bus's."""

    def peek(self, deployment_id: str) -> Deployment | None:
        """The stored record, or None when there is no such deployment. The controller only
        reads it (a stored record is never changed; every write stores a new one)."""

    def all(self) -> list[Deployment]:
        """Every stored record, read as ``peek``'s."""

    def snapshot(self, exclude: str | None = None) -> Snapshot:
        """The memory budget now, ``exclude`` left out (the figures of its fit check)."""

    def held_gib(self, dep: Deployment) -> float:
        """What ``dep`` frees when it stops: its declaration, or what it was measured at if more."""

    def need_of(self, dep: Deployment) -> Need:
        """What ``dep`` asks of the host's devices (its memory, how many devices, its pins)."""

    def devices_of(self, dep: Deployment) -> tuple[int, ...]:
        """The devices ``dep`` holds memory on while it does (a pooled host: its one device)."""

    def restart(
        self, deployment_id: str, *, actor: str, user: str | None = None, devices: Sequence[int] | None = None
    ) -> None:
        """Check and write: fit check (on ``devices`` when given), stopped or failed, mark
        starting, launch in the background. Raises InsufficientMemory, Conflict or NotFound with
        nothing changed."""

    def wake(self, deployment_id: str, *, actor: str, user: str | None = None) -> None:
        """As ``restart``, for an asleep engine."""

    async def sleep(self, deployment_id: str, *, actor: str, user: str | None = None) -> None:
        """Put a ready engine to sleep at its level (``Conflict`` when it cannot)."""

    async def stop(
        self,
        deployment_id: str,
        precheck: Precheck | None = None,
        *,
        actor: str,
        user: str | None = None,
        reason: str = "stopped",
    ) -> bool:
        """Run ``precheck`` on the current record and mark stopping in one plain step; then stop
        the engine (``reason``: the text of its event). True once an approved stop finished;
        False when refused or nothing to stop."""

    def prefetch(self, deployment_id: str) -> None:
        """Its start waits for room (it joined the memory queue): read its model's files into the
        page cache meanwhile (deploy/prefetch.py). Returns at once; never delays anything."""

    def prefetch_done(self, deployment_id: str) -> None:
        """Its wait is over (its start begins, or it was given up): stop reading for it now."""

    def switch_mode(self, deployment_id: str, mode: Mode, idle_timeout_s: float | None) -> None:
        """The mode and idle timeout now, no switch pending (not the state)."""

    def pend_mode(self, deployment_id: str, pending: Mode | None, idle_timeout_s: float | None) -> None:
        """A switch the deployer applies with the next state change (None: none pending), and
        the idle timeout; the mode itself unchanged."""

    def add_listener(self, listener: Listener) -> None:
        """Hear every change synchronously, after it is stored."""

    def add_idle_listener(self, listener: Callable[[str], None]) -> None:
        """Hear, synchronously, of each engine whose newest metrics sample turned idle (the
        sample a make-room stop of a victim waits for)."""

    def latest(self, deployment_id: str) -> Sample | None:
        """The newest metrics sample of a ready engine, if any."""


class Placement(Protocol):
    """What the controller needs of the deployer's memory budget."""

    def need_of(self, dep: Deployment) -> Need: ...

    def devices_of(self, dep: Deployment) -> tuple[int, ...]: ...


class DeployerPort(Protocol):
    """What the controller needs of the deployer (``deploy.deployer.Deployer`` satisfies it
    structurally; app.py hands it over)."""

    @property
    def budget(self) -> Placement: ...

    def peek(self, deployment_id: str) -> Deployment | None: ...

    def peek_all(self) -> list[Deployment]: ...

    def snapshot(self, exclude: str | None = None) -> Snapshot: ...

    def held_gib(self, dep: Deployment) -> float: ...

    def restart(
        self, deployment_id: str, *, actor: str, user: str | None = None, devices: Sequence[int] | None = None
    ) -> None: ...

    def wake(self, deployment_id: str, *, actor: str, user: str | None = None) -> None: ...

    async def sleep(self, deployment_id: str, *, actor: str, user: str | None = None) -> None: ...

    async def stop(
        self,
        deployment_id: str,
        precheck: Precheck | None = None,
        *,
        actor: str,
        user: str | None = None,
        reason: str = "stopped",
    ) -> bool: ...

    def switch_mode(self, deployment_id: str, mode: Mode, idle_timeout_s: float | None) -> None: ...

    def pend_mode(self, deployment_id: str, pending: Mode | None, idle_timeout_s: float | None) -> None: ...

    def add_listener(self, listener: Listener) -> None: ...


class SamplerPort(Protocol):
    """What the controller needs of the metrics sampler."""

    def latest(self, deployment_id: str) -> Sample | None: ...

    def add_idle_listener(self, listener: Callable[[str], None]) -> None: ...


class Report(Protocol):
    """What the controller counts, where it happens (dgxmm's metrics implement it)."""

    def waited(self, deployment_id: str, seconds: float, outcome: str) -> None:
        """A request that got no slot at once stopped waiting: granted, refused or gone."""

    def queued(self, deployment_id: str) -> None:
        """A request had to queue for memory."""

    def started_for_requests(self, deployment_id: str, *, woke: bool) -> None:
        """A start (or wake) was made for waiting requests."""

    def stopped(self, deployment_id: str, reason: str) -> None:
        """An approved on-demand stop, by ``reason``: ``make_room`` (room for a start),
        ``drain`` (a queued request's engines stopped once what they ran finished), ``idle``
        (the reaper) or ``unload`` (a caller's ``keep_alive: 0`` on the Ollama API)."""

    def start_failed(self, deployment_id: str) -> None:
        """A start or wake made for requests failed."""


class Unreported:
    """The report of a controller built without one (tests): nothing is kept."""

    def waited(self, deployment_id: str, seconds: float, outcome: str) -> None:
        pass

    def queued(self, deployment_id: str) -> None:
        pass

    def started_for_requests(self, deployment_id: str, *, woke: bool) -> None:
        pass

    def stopped(self, deployment_id: str, reason: str) -> None:
        pass

    def start_failed(self, deployment_id: str) -> None:
        pass


class PrefetchPort(Protocol):
    """What the effects use of the prefetcher (deploy/prefetch.py)."""

    def want(self, deployment_id: str, model: str, reservation_gib: float) -> None: ...

    def cancel(self, deployment_id: str) -> None: ...


class DeployerEffects:
    """``Effects`` from the running service's parts: the deployer, the metrics sampler and the
    event bus. The readers are bound here once, so a call costs what a direct one does (the
    gateway's hot path asks ``peek`` for every request)."""

    def __init__(
        self, deployer: DeployerPort, sampler: SamplerPort, bus: RecordPort, prefetcher: PrefetchPort | None = None
    ) -> None:
        self._deployer = deployer
        self._prefetcher = prefetcher  # None: [memory] prefetch = false
        self.peek = deployer.peek
        self.all = deployer.peek_all
        self.snapshot = deployer.snapshot
        self.held_gib = deployer.held_gib
        self.need_of = deployer.budget.need_of
        self.devices_of = deployer.budget.devices_of
        self.restart = deployer.restart
        self.wake = deployer.wake
        self.sleep = deployer.sleep
        self.stop = deployer.stop
        self.add_listener = deployer.add_listener
        self.switch_mode = deployer.switch_mode
        self.pend_mode = deployer.pend_mode
        self.latest = sampler.latest
        self.add_idle_listener = sampler.add_idle_listener
        self.event = bus.event
        self.audit = bus.audit

    def prefetch(self, deployment_id: str) -> None:
        dep = self._deployer.peek(deployment_id)
        if self._prefetcher is not None and dep is not None:
            self._prefetcher.want(deployment_id, dep.local_model, dep.memory_gib)

    def prefetch_done(self, deployment_id: str) -> None:
        if self._prefetcher is not None:
            self._prefetcher.cancel(deployment_id)


class Clock(Protocol):
    def __call__(self) -> float:
        """Now, in seconds (monotonic)."""

    async def wait(self, event: asyncio.Event, seconds: float) -> None:
        """Return when ``event`` is set or ``seconds`` of this clock have passed."""


class MonotonicClock:
    def __call__(self) -> float:
        return time.monotonic()

    async def wait(self, event: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(seconds, 0.0)):
                await event.wait()
