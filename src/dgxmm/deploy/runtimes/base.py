"""The narrow interface between the deployer and whatever runs engines (processes, containers).

Runtimes key everything by deployment id, not by a handle the caller must keep: a stop that
races a start (an administrator's Stop during a cold start) still finds the engine, and after a
dgxmm restart the runtime can tell which engines are its own.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

from dgxmm.deploy.compilecache import CacheReport
from dgxmm.deploy.engines import EngineKind
from dgxmm.deploy.procmemory import Usage
from dgxmm.records.deployment import Deployment, RuntimeHandle

FOLLOW_WINDOW = 1000  # lines read on each look by the default follow_logs
START_MARK = "--- dgxmm: starting "  # a runtime that appends every run to one log marks each start


def current_run(lines: list[str]) -> list[str]:
    """The lines after the last start mark: what the latest run of the engine wrote (all of
    them when the log has no mark, as a container's own log)."""
    marks = [i for i, line in enumerate(lines) if line.startswith(START_MARK)]
    return lines[marks[-1] + 1 :] if marks else lines


def appended(old: list[str], new: list[str]) -> list[str]:
    """What was added to a log between two readings of its last lines: ``new`` is the end of
    ``old`` (all of it, or without its first lines once the window slides) followed by the new
    lines. The longest such overlap wins; no overlap means the log was replaced (all is new)."""
    if not new:
        return []
    for start in range(len(old)):
        if old[start] == new[0] and old[start:] == new[: len(old) - start]:
            return new[len(old) - start :]
    return new


class LaunchError(Exception):
    """An engine could not be started or managed; the message says why, for state_reason."""


class Runtime(ABC):
    name: str
    # Whether engines keep running after dgxmm exits (containers) and are adopted at the next
    # start, or must be stopped when dgxmm stops (child processes).
    engines_outlive_dgxmm: bool = False

    @abstractmethod
    async def start(self, dep: Deployment, kind: EngineKind) -> RuntimeHandle:
        """Launch the engine and return where it listens; do not wait for it to be healthy."""

    @abstractmethod
    async def stop(self, deployment_id: str, grace_s: float) -> None:
        """Stop the engine (gracefully, then by force after ``grace_s``); a no-op if none runs."""

    @abstractmethod
    async def wait_exit(self, deployment_id: str) -> str:
        """Wait until the engine exits on its own; return a description such as 'exit code 3'."""

    @abstractmethod
    def exit_reason(self, deployment_id: str) -> str | None:
        """How the engine ended, if it has; None while it runs (or was never started)."""

    def output_size(self, deployment_id: str) -> int | None:
        """How much the engine has written so far, as cheaply as it can be known (a change is the
        readiness wait's hint, deploy/readiness.py); None when the runtime cannot tell."""
        return None

    def owns_listener(self, deployment_id: str, handle: RuntimeHandle) -> bool | None:
        """Whether the socket listening at ``handle``'s address belongs to the deployment's engine
        (another local process may have taken the port first); None when the runtime cannot
        tell, or need not: a container's own address, or a port Docker published for it, is
        the container's by construction."""
        return None

    async def usage(self, deployment_id: str) -> Usage | None:
        """What the engine holds now (its processes' or its container's memory, and the
        processes whose GPU memory counts too); None when nothing runs or the runtime cannot tell."""
        return None

    async def leftovers(self, deployment_id: str) -> list[str]:
        """After a stop: end whatever of the engine still runs (a process that left its session,
        a container that was not removed) and describe each one ended; [] when nothing was left."""
        return []

    @abstractmethod
    async def logs(self, deployment_id: str, tail: int) -> list[str]:
        """The last ``tail`` lines of the engine's output."""

    def log_position(self, deployment_id: str) -> int | None:
        """Where the engine's log is now, for ``logs_before`` later (the activity log keeps it
        with each request: the engine's lines up to the request's end); None when this runtime
        cannot read its log up to a point (a container's log is not a file dgxmm can seek)."""
        return None

    async def logs_before(self, deployment_id: str, tail: int, position: int) -> list[str]:
        """The ``tail`` lines of the engine's output that end at ``position`` (``log_position``)."""
        return []

    @abstractmethod
    async def adopt(self, dep: Deployment) -> RuntimeHandle | None:
        """After a dgxmm restart: the handle of this deployment's engine if it still runs and can
        be kept, else None (anything of ours left behind is cleaned up)."""

    async def follow_logs(self, deployment_id: str, tail: int, poll_s: float = 1.0) -> AsyncIterator[list[str]]:
        """The last ``tail`` lines, then every ``poll_s`` the lines added since (often none),
        until the caller stops iterating. This default reads ``logs`` again each time and
        finds where the earlier reading ends in the new one; runtimes that can do better
        (a log file: follow it by offset) override it."""
        seen = await self.logs(deployment_id, FOLLOW_WINDOW)
        yield seen[-tail:] if tail > 0 else []
        while True:
            await asyncio.sleep(poll_s)
            now = await self.logs(deployment_id, FOLLOW_WINDOW)
            yield appended(seen, now)
            seen = now

    async def compile_cache(self, dep: Deployment) -> CacheReport | None:
        """Where the deployment's kept compile work is and its size (deploy/compilecache.py);
        None for an engine whose compile work is not kept, or a runtime that keeps none."""
        return None

    async def clear_compile_cache(self, deployment_id: str) -> None:  # noqa: B027 (optional)
        """Remove the deployment's kept compile work (its engine is not running, or removed)."""

    async def forget_others(self, known: set[str]) -> None:  # noqa: B027 (optional: most runtimes keep nothing)
        """After a dgxmm restart: clean up engines of deployments that no longer exist."""

    @abstractmethod
    async def close(self) -> None:
        """dgxmm is exiting: release what must not outlive it."""
