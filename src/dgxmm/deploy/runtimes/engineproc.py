"""An engine's leading process as the process runtime follows it: one this dgxmm spawned (its
child, whose exit code it reads when it reaps it), or one an earlier dgxmm spawned and this one
adopted after a restart (not its child: its exit code goes to its new parent, so it cannot be
told). Either way the exit is heard through a pidfd on the event loop.

Engines are spawned with ``subprocess.Popen``, not asyncio's subprocess transport: that
transport kills a child still running when it is closed or collected, and an engine that
outlives dgxmm must survive dgxmm letting go of it (``detach``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

ADOPTED_END = "ended (an adopted engine: its exit code went to its new parent)"


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class EngineProcess:
    """Raises ProcessLookupError when ``pid`` is gone already (only an adopted one can be)."""

    def __init__(self, pid: int, child: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self._child = child
        self._done = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._fd = os.pidfd_open(pid)
        self._loop.add_reader(self._fd, self._exited)

    @classmethod
    def spawned(cls, child: subprocess.Popen[bytes]) -> EngineProcess:
        return cls(child.pid, child)

    def _exited(self) -> None:
        if self._child is not None:
            self._child.poll()  # reaps it: its exit code
        self.detach()
        self._done.set()

    def ended(self) -> str | None:
        """None while it runs, else how it ended."""
        if not self._done.is_set():
            return None
        return ADOPTED_END if self._child is None else describe_exit(self._child.returncode)

    async def wait(self) -> str:
        """How it ended, once it has."""
        await self._done.wait()
        return self.ended() or ADOPTED_END

    def detach(self) -> None:
        """Stop listening for its end (it ended, or dgxmm exits and the engine goes on)."""
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
