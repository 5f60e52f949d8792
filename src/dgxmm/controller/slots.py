"""A granted request slot, and a request waiting for one (both plain records of the controller)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Self

from dgxmm.controller.errors import OndemandError


class Slot:
    """A granted request slot; ``release`` is idempotent (hang-ups may race normal ends)."""

    def __init__(self, deployment_id: str, on_release: Callable[[str], None], *, cold: bool = False) -> None:
        self.deployment_id = deployment_id
        self.released = False
        self.cold = cold  # its request waited for its model to start (not only for its turn)
        self._on_release = on_release

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._on_release(self.deployment_id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


_IDS = itertools.count(1)


def _next_id() -> str:
    return f"w{next(_IDS)}"


@dataclass(eq=False)
class Waiter:
    """One request inside ``acquire``: its deadline, its priority and arrival (priority.py: its
    place in its lines), its queued-notice hook, its error if any, the slot handed to it (a release or its turn), and its own wake-up (``woken``: set by every change
    of its deployment, and by the slot handed to it alone)."""

    deployment_id: str
    deadline: float
    on_queued: Callable[[], None] | None
    request_id: str = ""  # the gateway's request id (the caller's x-request-id, or dgxmm's)
    since: float = 0.0  # Unix time it began to wait (the waiting list's)
    priority: int = 0  # its caller's (priority.py): who goes first in its lines
    arrival: float = 0.0  # the controller's clock when it began to wait (its priority's aging)
    id: str = field(default_factory=_next_id)  # unique in this process: what a cancel names
    queued_fired: bool = False
    error: OndemandError | None = None
    slot: Slot | None = None
    cold: bool = False  # it saw its model not ready (waited for a start, not only a turn)
    woken: asyncio.Event = field(default_factory=asyncio.Event)
