"""The declared deployments of a running dgxmm: read at start-up, watched, applied on change.

The files are polled (``stat``: inode, mtime, size, and which ``*.toml`` files there are) every
``deployments_poll_s``; a change is read once the files have looked the same for one more poll,
so an editor's partial save is read when it is finished and a file replaced by a rename is
followed. ``SIGHUP`` reads them at once. Reading runs in a thread, off the event loop, one at a
time and shared with ``GET /api/config/plan`` (reading.py).

A reading that does not parse or validate changes nothing: the deployments keep running as they
were, the error is logged once and shown (``status``, in ``GET /api/host`` as ``config``, and
given to ``on_status`` as it comes and goes, for the console's event stream) until a reading
succeeds. A reading refused for what may change without an edit of the files (``recheck``: a
model file it names is missing, unreadable or not a GGUF, declared/modelfiles.py; a name that a
deployment made through the API holds) is kept and tried again at each poll, and applied once
the cause is gone. An error no reading should meet (a fault of dgxmm's, of the store) is the
same: one error line, shown as the files' error, and the files applied again at the next poll;
the watcher never dies of it. One owner: only this object reads the files and calls the applier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

from dgxmm.declared.apply import Applier
from dgxmm.declared.modelfiles import check_models
from dgxmm.declared.parse import Declaration, DeclarationError, Sources
from dgxmm.declared.reading import Reader, Signature, failure, signature

log = logging.getLogger(__name__)


class Declared:
    def __init__(
        self,
        sources: Sources,
        applier: Applier,
        poll_s: float,
        on_status: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.sources = sources
        self._reader = Reader(sources)
        self._applier = applier
        self._poll_s = poll_s
        self._declared: tuple[Declaration, ...] = ()
        self._error: DeclarationError | None = None
        self._seen: Signature | None = None  # the files as last read
        self._pending = False  # the last round left work for the next (busy, starting)
        self._waiting: tuple[Declaration, ...] | None = None  # a reading refused for a cause that may go
        self._applied_at: float | None = None
        self._hup = asyncio.Event()
        self._on_status = on_status  # the error came, changed or went

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
        """What applying the files as they are now would do (nothing is applied); the reading
        is the watcher's (one at a time), and any error an answer, never raised."""
        try:
            reading = await self._reader.read()
            if reading.error is not None:
                raise reading.error
            todo = self._applier.plan(reading.declared)
            await check_models(todo, reading.declared, self.sources.runtime)
            return {"valid": True, "error": None, "plan": todo.as_dict()}
        except DeclarationError as exc:
            return {"valid": False, "error": exc.as_dict(), "plan": None}
        except Exception as exc:  # noqa: BLE001 - an answer, never a 500
            return {"valid": False, "error": failure(self.sources, exc).as_dict(), "plan": None}

    async def reload(self, *, again: bool = True) -> bool:
        """Read the files and apply them; False (and nothing changed) when they are not valid.
        ``again``: parse them even when they look as they did at the last reading."""
        try:
            reading = await self._reader.read(again=again)
            self._seen = reading.seen
            if reading.error is not None:
                self._waiting = None
                self._refused(reading.error)
                return False
            return await self._accept(reading.declared)
        except Exception as exc:  # noqa: BLE001 - the watcher goes on
            self._failed(exc)
            return False

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
        before = self._error
        self._declared = tuple(declared)
        self._applied_at = time.time()
        await self.apply()
        # The error shown goes once a round applied, so one the round itself meets stays (and is
        # not logged again at each poll that tries the round again).
        if before is not None and self._error is before:
            log.info("declared deployments: the files are valid again (%s)", before.file)
            self._error = None
            self._said()
        return self._error is None

    def _refused(self, exc: DeclarationError) -> None:
        """Keep ``exc`` as the error shown; logged and said once while it stays the same."""
        new = self._error is None or str(self._error) != str(exc)
        self._error = exc
        if new:
            again = f" (looked at again every {self._poll_s:g} s)" if exc.recheck else ""
            log.error("declared deployments not applied, nothing changed: %s%s", exc, again)
            self._said()

    def _failed(self, exc: Exception) -> None:
        """An unexpected error: shown (and logged once) as the files' error; the files are read
        (from the last reading, unparsed when they did not change) and applied again at the next poll."""
        self._seen = None
        self._refused(failure(self.sources, exc))

    def _said(self) -> None:
        if self._on_status is not None:
            self._on_status(self.status())

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
            try:
                previous = await self.poll(previous)
            except Exception as exc:  # noqa: BLE001 - one error line, then the next poll
                self._failed(exc)

    async def poll(self, previous: Signature | None) -> Signature:
        """One look at the files (``previous``: what the last look saw). Read them when they
        differ from the last reading and are what the last look saw too (the save finished);
        else the model files of a reading refused for them again, or another round of a plan
        the last one could not finish. Returns what it saw."""
        now = await asyncio.to_thread(signature, self.sources)
        if now != self._seen:
            if now == previous:
                await self.reload(again=False)
            return now
        if self._waiting is not None and await self._accept(self._waiting):
            return now
        if self._pending:
            await self.apply()
        return now
