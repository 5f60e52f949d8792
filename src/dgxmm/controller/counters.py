"""Live counters: publish a deployment's view when its in-flight or queued counts change, at most
once a second per deployment: the first change at once, later ones folded into one event a second
after the previous one, carrying the counts as they are then."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class CounterPublisher:
    def __init__(self, publish: Callable[[str], None], interval_s: float) -> None:
        self._publish = publish
        self._interval = interval_s
        self._last: dict[str, float] = {}
        self._pending: dict[str, asyncio.TimerHandle] = {}

    def changed(self, deployment_id: str) -> None:
        if deployment_id in self._pending:
            return  # folded into the event already scheduled
        now = time.monotonic()
        due = self._last.get(deployment_id, float("-inf")) + self._interval
        if now >= due:
            self._fire(deployment_id)
        else:
            loop = asyncio.get_running_loop()
            self._pending[deployment_id] = loop.call_later(due - now, self._fire, deployment_id)

    def _fire(self, deployment_id: str) -> None:
        self._pending.pop(deployment_id, None)
        self._last[deployment_id] = time.monotonic()
        self._publish(deployment_id)

    def forget(self, deployment_id: str) -> None:
        handle = self._pending.pop(deployment_id, None)
        if handle is not None:
            handle.cancel()
        self._last.pop(deployment_id, None)

    def close(self) -> None:
        for deployment_id in list(self._pending):
            self.forget(deployment_id)
