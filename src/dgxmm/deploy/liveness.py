"""Whether a running engine is alive: its health check, and the signs of life besides it.

Real engines answer ``/health`` slowly exactly when they are busiest (vLLM's CPU build starves its
own API server while it generates; an engine on a loaded GPU host stalls its HTTP thread for
seconds), so a failed health check alone says little. An engine that shows another sign of life
is alive, whatever its health check says:

* bytes of an answer arriving from it on any request in flight (the gateway's engine client
  counts its reads);
* a metrics page it answered (the metrics sampler's newest sample).

``Liveness`` gathers these signs from their owners (registered as sources by the composition
root, so this module depends on none of them); ``HangCheck`` is the watchdog's rule, a pure
function of what it observed: an engine is hung when its health check failed ``failures_needed``
times in a row and no other sign of life came since the first of those failures.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

Source = Callable[[str], Hashable]  # a value that changes whenever the engine showed life


class Liveness:
    """The signs of life of each deployment's engine, from every registered source."""

    def __init__(self) -> None:
        self._sources: list[Source] = []

    def add_source(self, source: Source) -> None:
        self._sources.append(source)

    def signs(self, deployment_id: str) -> tuple[Hashable, ...]:
        """What the sources report now: a different value than before means a sign of life."""
        return tuple(source(deployment_id) for source in self._sources)


class HangCheck:
    """The verdict on one engine, one observation per watchdog tick (no I/O, no clock)."""

    def __init__(self, failures_needed: int, signs: Hashable) -> None:
        self.failures_needed = failures_needed
        self.failures = 0  # failed health checks in a row, with no other sign of life since
        self._signs = signs

    def observe(self, healthy: bool, signs: Hashable) -> bool:
        """One tick: the health check's outcome and the signs of life now. True: hung."""
        alive = signs != self._signs
        self._signs = signs
        if healthy or alive:
            self.failures = 0
            return False
        self.failures += 1
        return self.failures >= self.failures_needed
