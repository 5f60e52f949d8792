"""The data directory: one dgxmm instance at a time, and nothing in it readable by others.

``DataDirLock`` is an exclusive ``flock`` on the data directory itself, taken before dgxmm opens
the database, binds its port or looks at any engine, and held until the process ends (the kernel
drops it when the process dies, so a crash never leaves a stale lock). The directory, not a file
in it: a lock file can be unlinked and made anew, and a second instance would lock the new one
and go on to kill the first one's engines; a directory that holds a database cannot be removed
while it is locked. ``<data_dir>/dgxmm.lock`` holds the PID of the holder, so a second instance
can say who has it.

Directories dgxmm creates are 0700 and files 0600: the database and engine logs can hold prompts,
paths and tokens. Files from an older dgxmm are tightened at start-up.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_NAME = "dgxmm.lock"
DIR_MODE = 0o700
FILE_MODE = 0o600


class DataDirBusy(Exception):
    """Another process holds the data directory's lock."""

    def __init__(self, lock_path: Path, pid: int | None) -> None:
        holder = f"PID {pid}" if pid else "another process"
        super().__init__(f"data directory in use: {lock_path} is locked by {holder}")
        self.lock_path = lock_path
        self.pid = pid


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) as 0700; tighten it if it exists."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    try:
        os.chmod(path, DIR_MODE)
    except OSError as exc:  # not ours to change (a mount point): say so, and go on
        log.warning("cannot make %s private (mode 0700): %s", path, exc.strerror)


def open_private(path: Path, flags: int) -> int:
    """``os.open`` creating the file as 0600, and tightening a file that already exists."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except OSError as exc:
        log.warning("cannot make %s private (mode 0600): %s", path, exc.strerror)
    return fd


class DataDirLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, data_dir: Path) -> DataDirLock:
        """Create the data directory if needed and lock it; raises DataDirBusy (or OSError)."""
        make_private_dir(data_dir)
        path = data_dir / LOCK_NAME
        fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirBusy(path, _read_pid(path)) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            pid_fd = open_private(path, os.O_RDWR)
            try:
                os.ftruncate(pid_fd, 0)
                os.pwrite(pid_fd, f"{os.getpid()}\n".encode(), 0)
            finally:
                os.close(pid_fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    def release(self) -> None:
        """Unlock (closing the directory drops the lock); the PID file stays, stale then."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_bytes()[:32].decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def warn_if_readable(path: Path | None, what: str) -> bool:
    """Log a warning when a secret's file can be read by other users; True if it can."""
    if path is None:
        return False
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    if not mode & (stat.S_IRGRP | stat.S_IROTH):
        return False
    log.warning("%s %s is readable by other users (mode %04o): run chmod 600 %s", what, path, stat.S_IMODE(mode), path)
    return True
