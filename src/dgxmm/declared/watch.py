"""The declared deployments of a running dgxmm: read at start-up, watched, applied on change.

The files are polled (``stat``: inode, mtime, size, and which ``*.toml`` files there are) every
``deployments_poll_s``; a change is read once the files have looked the same for one more poll,
so an editor's partial save is read when it is finished and a file replaced by a rename is
followed. ``SIGHUP`` reads them at once. Reading runs in a thread, off the event loop.

A reading that does not parse or validate changes nothing: the deployments keep running as they
were, the error is logged once and shown (``status``, in ``GET /api/host`` as ``config``, and
given to ``on_status`` as it comes and goes, for the console's event stream) until a reading
succeeds. A reading refused for what may change without an edit of the files (``recheck``: a
model file it names is missing, unreadable or not a GGUF, declared/models.py; a name that a
deployment made through the API holds) is kept and tried again at each poll, and applied once
the cause is gone. One owner: only this object reads the files and
calls the applier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

from dgxmm.declared.apply import Applier
from dgxmm.declared.models import check_models
from dgxmm.declared.parse import Declaration, DeclarationError, Sources, read

log = logging.getLogger(__name__)

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


class Declared:
    def __init__(self, sources: Sources, applier: Applier, poll_s: float) -> None:
        self.sources = sources
        self._applier = applier
        self._poll_s = poll_s
        self._declared: tuple[Declaration, ...] = ()
        self._error: DeclarationError | None = None
        self._seen: Signature | None = None  # the files as last read
        self._pending = False  # the last round left work for the next (busy, starting)
        self._waiting: tuple[Declaration, ...] | None = None  # a reading refused for a cause that may go
        self._applied_at: float | None = None
        self._hup = asyncio.Event()
        self.on_status: Callable[[dict[str, Any]], None] | None = None  # the error came, changed or went

    @property
    def watched(self) -> bool:
        """Whether there is anything to watch (a config file or a deployments directory)."""
        return self.sources.config_file is not None or self.sources.deployments_dir is not None

    def status(self) -> dict[str, Any]:
        """``GET /api/host``'s ``config``: the files, what they declare, and the error of the
        latest reading until a reading succeeds."""
        return {
            "config_file": None if self.sources.config_file is None else str(self.sources.config_file),
            "deployments_dir": None if self.sources.deployments_dir is None else str(self.sources.deployments_dir),
            "poll_s": self._poll_s,
            "declared": len(self._declared),
            "applied_at": self._applied_at,
            "pending": self._pending,
            "error": None if self._error is None else self._error.as_dict(),
        }

    async def plan_now(self) -> dict[str, Any]:
        """What applying the files as they are now would do (nothing is applied)."""
        try:
            declared = await asyncio.to_thread(read, self.sources)
            todo = self._applier.plan(declared)
            await check_models(todo, declared, self.sources.runtime)
            return {"valid": True, "error": None, "plan": todo.as_dict()}
        except DeclarationError as exc:
            return {"valid": False, "error": exc.as_dict(), "plan": None}

    async def reload(self) -> bool:
        """Read the files and apply them; False (and nothing changed) when they are not valid."""
        seen = await asyncio.to_thread(signature, self.sources)
        try:
            declared = await asyncio.to_thread(read, self.sources)
        except DeclarationError as exc:
            self._seen = seen
            self._waiting = None
            self._refused(exc)
            return False
        self._seen = seen
        return await self._accept(declared)

    async def _accept(self, declared: Sequence[Declaration]) -> bool:
        """Apply a valid reading, unless its plan cannot be made (a name an API deployment
        holds) or a model file it needs is not right: then nothing is done."""
        try:
            todo = self._applier.plan(declared)
            await check_models(todo, declared, self.sources.runtime)
        except DeclarationError as exc:
            self._waiting = tuple(declared) if exc.recheck else None
            self._refused(exc)
            return False
        self._waiting = None
        if self._error is not None:
            log.info("declared deployments: the files are valid again (%s)", self._error.file)
            self._error = None
            self._said()
        self._declared = tuple(declared)
        self._applied_at = time.time()
        await self.apply()
        return self._error is None

    def _refused(self, exc: DeclarationError) -> None:
        """Keep ``exc`` as the error shown; logged and said once while it stays the same."""
        new = self._error is None or str(self._error) != str(exc)
        self._error = exc
        if new:
            again = f" (looked at again every {self._poll_s:g} s)" if exc.recheck else ""
            log.error("declared deployments not applied, nothing changed: %s%s", exc, again)
            self._said()

    def _said(self) -> None:
        if self.on_status is not None:
            self.on_status(self.status())

    async def apply(self) -> None:
        """One round of the last valid reading's plan."""
        try:
            todo = await self._applier.apply(self._declared)
        except DeclarationError as exc:  # the deployments changed since the reading (an API create)
            self._waiting = self._declared if exc.recheck else None
            self._refused(exc)
            self._pending = False
            return
        self._pending = not todo.empty

    def hangup(self) -> None:
        """SIGHUP: read the files at the next turn of the loop, without waiting for a poll."""
        self._hup.set()

    async def run(self) -> None:
        """Watch until cancelled (under the supervisor)."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
            loop.add_signal_handler(signal.SIGHUP, self.hangup)
        try:
            await self._watch()
        finally:
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.remove_signal_handler(signal.SIGHUP)

    async def _watch(self) -> None:
        previous: Signature | None = None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hup.wait(), self._poll_s)
            if self._hup.is_set():
                self._hup.clear()
                log.info("SIGHUP: reading the declared deployments again")
                await self.reload()
                continue
            previous = await self.poll(previous)

    async def poll(self, previous: Signature | None) -> Signature:
        """One look at the files (``previous``: what the last look saw). Read them when they
        differ from the last reading and are what the last look saw too (the save finished);
        else the model files of a reading refused for them again, or another round of a plan
        the last one could not finish. Returns what it saw."""
        now = await asyncio.to_thread(signature, self.sources)
        if now != self._seen:
            if now == previous:
                await self.reload()
            return now
        if self._waiting is not None and await self._accept(self._waiting):
            return now
        if self._pending:
            await self.apply()
        return now
