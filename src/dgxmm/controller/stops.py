"""Every stop the on-demand controller asks for, make-room's and the reaper's.

A stop goes through the deployer's precheck (the reaper's ``is_idle``, make-room's
``is_evictable`` or a drain's ``may_stop_drained``, run in the same plain call that marks the
deployment stopping), so a model that got a slot or a waiter meanwhile is not stopped. Only a
stop the precheck approved is recorded: the audit row (the deployer writes the stop's one event, with the reason given here), the metric by reason
(``make_room``, ``drain``, ``idle`` or ``unload``), and the grace clock (``ControllerState.last_stop``:
does_not_fit waits for a recent stop's memory to show as free), which ``ControllerState`` owns
and ``Stops`` tells through ``GraceClock``. The controller's reaper loop (``Controller.run``)
calls ``reap_once``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from dgxmm.controller import decide, texts
from dgxmm.controller.effects import Clock, Effects, Report
from dgxmm.errors import NotFound
from dgxmm.records.deployment import Deployment, State
from dgxmm.settings import OndemandSettings


class GraceClock(Protocol):
    """Where an approved stop's time is kept (``ControllerState``)."""

    def stop_approved(self) -> None:
        """An on-demand stop was approved now."""


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
            self._grace.stop_approved()
            self._report.stopped(deployment_id, reason)
            self._record(deployment_id, "ondemand_sleep", text)
        return approved

    async def unload(self, deployment_id: str, tracks: Mapping[str, decide.Track]) -> bool:
        """A caller's stop (Ollama's ``keep_alive: 0`` with an empty prompt): approved only for
        a ready on-demand deployment with nothing in flight and nobody waiting for it (``tracks``:
        the controller's, read in the precheck's call that marks it stopping), never a busy one."""

        def unused(dep: Deployment) -> bool:
            track = tracks.get(dep.id)
            busy = track is not None and (track.inflight > 0 or track.waiting > 0)
            return dep.is_on_demand and dep.state is State.READY and not busy

        return await self.stop(deployment_id, texts.UNLOADED, "unload", unused)

    async def reap_once(self, tracks: Mapping[str, decide.Track]) -> list[str]:
        """Stop every idle on-demand deployment; returns the ids stopped. ``tracks`` (the
        controller's) give each its idle timeout, a caller's keep_alive included, for the text."""
        idle = [dep for dep in self._effects.all() if self._is_idle(dep)]

        async def reap(dep: Deployment) -> str | None:
            track = tracks.get(dep.id)
            default = self._settings.idle_timeout_s
            seconds = decide.timeout_of(dep, track, default) if track else decide.idle_timeout(dep, default)
            return dep.id if await self.stop(dep.id, texts.idle_stop(seconds), "idle") else None

        return [dep_id for dep_id in await asyncio.gather(*(reap(d) for d in idle)) if dep_id]
