"""Readings of the declared files, one at a time, shared by the watcher and ``GET /api/config/plan``.

A reading is bounded (parse.py, dgxmm/boundedtoml.py) but a thread cannot be stopped, so no
second one starts while one runs: a caller waits for the running one to end (one that stops
waiting, a plan request whose client went away, leaves it running for the others), then reads,
and a reading of files that look as they did at the last one (``signature``) is that one again,
unparsed. So a plan asked while the watcher reads, or asked a thousand times, parses nothing more.

A reading never raises: an error no reading should meet (a fault of dgxmm's, not of the files)
is the reading's error as well, naming the files, so that the watcher that asked goes on.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from dgxmm.declared.parse import Declaration, DeclarationError, Sources, read

Signature = tuple[tuple[str, int, int, int], ...] | str


def signature(sources: Sources) -> Signature:
    """What the files look like now, without reading them (blocking: ``stat`` calls)."""
    try:
        files = sources.files()
    except DeclarationError as exc:
        return str(exc)
    found = []
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            found.append((str(path), -1, -1, -1))
            continue
        found.append((str(path), st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(found)


def failure(sources: Sources, exc: Exception) -> DeclarationError:
    """An unexpected error, as an error of the declared files (the config file's, else the directory's)."""
    where = sources.config_file or sources.deployments_dir or "config"
    return DeclarationError(str(where), f"not applied: {type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class Reading:
    seen: Signature  # the files as they looked just before they were read
    declared: tuple[Declaration, ...]
    error: DeclarationError | None


class Reader:
    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self._running: asyncio.Task[Reading] | None = None
        self._last: Reading | None = None

    async def read(self, *, again: bool = False) -> Reading:
        """The files as they are now: the last reading while they look the same (``again``:
        parsed anyway, as for SIGHUP), else a new one, begun after the one running has ended."""
        while self._running is not None:
            await asyncio.shield(self._running)
        task = self._running = asyncio.create_task(self._read(again))
        return await asyncio.shield(task)

    async def _read(self, again: bool) -> Reading:
        try:
            return await self._parsed(again)
        finally:
            self._running = None  # (before the callers waiting for it wake)

    async def _parsed(self, again: bool) -> Reading:
        seen: Signature = ""
        try:
            seen = await asyncio.to_thread(signature, self.sources)
            if not again and self._last is not None and self._last.seen == seen:
                return self._last
            reading = Reading(seen, await asyncio.to_thread(read, self.sources), None)
        except DeclarationError as exc:
            reading = Reading(seen, (), exc)
        except Exception as exc:  # noqa: BLE001 - the watcher must not die of it: it is the reading's error
            reading = Reading(seen, (), failure(self.sources, exc))
        self._last = reading
        return reading
