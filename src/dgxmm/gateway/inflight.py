"""The caller keys' requests in flight, each with a way to end it (issue 47): what a revocation,
a narrowing of a key's models, its expiry or an administrator's ``end-requests`` ends at once,
instead of letting an answer run to its end with a key that no longer allows it.

A request a caller key admitted enters here with the model names it was let in by and the
cancel of its task. ``end`` gives it a reason (a ``Refused``) and cancels the task, as a hang-up
does: whatever it waits on stops (its engine connection closes, as on a hang-up), and the
gateway answers the reason: an error answer when nothing was sent yet, an error event and
``[DONE]`` inside an event stream, else a cut connection. An expiry is one timer per key with
requests open (armed when the first enters, moved when the expiry is), not a check per chunk.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from dgxmm.gateway.refused import Refused


class Key(Protocol):
    """A caller key as this registry reads it (``keyrecord.CallerKey``)."""

    @property
    def id(self) -> str: ...

    @property
    def expires_at(self) -> float | None: ...


class OpenRequest:
    """One request in flight: the names it was let in by, and why it was ended (None: it was not)."""

    __slots__ = ("_cancel", "names", "reason")

    def __init__(self, names: tuple[str, ...], cancel: Callable[[], object]) -> None:
        self.names = names
        self.reason: Refused | None = None
        self._cancel = cancel

    def end(self, reason: Refused) -> bool:
        """End it with ``reason`` (once: False when it was ended already)."""
        if self.reason is not None:
            return False
        self.reason = reason
        self._cancel()
        return True


class OpenRequests:
    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self._open: dict[str, set[OpenRequest]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}  # the expiries of keys with requests open

    def enter(self, key: Key, names: Iterable[str], cancel: Callable[[], object]) -> OpenRequest:
        """A request of ``key`` began (on the event loop); ``leave`` must follow."""
        request = OpenRequest(tuple(names), cancel)
        first = key.id not in self._open
        self._open.setdefault(key.id, set()).add(request)
        if first:
            self.arm(key)
        return request

    def leave(self, key: Key, request: OpenRequest) -> None:
        requests = self._open.get(key.id)
        if requests is None:
            return
        requests.discard(request)
        if not requests:
            del self._open[key.id]
            timer = self._timers.pop(key.id, None)
            if timer is not None:
                timer.cancel()

    def count(self, key_id: str) -> int:
        return len(self._open.get(key_id, ()))

    def end(self, key: Key, reason: Refused, allowed: Callable[[tuple[str, ...]], bool] | None = None) -> int:
        """End ``key``'s requests in flight with ``reason`` (only those whose names ``allowed``
        no longer admits, when given); how many were ended."""
        ended = 0
        for request in list(self._open.get(key.id, ())):
            if (allowed is None or not allowed(request.names)) and request.end(reason):
                ended += 1
        return ended

    def arm(self, key: Key) -> None:
        """Set (or move, or clear) the timer that ends ``key``'s requests at its expiry."""
        timer = self._timers.pop(key.id, None)
        if timer is not None:
            timer.cancel()
        if key.expires_at is None or key.id not in self._open:
            return
        delay = max(0.0, key.expires_at - self._wall())
        self._timers[key.id] = asyncio.get_running_loop().call_later(delay, self._expire, key)

    def _expire(self, key: Key) -> None:
        self._timers.pop(key.id, None)
        if key.expires_at is not None and self._wall() < key.expires_at:
            self.arm(key)  # the loop's clock ran ahead of the wall clock: later
            return
        if key.expires_at is not None:
            self.end(key, Refused(401, "key_expired", "the key has expired"))
