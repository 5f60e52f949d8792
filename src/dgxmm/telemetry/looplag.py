"""The event loop's lag, measured from inside: how late a short periodic timer fires.

Why: one asyncio loop owns all of dgxmm's state and serves every request, so a callback that
computes for a second (a large view built on the loop, a file parsed without a thread) holds
every gateway request up for that second, and no request's own duration can tell that from a
busy machine. uvicorn, Node (``monitorEventLoopDelay``) and Go services export the same figure.

Each tick asks for ``interval_s`` of sleep and records how much later it woke: the lag, what
any callback ready at that moment waited. A lag has two causes, and the probe tells them apart
with the loop thread's CPU time: the loop computing (a blocked loop, dgxmm's own fault) or the
process waiting for a CPU (a busy machine: lag without CPU). The CPU part of a lag is the
thread's CPU over the whole tick less the ``interval_s`` before it was due (the thread can have
computed at most that long by then): a lower bound of what it computed while the timer was
late, which a busy machine cannot inflate. A loop blocked in a system call that does not compute
(a blocking read, a lock) shows as lag only. The CPU clock is the loop thread's own
(``time.thread_time``), so a worker thread's work (``asyncio.to_thread``) never counts.

Cost: one timer every 50 ms, 0.4-0.6 % of one core on a shared 2-core machine, most of it the
wake-up any 50 ms timer costs (docs/performance.md, "The loop-lag probe's cost").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from dgxmm.telemetry import catalog as c
from dgxmm.telemetry.stats import Buckets

INTERVAL_S = 0.05  # short enough to see a 0.1 s stall, long enough to cost nothing


@dataclass(frozen=True)
class Lag:
    seconds: float  # how late the timer fired
    cpu_s: float  # the part of it the loop thread spent computing


class LoopLag:
    """The probe (``run``, a background task) and its two histograms; ``mark`` and ``worst``
    give the longest lag of a window (tests: the loop while something ran)."""

    def __init__(
        self,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.interval_s, self.clock, self.cpu = interval_s, clock, cpu
        self.lag = Buckets(c.LOOP_LAG.buckets)
        self.lag_cpu = Buckets(c.LOOP_LAG_CPU.buckets)
        self._due: float | None = None  # when the pending tick should fire; None: not running
        self._began = self._cpu_at = 0.0  # the clock and the loop thread's CPU clock as that tick began
        self._worst = Lag(0.0, 0.0)
        self._mark = (0.0, 0.0)  # the clocks at ``mark``: a lag under way then counts from there

    async def run(self) -> None:
        try:
            while True:
                self._cpu_at, self._began = self.cpu(), self.clock()
                self._due = self._began + self.interval_s
                await asyncio.sleep(self.interval_s)
                late = self._late()
                self.lag.observe(late.seconds)
                self.lag_cpu.observe(late.cpu_s)
                self._worst = max(self._worst, self._late(*self._mark), key=lambda lag: lag.seconds)
        finally:
            self._due = None

    def _late(self, since: float = 0.0, cpu_since: float = 0.0) -> Lag:
        """The pending tick's lag so far, counted from ``since`` at the earliest (0 while it is
        not due yet), and the CPU the loop's thread spent in it, at least."""
        if self._due is None:
            return Lag(0.0, 0.0)
        seconds = max(0.0, self.clock() - max(self._due, since))
        before_due = max(0.0, self._due - max(self._began, since))  # wall time it may have computed in
        computed = self.cpu() - max(self._cpu_at, cpu_since) - before_due
        return Lag(seconds, min(seconds, max(0.0, computed)))

    def mark(self) -> None:
        """Start a window: ``worst`` counts the lags from now on."""
        self._worst, self._mark = Lag(0.0, 0.0), (self.clock(), self.cpu())

    def worst(self) -> Lag:
        """The longest lag since ``mark``, the one under way included (a stall that has just
        ended is counted before its tick runs). Called on the loop's thread (its CPU clock)."""
        return max(self._worst, self._late(*self._mark), key=lambda lag: lag.seconds)
