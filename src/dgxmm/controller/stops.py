"""Every stop the on-demand controller asks for, make-room's and the reaper's.

A stop goes through the deployer's precheck (the reaper's ``is_idle``, make-room's
``is_evictable`` or a drain's ``may_stop_drained``, run in the same plain call that marks the
deployment stopping), so a model that got a slot or a waiter meanwhile is not stopped. Only a
stop the precheck approved is recorded: the audit row (the deployer writes the stop's one event, with the reason given here), the metric by reason
(``make_room``, ``drain`` or ``idle``), and the grace clock (``ControllerState.last_stop``:
does_not_fit waits for a recent stop's memory to show as free), which ``ControllerState`` owns
and ``Stops`` sets through ``GraceClock``. The controller's reaper loop (``Controller.run``)
calls ``reap_once``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from dgxmm.controller import decide, texts
from dgxmm.controller.effects import Clock, Effects, Report
from dgxmm.errors import NotFound
from dgxmm.records.deployment import Deployment
from dgxmm.settings import OndemandSettings


class GraceClock(Protocol):
    """Where an approved stop's time is kept (``ControllerState``)."""

    last_stop: float


class Stops:
    def __init__(
        self,
        settings: OndemandSettings,
        effects: Effects,
        is_idle: Callable[[Deployment], bool],
        clock: Clock,
        report: Report,
        record: Callable[[str, str, str], None],
        grace: GraceClock,
    ) -> None:
        self._settings = settings
        self._effects = effects
        self._is_idle = is_idle
        self._clock = clock
        self._report = report
        self._record = record  # (deployment id, audit action, text): the audit row (the deployer's event says it)
        self._grace = grace

    async def stop(
        self, deployment_id: str, text: str, reason: str, precheck: Callable[[Deployment], bool] | None = None
    ) -> bool:
        """Stop through the deployer's precheck (the reaper's idle rule unless another is given:
        make-room's, a drain's); True when the stop was approved and done."""
        try:
            approved = await self._effects.stop(deployment_id, precheck or self._is_idle, actor="ondemand", reason=text)
        except NotFound:  # removed meanwhile: nothing to stop
            return False
        if approved:
            self._grace.last_stop = self._clock()
            self._report.stopped(deployment_id, reason)
            self._record(deployment_id, "ondemand_sleep", text)
        return approved

    async def reap_once(self) -> list[str]:
        """Stop every idle on-demand deployment; returns the ids stopped."""
        idle = [dep for dep in self._effects.all() if self._is_idle(dep)]

        async def reap(dep: Deployment) -> str | None:
            seconds = decide.idle_timeout(dep, self._settings.idle_timeout_s)
            return dep.id if await self.stop(dep.id, texts.idle_stop(seconds), "idle") else None

        return [dep_id for dep_id in await asyncio.gather(*(reap(d) for d in idle)) if dep_id]
