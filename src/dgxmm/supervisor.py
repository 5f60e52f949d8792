"""One supervisor for every long-lived background task of dgxmm.

The watchdog of each deployment, the reaper, the metrics sampler, the LiteLLM sync, the peer
refresh and the key re-check each run as a coroutine the supervisor starts and keeps alive. When
one raises, the supervisor logs the traceback, records an event (``Background task metrics-sampler
failed: RuntimeError: …; restarting in 1 s``), waits, and starts it again: the wait doubles from
``initial_backoff_s`` up to ``max_backoff_s`` and starts over once the task has run
``healthy_after_s`` without failing. A task that returns has finished (a watchdog whose
deployment left ``ready``) and is forgotten. ``health()`` is what ``GET /api/host`` lists.

Nothing the supervisor does on a failure may fail in turn: the event goes to a store that may be
the very thing that is broken, so recording it is best effort and the restart happens anyway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

TaskFactory = Callable[[], Coroutine[Any, Any, None]]


class Events(Protocol):
    def event(self, actor: str, deployment_id: str | None, text: str) -> Any: ...


@dataclass(eq=False)
class _Entry:
    name: str
    factory: TaskFactory
    deployment_id: str | None
    task: asyncio.Task[None] | None = None
    running: bool = False
    restarts: int = 0
    last_error: str | None = None
    last_error_at: float | None = None
    started_at: float = field(default_factory=time.monotonic)


class Supervisor:
    def __init__(
        self,
        events: Events | None = None,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        healthy_after_s: float = 60.0,
    ) -> None:
        self._events = events
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.healthy_after_s = healthy_after_s
        self._entries: dict[str, _Entry] = {}
        self._closed = False

    def start(self, name: str, factory: TaskFactory, *, deployment_id: str | None = None) -> None:
        """Run ``factory()`` as the task ``name`` (replacing a task of that name)."""
        if self._closed:
            return
        self.stop(name)
        entry = _Entry(name, factory, deployment_id)
        self._entries[name] = entry
        entry.task = asyncio.create_task(self._run(entry), name=name)

    def stop(self, name: str) -> None:
        """Cancel and forget the task ``name``. Called from inside that task itself (a watchdog
        that marked its deployment failed), it is only forgotten: it ends when it returns."""
        entry = self._entries.pop(name, None)
        if entry is not None and entry.task is not None and entry.task is not asyncio.current_task():
            entry.task.cancel()

    def names(self) -> list[str]:
        return list(self._entries)

    async def close(self) -> None:
        """Cancel every task and wait until all have ended; nothing starts afterwards."""
        self._closed = True
        tasks = [entry.task for entry in self._entries.values() if entry.task is not None]
        self._entries.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def health(self) -> list[dict[str, Any]]:
        return [
            {
                "name": e.name,
                "deployment_id": e.deployment_id,
                "running": e.running,
                "restarts": e.restarts,
                "last_error": e.last_error,
                "last_error_at": e.last_error_at,
            }
            for e in self._entries.values()
        ]

    async def _run(self, entry: _Entry) -> None:
        backoff = self.initial_backoff_s
        try:
            while True:
                entry.running, entry.started_at = True, time.monotonic()
                try:
                    await entry.factory()
                    return
                except Exception as exc:
                    if time.monotonic() - entry.started_at >= self.healthy_after_s:
                        backoff = self.initial_backoff_s
                    entry.running = False
                    entry.restarts += 1
                    entry.last_error = f"{type(exc).__name__}: {exc}"
                    entry.last_error_at = time.time()
                    log.error("background task %s failed; restarting in %g s", entry.name, backoff, exc_info=exc)
                    self._record(entry, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
        finally:
            entry.running = False
            if self._entries.get(entry.name) is entry:
                del self._entries[entry.name]

    def _record(self, entry: _Entry, backoff: float) -> None:
        if self._events is None:
            return
        text = f"Background task {entry.name} failed: {entry.last_error}; restarting in {backoff:g} s"
        try:
            self._events.event("supervisor", entry.deployment_id, text[:2000])
        except Exception as exc:  # noqa: BLE001 - the store may be what failed
            log.warning("cannot record the failure of %s as an event: %s", entry.name, exc)
