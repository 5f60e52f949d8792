"""Requests the gateway refused before they showed a valid key: counted, sampled, summarised.

A request without credentials, with a wrong key, from a peer the guard refuses, rate-limited or
over the gateway's share costs its sender nothing, and a web page the operator opens can send
thousands a second (a no-cors POST). Recorded one by one, such requests would push served
requests out of the activity log, its file and dgxmm's log, and drop the console's activity
streams. So none of them is recorded one by one: each is counted per peer and reason for a
window (a minute), the first few of each window are written as full access lines (so a
caller's request id can still be found), and when the window ends one line per group says what
came, e.g. ``1204 requests from 127.0.0.1 refused in the last 60 s: 401 invalid_api_key``. The
last windows' summaries stay in memory for ``GET /api/activity/refused``. Metrics count every
one (their labels are bounded).

Everything here is bounded whatever is sent: at most ``MAX_GROUPS`` peer-and-reason groups a
window (the rest counted in one "other peers" group), ``SAMPLES`` full lines a window, and
``KEEP`` summaries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dgxmm.gateway.exchange import GONE, Exchange

log = logging.getLogger(__name__)

WINDOW_S = 60.0
MAX_GROUPS = 256  # peer-and-reason groups counted apart in one window
SAMPLES = 10  # refused requests written as full access lines in one window, in all
KEEP = 1000  # summaries kept (a group's window each), newest last
LOGGED = 20  # groups logged one line each when a window ends; the rest in one line
OTHER_PEERS = "other peers"


@dataclass
class Group:
    """One peer's refusals for one reason within the window."""

    peer: str
    status: int
    reason: str
    count: int = 0
    first_request_id: str = ""


def reason_of(ex: Exchange) -> str:
    """Why the request ended unanswered by an engine: its error code, or ``hang_up``."""
    return ex.code or ("hang_up" if ex.status == GONE else f"status_{ex.status}")


class Refusals:
    def __init__(
        self,
        window_s: float = WINDOW_S,
        sample: Callable[[str, str, Exchange], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._window_s = window_s
        self._sample = sample  # writes a refused request's full access line (method, path, ex)
        self._clock = clock
        self._wall = wall
        self._began = 0.0  # the window's start (monotonic), 0.0 while none is open
        self._began_wall = 0.0
        self._groups: dict[tuple[str, str], Group] = {}
        self._sampled = 0
        self._timer: asyncio.TimerHandle | None = None
        self._summaries: deque[dict[str, Any]] = deque(maxlen=KEEP)
        self.total = 0  # every refused request counted here since the start

    def add(self, method: str, path: str, ex: Exchange) -> None:
        """One refused request ended (on the event loop's thread, like every gateway request)."""
        now = self._clock()
        if self._began and now - self._began >= self._window_s:
            self.flush()
        if not self._began:
            self._began, self._began_wall = now, self._wall()
            self._arm()
        self.total += 1
        reason = reason_of(ex)
        key = (ex.peer, reason)
        group = self._groups.get(key)
        if group is None:
            if len(self._groups) >= MAX_GROUPS:
                key = (OTHER_PEERS, reason)
                group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = Group(key[0], ex.status, reason, first_request_id=ex.request_id)
        group.count += 1
        if self._sampled < SAMPLES and group.count == 1:
            self._sampled += 1
            if self._sample is not None:
                self._sample(method, path, ex)

    def flush(self) -> None:
        """End the window: one summary per group, kept and logged (at most ``LOGGED`` lines)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._began:
            return
        took = min(self._clock() - self._began, self._window_s)
        groups = sorted(self._groups.values(), key=lambda g: g.count, reverse=True)
        for group in groups:
            self._summaries.append(self._summary(group, self._began_wall, took))
        for group in groups[:LOGGED]:
            log.warning(
                "%d request%s from %s refused in the last %.0f s: %d %s (first: request id %s)",
                group.count,
                "" if group.count == 1 else "s",
                group.peer,
                took,
                group.status,
                group.reason,
                group.first_request_id,
            )
        if len(groups) > LOGGED:
            rest = groups[LOGGED:]
            log.warning(
                "and %d requests from %d more peer-and-reason groups refused in the same %.0f s",
                sum(g.count for g in rest),
                len(rest),
                took,
            )
        self._groups, self._sampled, self._began = {}, 0, 0.0

    def report(self) -> dict[str, Any]:
        """What ``GET /api/activity/refused`` shows: the window running now and the last
        windows' summaries, newest first."""
        if self._began and self._clock() - self._began >= self._window_s:
            self.flush()
        running = self._clock() - self._began if self._began else 0.0
        current = [
            self._summary(g, self._began_wall, running)
            for g in sorted(self._groups.values(), key=lambda g: g.count, reverse=True)
        ]
        return {
            "window_s": self._window_s,
            "total": self.total,
            "current": current,
            "recent": list(reversed(self._summaries)),
        }

    def close(self) -> None:
        """At shutdown: the running window's summary is written."""
        self.flush()

    def _arm(self) -> None:
        """End the window on the clock too, so the summary is written when the flood stops."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on a loop (a unit test): the next add or report ends it
            return
        self._timer = loop.call_later(self._window_s, self.flush)

    @staticmethod
    def _summary(group: Group, since: float, seconds: float) -> dict[str, Any]:
        return {
            "since": round(since, 3),
            "seconds": round(seconds, 3),
            "peer": group.peer,
            "status": group.status,
            "reason": group.reason,
            "count": group.count,
            "first_request_id": group.first_request_id,
        }
