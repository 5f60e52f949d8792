"""A stopped engine's model files dropped from the page cache, where cached pages count as used.

On unified memory (a DGX Spark's GB10) CUDA counts the page cache as used memory: its free
figure is MemFree, not MemAvailable. After one model ran, its weights stay cached, and the next
vLLM start fails its memory check though nothing holds that memory (NVIDIA's advice is
``drop_caches``, as root). dgxmm knows which files a stopped engine loaded (weights.py), so
after the stop it asks the kernel to drop exactly those: ``posix_fadvise(POSIX_FADV_DONTNEED)``
on each, which needs no root and leaves every other file's cache alone. Pages another process
still maps (a second deployment of the same file) are not dropped: the kernel keeps mapped pages;
nor are pages not yet written back (a file written moments ago), which it drops clean only.

``[memory] page_cache``: ``auto`` releases with ``source = "meminfo"`` (unified memory) and keeps
the cache on discrete GPUs, where it costs the devices nothing and makes the next load of the
same model fast; ``keep`` and ``release`` say so.

The release runs off the event loop with a deadline, before the stop is recorded, so the next
start's fit check sees the memory free. A file that cannot be opened (gone, unreadable, not a
regular file) is skipped with a warning once per path: a release never fails a stop.

``CacheCount`` says how much of a model the page cache held as its start began (the activity
row's ``cached_fraction``): ``mincore(2)``, in a thread, never waited for.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import mmap
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from dgxmm.deploy.weights import weight_files
from dgxmm.errors import InvalidInput

log = logging.getLogger(__name__)

RELEASE_TIMEOUT_S = 5.0  # a release that takes longer (a hung network volume) is given up
# A count of cached pages that takes longer is given up (unknown): 250 GiB at 20 ms a GiB, or a
# network volume that hangs. It never holds up a start either way (``CacheCount``).
COUNT_LIMIT_S = 5.0
_warned: set[Path] = set()


def drop(paths: Iterable[Path]) -> int:
    """Advise the kernel to drop each regular file's cached pages; the bytes advised. Blocks:
    callers run it off the loop."""
    advised = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            _warn_once(path, f"cannot open it ({exc.strerror})")
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                _warn_once(path, "not a regular file")
                continue
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            advised += info.st_size
        except OSError as exc:
            _warn_once(path, f"fadvise failed ({exc.strerror})")
        finally:
            os.close(fd)
    return advised


_WINDOW = 1 << 30  # bytes of a file mapped at a time to ask which of its pages are cached
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_MAP_FAILED = ctypes.c_void_p(-1).value
_RESIDENT = bytes(b & 1 for b in range(256))  # mincore's bit 0: the page is resident (the rest reserved)


class Stopped(Exception):
    """A count of cached pages given up: its start no longer needs it, or it ran too long."""


def _never() -> bool:
    return False


def cached_bytes(paths: Iterable[Path], stopped: Callable[[], bool] = _never) -> tuple[int, int]:
    """Bytes of the files in the page cache now, and their size: ``mincore(2)`` over each file
    mapped (never read) a window at a time, which is what ``fincore`` does; the standard library
    has no binding for it. A file that cannot be mapped counts as not cached. ``stopped`` is asked
    before each window (1 GiB, about 20 ms): ``Stopped`` when it says so. Blocks: off the loop."""
    cached = total = 0
    page = mmap.PAGESIZE
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size if stat.S_ISREG(os.fstat(fd).st_mode) else 0
            total += size
            for offset in range(0, size, _WINDOW):
                if stopped():
                    raise Stopped
                length = min(_WINDOW, size - offset)
                addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
                if addr in (None, _MAP_FAILED):
                    break
                try:
                    pages = (length + page - 1) // page
                    vec = (ctypes.c_ubyte * pages)()
                    if _libc.mincore(addr, length, vec) == 0:
                        cached += min(length, bytes(vec).translate(_RESIDENT).count(1) * page)
                finally:
                    _libc.munmap(addr, length)
        finally:
            os.close(fd)
    return cached, total


def cached_fraction(model: str, stopped: Callable[[], bool] = _never) -> float | None:
    """The share of ``model``'s files (weights.py) in the page cache now, 0 to 1; None when it
    names no file dgxmm can see (a hub name, a path only a container has), they are empty, or the
    count was stopped. Never raises: a start's report must not fail for it. Blocks: off the loop."""
    try:
        files = weight_files(model)
        if not files:
            return None
        cached, total = cached_bytes((f.path for f in files), stopped)
    except (Stopped, InvalidInput):
        return None
    except Exception:
        log.exception("cannot count the cached pages of %s", model)
        return None
    return round(min(cached / total, 1.0), 3) if total else None


class CacheCount:
    """How much of a model the page cache holds as its start begins, counted in a thread of the
    loop's executor so the start never waits for it (``mincore`` costs about 20 ms a GiB, 2 s for
    100 GiB, while the engine's own read of a cold GiB takes a third of a second or more).
    ``result`` takes what was counted by then, None if the count is not done, and stops the
    count; a count past ``limit_s`` stops itself. Made on the event loop."""

    def __init__(self, model: str, limit_s: float = COUNT_LIMIT_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._stop = threading.Event()
        until = clock() + limit_s

        def stopped() -> bool:
            return clock() > until or self._stop.is_set()

        self._future = asyncio.get_running_loop().run_in_executor(None, cached_fraction, model, stopped)

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> float | None:
        """The share counted, or None while the count runs (it stops now) or when unknown."""
        self._stop.set()
        return self._future.result() if self._future.done() else None


def _warn_once(path: Path, why: str) -> None:
    if path not in _warned:
        _warned.add(path)
        log.warning("the page cache of %s is not released: %s", path, why)


class PageCache:
    """The policy, and the release after an engine's stop."""

    def __init__(self, policy: str, source: str) -> None:
        self.releases = policy == "release" or (policy == "auto" and source == "meminfo")

    async def release(self, model: str) -> int:
        """Drop ``model``'s files (a deployment's ``model``) when the policy says so; the bytes
        advised (0 when kept, named no local files, or the deadline passed)."""
        if not self.releases:
            return 0
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT_S):
                return await asyncio.to_thread(_release, model)
        except TimeoutError:
            log.warning("releasing the page cache of %s took over %g s: given up", model, RELEASE_TIMEOUT_S)
        except Exception:  # (a refused split count is the deployment's error, not the stop's)
            log.exception("cannot release the page cache of %s", model)
        return 0


def _release(model: str) -> int:
    files = weight_files(model)
    return 0 if not files else drop(f.path for f in files)
