"""``dgxmm stop``: ask the dgxmm that holds a data directory to exit, and wait until it has.

The holder is the process with the data directory's lock (``datadir.DataDirLock``; its PID is in
``dgxmm.lock``). A plain stop is a SIGTERM, as systemd or a terminal's Ctrl-C sends: requests in
flight get their grace, and engines that outlive dgxmm (``[runtime] engines_outlive_dgxmm``, and
containers) go on for the next dgxmm to adopt. ``--stop-engines`` asks for the engines to be stopped
too: a signal carries no such wish, so it is written first to ``<data_dir>/stop-request`` with the
holder's PID, and the holder reads it in its shutdown (``stop_engines_asked``). A request naming
another PID (a stop that came after the process it was for had gone) is stale and ignored, never
applied to a later dgxmm.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import time
from pathlib import Path

from dgxmm.datadir import LOCK_NAME, open_private

REQUEST_NAME = "stop-request"
REQUEST_MAX_BYTES = 4096  # a PID and a flag: anything longer is not ours
POLL_S = 0.1


class NotRunning(Exception):
    """No process holds the data directory."""


def holder(data_dir: Path) -> int | None:
    """The PID of the process that holds ``data_dir``'s lock; None when nobody does."""
    try:
        fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # held: read who holds it
        else:
            return None
    finally:
        os.close(fd)
    try:
        text = (data_dir / LOCK_NAME).read_bytes()[:32].decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def request_stop(data_dir: Path, *, stop_engines: bool, timeout_s: float) -> int:
    """SIGTERM the holder of ``data_dir`` (with the engines' stop asked for first, if wanted) and
    wait up to ``timeout_s`` for the lock to be free. Returns the holder's PID; raises NotRunning,
    or TimeoutError when it is still running at the end."""
    pid = holder(data_dir)
    if pid is None:
        raise NotRunning(f"no dgxmm holds {data_dir}")
    if stop_engines:
        fd = open_private(data_dir / REQUEST_NAME, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, json.dumps({"pid": pid, "stop_engines": True}).encode())
        finally:
            os.close(fd)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise NotRunning(f"dgxmm (PID {pid}) exited before it was asked to") from None
    deadline = time.monotonic() + timeout_s
    while holder(data_dir) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"dgxmm (PID {pid}) is still running after {timeout_s:g} s")
        time.sleep(POLL_S)
    return pid


def stop_engines_asked(data_dir: Path) -> bool:
    """In the holder's shutdown: whether ``dgxmm stop --stop-engines`` asked this process to stop
    its engines. The request is removed whether or not it was this process's."""
    path = data_dir / REQUEST_NAME
    try:
        with path.open("rb") as f:
            raw = f.read(REQUEST_MAX_BYTES + 1)
        path.unlink()
    except OSError:  # none (the usual case), or not readable: no wish to stop the engines
        return False
    if len(raw) > REQUEST_MAX_BYTES:
        return False
    try:
        request = json.loads(raw)
    except ValueError:
        return False
    return isinstance(request, dict) and request.get("pid") == os.getpid() and request.get("stop_engines") is True
