"""The next model's weights read into the page cache while its start waits for room.

In a swap, what a user waits for after the victim's stop is the next engine reading its
weights: 20 GB from an NVMe disk is 7-10 s, from a network volume a minute, and 1-2 s from the
page cache (llama.cpp #17833). dgxmm knows which model comes next from the moment its start has
to wait (make-room victims stopping, a drain, the memory queue's head), so it reads that model's
files (weights.py) meanwhile, and the engine then loads them at page-cache speed.

Bounded so it never pushes out what running engines need: it reads only into free memory
(``MemFree``: reading into it evicts nothing), keeping a margin and, on unified memory, the
incoming model's own reservation, which the victims' stop is about to free for it. The bound is
looked at again before every chunk, so memory that fills up meanwhile stops the read. Where
``/proc/meminfo`` cannot be read nothing is read.

One read at a time, in the order the starts began to wait (the queue's order); a start that
begins, or a wait given up, cancels its read at once: ``cancel`` never waits for the thread, which
stops within one chunk. Nothing here delays a start or a request.

A read's progress (``progress``) is told to ``on_progress`` as it goes, at its first chunk, then
at most once every ``PROGRESS_S``, and once more when it ends: the console shows "prefetching 4.1
of 18 GiB" on the queued model, and an event a second is all that costs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from dgxmm.deploy.weights import weight_files

log = logging.getLogger(__name__)

GIB = 1024**3
CHUNK = 8 * 1024**2  # read at a time; a cancel or memory pressure is seen within one chunk
MARGIN = GIB  # free memory a prefetch always leaves
PROGRESS_S = 1.0  # a read's progress is told at most this often
NEVER = float("-inf")
_warned: set[Path] = set()


def read_free(path: Path = Path("/proc/meminfo")) -> int | None:
    """The host's free memory in bytes (``MemFree``: not the page cache), None when unknown."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("MemFree:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def allowance(free: int | None, reservation: int, unified: bool, margin: int = MARGIN) -> int:
    """The bytes a prefetch may read now: free memory beyond the margin and, on unified memory,
    beyond the incoming model's reservation; nothing when free memory is unknown."""
    if free is None:
        return 0
    return max(0, free - margin - (reservation if unified else 0))


@dataclass
class Job:
    deployment_id: str
    model: str
    reservation: int  # bytes the incoming model is to hold
    stop: threading.Event = field(default_factory=threading.Event)
    total: int = 0  # bytes of its files
    done: int = 0  # bytes read so far (written by the reading thread, read on the loop)
    why_stopped: str = ""
    told_at: float = NEVER  # when its progress was last told (the reading thread's)


def _warn_once(path: Path, why: str) -> None:
    """A model file that cannot be read is not prefetched, said once; its start goes on as ever."""
    if path not in _warned:
        _warned.add(path)
        log.warning("%s is not prefetched: %s", path, why)


def _why_not_files(model: str) -> str | None:
    """Why a ``model`` that is there names no files to read: a device, a FIFO, a directory that
    cannot be listed. None for one that names nothing here (a hub name, a path only a container
    sees): no fault of anyone's, and nothing to say."""
    if not model:
        return None
    try:
        mode = os.stat(model).st_mode
    except OSError:
        return None
    if stat.S_ISDIR(mode):
        try:
            with os.scandir(model):
                return None
        except OSError as exc:
            return f"cannot list it ({exc.strerror})"
    return None if stat.S_ISREG(mode) else "not a regular file"


class Prefetcher:
    """One read at a time, in order; ``want`` and ``cancel`` are the loop's, the read a thread's."""

    def __init__(
        self,
        unified: bool,
        free: Callable[[], int | None] = read_free,
        chunk: int = CHUNK,
        margin: int = MARGIN,
        clock: Callable[[], float] = time.monotonic,
        on_progress: Callable[[str], None] | None = None,
    ) -> None:
        self._unified = unified
        self._free = free
        self._chunk = chunk
        self._margin = margin
        self._clock = clock  # read by the reading thread: when to tell the progress again
        self._on_progress = on_progress  # the app's publisher: the view's field goes out
        self._waiting: list[Job] = []
        self._active: Job | None = None
        self._task: asyncio.Task[None] | None = None
        self.read_bytes = 0  # every byte prefetched, for the metric

    def want(self, deployment_id: str, model: str, reservation_gib: float) -> None:
        """The start of ``deployment_id`` waits for room: read its model's files when it is first."""
        if self._active is not None and self._active.deployment_id == deployment_id:
            return
        if any(job.deployment_id == deployment_id for job in self._waiting):
            return
        self._waiting.append(Job(deployment_id, model, int(reservation_gib * GIB)))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="prefetch")

    def cancel(self, deployment_id: str) -> None:
        """Its start begins or its wait is over: stop reading for it now (without waiting)."""
        self._waiting = [job for job in self._waiting if job.deployment_id != deployment_id]
        if self._active is not None and self._active.deployment_id == deployment_id:
            self._active.stop.set()

    def progress(self, deployment_id: str) -> tuple[int, int] | None:
        """Bytes read and the files' total for a read under way, else None."""
        job = self._active
        if job is None or job.deployment_id != deployment_id or job.stop.is_set() or not job.total:
            return None
        return job.done, job.total

    async def close(self) -> None:
        self._waiting.clear()
        if self._active is not None:
            self._active.stop.set()
        if self._task is not None:
            await asyncio.wait([self._task])

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            job = self._active = self._waiting.pop(0)
            try:
                await asyncio.to_thread(
                    self._read, job, partial(loop.call_soon_threadsafe, self._tell, job.deployment_id)
                )
            except Exception:
                log.exception("the prefetch of %s failed", job.model)
            finally:
                self._active = None
                self.read_bytes += job.done
            if job.told_at != NEVER:
                self._tell(job.deployment_id)  # it ended: no progress to show any more
            if job.why_stopped:
                log.info("prefetch of %s stopped after %d bytes: %s", job.model, job.done, job.why_stopped)

    def _tell(self, deployment_id: str) -> None:
        if self._on_progress is not None:
            self._on_progress(deployment_id)

    def _read(self, job: Job, tell: Callable[[], object]) -> None:
        files = weight_files(job.model)
        if not files:
            why = _why_not_files(job.model)
            if why is not None:
                _warn_once(Path(job.model), why)
            return
        job.total = sum(f.size for f in files)
        buffer = bytearray(self._chunk)
        for found in files:
            if not self._read_file(job, found.path, buffer, tell):
                return

    def _read_file(self, job: Job, path: Path, buffer: bytearray, tell: Callable[[], object]) -> bool:
        """Read one file through; False when the job is to stop."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            _warn_once(path, f"cannot open it ({exc.strerror})")
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                _warn_once(path, "not a regular file")
                return False
            with os.fdopen(fd, "rb", buffering=0, closefd=False) as raw:
                while True:
                    if job.stop.is_set():
                        job.why_stopped = "its start began or its wait ended"
                        return False
                    if allowance(self._free(), job.reservation, self._unified, self._margin) < self._chunk:
                        job.why_stopped = "free memory is short"
                        return False
                    n = raw.readinto(buffer)
                    if not n:
                        return True
                    job.done += n
                    now = self._clock()
                    if now - job.told_at >= PROGRESS_S:
                        job.told_at = now
                        tell()
        except OSError as exc:
            _warn_once(path, f"reading it failed ({exc.strerror})")
            return False
        finally:
            os.close(fd)
