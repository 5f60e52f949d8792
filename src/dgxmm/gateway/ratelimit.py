"""Failed key checks per peer: after ``limit`` failures in a window, refuse the rest of it.

The gateway counts wrong on-demand keys with it, and the admin API (``api.guard``, a layer
above) wrong admin tokens, each with a limiter of its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Window:
    start: float
    failures: int = 0


class FailureLimiter:
    def __init__(self, limit: int, window_s: float, clock: Callable[[], float] = time.monotonic):
        self.limit = limit
        self._window = window_s
        self._clock = clock
        self._peers: dict[str, _Window] = {}

    def exhausted(self, peer: str) -> bool:
        """Whether ``peer`` used up its failures for the current window."""
        window = self._current(peer)
        return window is not None and window.failures >= self.limit

    def retry_after(self, peer: str) -> int:
        """Whole seconds until ``peer``'s window ends (at least 1), for a ``Retry-After``."""
        window = self._current(peer)
        return 1 if window is None else max(1, math.ceil(window.start + self._window - self._clock()))

    def failed(self, peer: str) -> None:
        window = self._current(peer)
        if window is None:
            window = self._peers[peer] = _Window(self._clock())
        window.failures += 1
        if len(self._peers) > 10_000:
            self._prune()

    def clear(self) -> None:
        self._peers.clear()

    def _current(self, peer: str) -> _Window | None:
        window = self._peers.get(peer)
        if window is not None and self._clock() - window.start >= self._window:
            del self._peers[peer]
            return None
        return window

    def _prune(self) -> None:
        now = self._clock()
        for peer in [p for p, w in self._peers.items() if now - w.start >= self._window]:
            del self._peers[peer]
