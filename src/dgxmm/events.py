"""The in-process event bus: stored event and audit rows, and live messages for SSE subscribers.

Publishing never blocks and never awaits, so the deployer and the controller can publish from
inside their critical sections. A subscriber that falls too far behind is dropped (its stream
ends and the browser reconnects) rather than letting memory grow without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from dgxmm.store.db import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Message:
    kind: str  # "deployment" (data: a view) or "log" (data: an event row)
    data: dict[str, Any]


class Subscription:
    """One live listener; iterate it to receive messages until it is closed or dropped."""

    def __init__(self, bus: EventBus, maxsize: int) -> None:
        self._bus = bus
        self._queue: asyncio.Queue[Message | None] = asyncio.Queue(maxsize)

    def offer(self, message: Message) -> bool:
        try:
            self._queue.put_nowait(message)
        except asyncio.QueueFull:
            return False
        return True

    def end(self) -> None:
        """Wake the reader with an end marker, even if the queue is full."""
        while True:
            try:
                self._queue.put_nowait(None)
                return
            except asyncio.QueueFull:
                self._queue.get_nowait()

    def close(self) -> None:
        self._bus.unsubscribe(self)

    async def __aiter__(self) -> AsyncIterator[Message]:
        while (message := await self._queue.get()) is not None:
            yield message


class EventBus:
    def __init__(self, store: Store, subscriber_backlog: int = 1000) -> None:
        self._store = store
        self._backlog = subscriber_backlog
        self._subscribers: set[Subscription] = set()

    def subscribe(self) -> Subscription:
        sub = Subscription(self, self._backlog)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        message = Message(kind, data)
        for sub in list(self._subscribers):
            if not sub.offer(message):
                log.warning("dropping an event subscriber that fell %d messages behind", self._backlog)
                self._subscribers.discard(sub)
                sub.end()

    def close(self) -> None:
        for sub in list(self._subscribers):
            sub.end()
        self._subscribers.clear()

    def event(self, actor: str, deployment_id: str | None, text: str) -> dict[str, Any]:
        """Store an event row and send it live."""
        now = time.time()
        row = {"time": now, "actor": actor, "deployment_id": deployment_id, "text": text}
        self._store.add_event(now, actor, deployment_id, text)
        self.publish("log", row)
        log.info("[%s] %s%s", actor, f"{deployment_id}: " if deployment_id else "", text)
        return row

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
        """Store an audit row: who did what to which deployment, with the values before and after."""
        self._store.add_audit(
            {
                "time": time.time(),
                "user": user,
                "actor": actor,
                "action": action,
                "deployment_id": deployment_id,
                "old": old,
                "new": new,
                "text": text,
            }
        )
