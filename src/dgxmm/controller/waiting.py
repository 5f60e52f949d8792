"""The requests waiting now, as the admin API lists them, and an administrator's cancel of one.

Both read ``ControllerState``'s view (the waiters in arrival order, ``by_id``), on the event
loop's thread; a cancel is one plain call to its owner (``ControllerState.cancel``) that gives the
waiter its error (503 ``ondemand_cancelled``) and wakes it alone; the waiter leaves as on any refusal
(the memory queue's entry with its last waiter, and a slot handed to it at that moment goes to
the next in line).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dgxmm.controller import turns
from dgxmm.controller.effects import Clock
from dgxmm.controller.errors import Cancelled
from dgxmm.controller.slots import Waiter
from dgxmm.controller.state import ControllerState
from dgxmm.records.deployment import Deployment


class WaitingList:
    def __init__(self, state: ControllerState, peek: Callable[[str], Deployment | None], clock: Clock) -> None:
        self._state = state
        self._peek = peek
        self._clock = clock

    def rows(self, deployment_id: str | None = None) -> list[dict[str, Any]]:
        """The requests waiting now (of one deployment, or all), oldest first: each with its
        id (what a cancel names), the gateway's request id, the deployment, since when it waits
        and until when (its queue timeout), what it waits for (``turns.WaitsFor``), its priority
        (its caller's), its place in its deployment's line (by priority, then arrival:
        ``ControllerState.line``) and whether it got the queued notice. Requests handed a
        slot or refused already are not waiting any more."""
        state = self._state
        ids = list(state.waiters) if deployment_id is None else [deployment_id]
        wall = time.time() - self._clock()  # the controller's clock to Unix time
        rows: list[dict[str, Any]] = []
        for dep_id in ids:
            dep = self._peek(dep_id)
            if dep is None:
                continue
            track = state.tracks.get(dep_id)
            kind = turns.waits_for(dep, track is not None and track.drained_for is not None, dep_id in state.queue)
            for place, waiter in enumerate(self._waiting(dep_id), start=1):
                rows.append(
                    {
                        "id": waiter.id,
                        "request_id": waiter.request_id,
                        "deployment_id": dep_id,
                        "name": dep.name,
                        "since": round(waiter.since, 3),
                        "until": round(waiter.deadline + wall, 3),
                        "waits_for": kind.value,
                        "priority": waiter.priority,
                        "place": place,
                        "queued_notice": waiter.queued_fired,
                    }
                )
        rows.sort(key=lambda row: float(row["since"]))
        return rows

    def _waiting(self, deployment_id: str) -> list[Waiter]:
        return [w for w in self._state.line(deployment_id) if w.error is None and w.slot is None]

    def cancel(self, waiter_id: str) -> Waiter | None:
        """End the wait of ``waiter_id`` with 503 ``ondemand_cancelled``; None when no request
        of that id waits (unknown, served, refused or gone already)."""
        waiter = self._state.by_id.get(waiter_id)
        if waiter is None or waiter.error is not None or waiter.slot is not None:
            return None
        dep = self._peek(waiter.deployment_id)
        name = dep.name if dep is not None else waiter.deployment_id
        self._state.cancel(
            waiter, Cancelled(f"the request to {name} was cancelled by an administrator while it waited")
        )
        return waiter
