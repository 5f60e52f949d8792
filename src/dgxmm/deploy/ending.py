"""The end of a failed engine: the deployment marked failed with the reason and the engine's last
log lines, then its engine stopped. Its memory counts until the engine is gone.

``Ending`` serves the start and wake tasks (a start that failed) and the watchdog (an engine
that exited or hung). Nothing that may fail comes before the mark: the log tail is read with a
time limit and its failure becomes part of the reason; the event and the engine's stop come
after the mark and cannot undo it.

The record says failed at once, so nothing is granted to it any more, but its engine may hold its
memory until the stop has finished (up to the stop grace): until then the deployment is
``lingering`` and the budget counts it (budget.py). Then the deployer's listeners hear
``released``, and queued starts look again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from dgxmm.deploy.auditing import EventLog
from dgxmm.deploy.runtimes.base import Runtime, current_run
from dgxmm.records.deployment import Deployment, State
from dgxmm.settings import DeployerSettings
from dgxmm.logs import fields

log = logging.getLogger("dgxmm.deploy.deployer")

LOG_TAIL_TIMEOUT_S = 2.0  # how long marking a failure may wait for the engine's log tail
SHUTDOWN_REASON = "dgxmm stopped"  # the reason of an engine stopped by dgxmm's exit (reconcile restarts always-on ones)


class EndingWrites(Protocol):
    """What ending an engine may do to deployment records: the ledger's writes it makes (ledger.py)."""

    def peek(self, deployment_id: str) -> Deployment | None: ...

    def mark_failed(self, deployment_id: str, reason: str) -> Deployment: ...

    def declare_stopped(self, deployment_id: str, reason: str) -> Deployment: ...

    def released(self, deployment_id: str) -> None:
        """The failed deployment's engine is gone: its memory is free (listeners hear it)."""


class Ending:
    def __init__(
        self,
        settings: DeployerSettings,
        records: EndingWrites,
        runtime: Callable[[], Runtime],
        unwatch: Callable[[str], None],
        events: EventLog,
        release: Callable[[str], Awaitable[int]] | None = None,
    ) -> None:
        self._settings = settings
        self._records = records
        self._runtime = runtime
        self._unwatch = unwatch
        self._events = events
        self._release = release  # the page cache's release of a model's files (pagecache.py)
        self.lingering: set[str] = set()  # failed, their engines still being ended (memory held)

    async def fail(self, deployment_id: str, reason: str, *, from_states: tuple[State, ...]) -> None:
        """Mark failed with the reason and the engine's last log lines (of this run only: the
        reason must not grow with every attempt), if it is still in one of ``from_states``;
        then stop its engine."""
        tail = current_run(await self._log_tail(deployment_id))
        dep = self._records.peek(deployment_id)
        if dep is None or dep.state not in from_states:
            return
        full = reason + ("\n" + "\n".join(tail) if tail else "")
        self._unwatch(deployment_id)
        self.lingering.add(deployment_id)  # its memory is counted until its engine is gone
        try:
            self._records.mark_failed(deployment_id, full)
            try:
                self._events.event("deployer", deployment_id, f"Failed: {reason}")
            except Exception:
                log.exception("cannot record the failure of %s as an event", deployment_id)
            try:
                await self._runtime().stop(deployment_id, self._settings.stop_grace_s)
                await self.end_leftovers(deployment_id)
            except Exception:
                log.exception("cannot stop the failed engine of %s", deployment_id)
        finally:
            self.lingering.discard(deployment_id)
            if self._records.peek(deployment_id) is not None:
                self._records.released(deployment_id)

    async def end_leftovers(self, deployment_id: str) -> list[str]:
        """After an engine's stop: what of it still runs (a process that left its session, a
        container not removed) is ended, and an event says so, since its memory would still be
        held while nothing counts it; then its model files leave the page cache where the
        policy says so (pagecache.py), before the stop is recorded and the next fit check runs.
        Returns what was ended."""
        ended = await self._runtime().leftovers(deployment_id)
        if ended:
            text = f"Ended what the stopped engine left running: {', '.join(ended)}"
            log.warning("%s: %s", deployment_id, text, extra=fields(deployment_id))
            self._events.event("deployer", deployment_id, text)
        dep = self._records.peek(deployment_id)
        if self._release is not None and dep is not None:
            await self._release(dep.local_model)
        return ended

    async def stop_for_shutdown(self, deployment_id: str) -> None:
        """dgxmm is exiting and its engines cannot outlive it: stopped with their grace and
        recorded ``stopped`` with ``SHUTDOWN_REASON``, whatever they were doing."""
        try:
            await self._runtime().stop(deployment_id, self._settings.stop_grace_s)
        except Exception:
            log.exception("cannot stop the engine of %s at shutdown", deployment_id)
        try:
            self._records.declare_stopped(deployment_id, SHUTDOWN_REASON)
            self._events.event("deployer", deployment_id, "Stopped: dgxmm stopped")
        except Exception:
            log.exception("cannot record %s as stopped at shutdown", deployment_id)

    async def _log_tail(self, deployment_id: str) -> list[str]:
        """The engine's last log lines, or one line saying why they cannot be read."""
        try:
            async with asyncio.timeout(LOG_TAIL_TIMEOUT_S):
                return await self._runtime().logs(deployment_id, self._settings.log_tail_lines)
        except Exception as exc:  # noqa: BLE001 - a log read must never stop the marking
            log.warning("cannot read the log of %s: %r", deployment_id, exc)
            return [f"(the engine's log cannot be read: {type(exc).__name__}: {exc})"]
