"""A granted request slot, and a request waiting for one (both plain records of the controller)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

from dgxmm.controller.errors import OndemandError


class Slot:
    """A granted request slot; ``release`` is idempotent (hang-ups may race normal ends)."""

    def __init__(self, deployment_id: str, on_release: Callable[[str], None]) -> None:
        self.deployment_id = deployment_id
        self.released = False
        self._on_release = on_release

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._on_release(self.deployment_id)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


@dataclass(eq=False)
class Waiter:
    """One request inside ``acquire``: its deadline, its queued-notice hook, its error if any."""

    deployment_id: str
    deadline: float
    on_queued: Callable[[], None] | None
    queued_fired: bool = False
    error: OndemandError | None = None
