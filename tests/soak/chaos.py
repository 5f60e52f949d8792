"""The soak's faults, one every ``PERIOD_S`` in turn, and one SIGTERM and restart of dgxmm in the
middle. Each is recorded as a ``Fault`` with the window in which the failures it causes may end,
and which failures those are (``explains``): a request that failed outside every fault's window
or of another kind is a failure dgxmm must not have.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dgxmm_process import engine_pids
from fleet import HANG_BOUND_S, STOP_GRACE_S, Deployments, Fleet
from traffic import Outcome

PERIOD_S = 9.0
KILL_WINDOW_S = 10.0  # a killed engine: its requests end at once, the restart takes a moment
STOP_WINDOW_S = HANG_BOUND_S + 8.0  # a hung engine: found within the bound, then replaced
ROTATION_WINDOW_S = 2.0  # callers switch to the new key within a second of the new file
MODE_S = 10.0  # how long a llama model stays switched to always on


@dataclass(frozen=True)
class Fault:
    kind: str
    at: float
    until: float
    deployment: str | None = None  # None: every deployment

    def explains(self, out: Outcome) -> bool:
        """Whether ``out``'s failure is this fault's doing."""
        if out.began > self.until or out.ended < self.at:
            return False
        if self.deployment is not None and out.deployment != self.deployment:
            return False
        if self.kind == "key rotation":
            return out.status == 401
        if self.kind == "mode switch":
            return out.code == "not_on_demand"
        if self.kind in ("engine SIGKILL", "engine SIGSTOP"):
            return out.kind in ("cut", "stream_error", "error") and out.code in ("ondemand_upstream_error", None)
        return True  # a dgxmm restart: anything may fail while it is down


@dataclass
class Chaos:
    fleet: Fleet
    deps: Deployments
    switch_key: Callable[[str], None]
    faults: list[Fault] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    switched: str | None = None  # the llama model switched to always on now

    async def run(self, stop: asyncio.Event, restart_at: float, restart: Callable[[], object]) -> None:
        """Faults in turn every ``PERIOD_S`` until ``stop``; at ``restart_at`` (monotonic) the
        restart instead."""
        actions = [self._kill_faulty, self._rotate_key, self._stop_faulty, self._switch_mode, self._kill_llama]
        turn = 0
        restarted = False
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PERIOD_S)
            if stop.is_set():
                return
            if not restarted and time.monotonic() >= restart_at:
                restarted = True
                began = time.monotonic()
                await restart()
                self.faults.append(Fault("dgxmm restart", began, time.monotonic() + 3.0))
                continue
            await actions[turn % len(actions)]()
            turn += 1

    def _signal_engine(self, deployment_id: str, sig: signal.Signals) -> list[int]:
        """Signal the engine of a ready deployment (a starting one would fail its start, and
        rightly be refused new starts for a while: that is not the fault under test)."""
        view = self.fleet.admin("GET", f"/deployments/{deployment_id}")
        if view.status_code != 200 or view.json()["state"] != "ready":
            return []
        pids = engine_pids(deployment_id)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return pids

    async def _kill_faulty(self) -> None:
        self._kill(self.deps.faulty)

    async def _kill_llama(self) -> None:
        running = [dep for dep in self.deps.llamas if dep != self.switched and engine_pids(dep)]
        if not running:
            self.skipped.append("engine SIGKILL of a llama model: none ran")
            return
        self._kill(running[0])

    def _kill(self, deployment_id: str) -> None:
        now = time.monotonic()
        if not self._signal_engine(deployment_id, signal.SIGKILL):
            self.skipped.append(f"engine SIGKILL of {self.deps.names[deployment_id]}: it was not ready")
            return
        self.faults.append(Fault("engine SIGKILL", now, now + KILL_WINDOW_S, deployment_id))

    async def _stop_faulty(self) -> None:
        now = time.monotonic()
        pids = self._signal_engine(self.deps.faulty, signal.SIGSTOP)
        if not pids:
            self.skipped.append("engine SIGSTOP of faulty: it was not ready")
            return
        self.faults.append(Fault("engine SIGSTOP", now, now + STOP_WINDOW_S, self.deps.faulty))
        await asyncio.sleep(HANG_BOUND_S + STOP_GRACE_S + 1)
        for pid in pids:  # dgxmm ended it long ago; this only matters if it did not
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    async def _rotate_key(self) -> None:
        now = time.monotonic()
        new = self.fleet.rotate_key()
        await asyncio.sleep(1.0)  # dgxmm looks at the file every 0.2 s; LiteLLM would take longer
        self.switch_key(new)
        self.faults.append(Fault("key rotation", now, now + ROTATION_WINDOW_S))

    async def _switch_mode(self) -> None:
        """A ready llama model switched to always on and, a while later, back (a stopped one
        would be started by the switch, which needs memory the others may hold)."""
        views = await asyncio.to_thread(self.fleet.admin, "GET", "/deployments")
        ready = [v["id"] for v in views.json() if v["id"] in self.deps.llamas and v["state"] == "ready"]
        if not ready:
            self.skipped.append("mode switch: no llama model was ready")
            return
        dep = ready[0]
        self.switched = dep
        now = time.monotonic()
        to = await asyncio.to_thread(self.fleet.admin, "PATCH", f"/deployments/{dep}/mode", json={"mode": "always_on"})
        if to.status_code != 200:
            self.skipped.append(f"mode switch: {to.status_code} {to.text[:100]}")
            return
        await asyncio.sleep(MODE_S)
        back = await asyncio.to_thread(
            self.fleet.admin, "PATCH", f"/deployments/{dep}/mode", json={"mode": "on_demand", "idle_timeout_s": 6}
        )
        self.faults.append(Fault("mode switch", now, time.monotonic() + 2.0, dep))
        self.switched = None
        if back.status_code != 200:
            self.skipped.append(f"mode switch back: {back.status_code} {back.text[:100]}")
