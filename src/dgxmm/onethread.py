"""The one-thread rule: dgxmm's state belongs to the thread that runs the event loop.

Deployment records, the controller's tracks and queue, the budget and every counter are read and
written on that thread only. That is what lets a plain (non-async) call act as a lock: nothing
else runs while it runs. Code on another thread (a plain ``def`` route handler, which FastAPI
runs in a worker thread; a library's callback thread) would break that silently, so the owners
of that state check it where they change it: ``Owner.check`` raises ``OffLoopThread`` at the
call that broke the rule, instead of leaving a torn record to be found later. The check is one
comparison of thread ids.
"""

from __future__ import annotations

import threading


class OffLoopThread(RuntimeError):
    """State owned by the event loop's thread was changed from another thread."""


class Owner:
    """The thread that built the owner (the event loop's, in dgxmm) and the check against it."""

    __slots__ = ("_name", "_thread")

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread = threading.get_ident()

    def check(self) -> None:
        if threading.get_ident() != self._thread:
            raise OffLoopThread(
                f"the {self._name}'s state changed off the event loop's thread ({threading.current_thread().name})"
            )
