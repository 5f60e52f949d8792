"""Which processes are an engine's: the ones its memory is measured over and its stop ends.

An engine runs in a session of its own, but a child may leave it (``setsid``, a daemonizing
server): it then held memory nothing measured and outlived the stop. So each engine's processes
are followed one of two ways:

* **its own cgroup**, where dgxmm's cgroup is cgroup v2 and dgxmm may create a cgroup under it
  (root, or a delegated cgroup): the engine is put in it before it execs, every process it ever
  starts is in it whatever the session, and a stop ends them all (``cgroup.kill``). The cgroup
  is for membership only: no controller is enabled, and memory is the members' PSS as in
  ``usage``, so both ways measure the same thing;
* else **its process tree**: at each memory reading and at the stop, one pass over ``/proc``
  finds the session's processes and every descendant of a process already known. Known
  processes are remembered by pid and start time, so a child whose parent died (it is re-parented
  outside the tree) is still the engine's, and a pid reused by another process is never one.
  What this misses: a process that starts and leaves the tree between two readings (a double
  fork) and was never seen; the marker search at the stop (``ProcessRuntime.leftovers``) is the
  net for those that keep their environment.

Every method that reads ``/proc`` or the cgroup blocks: callers run them off the event loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from pathlib import Path

from dgxmm.deploy.procmemory import PROC, Usage, host_bytes

log = logging.getLogger(__name__)

KILL_WAIT_S = 2.0  # how long a stop waits for its cgroup to empty before it leaves the directory


def own_cgroup() -> Path | None:
    """dgxmm's own cgroup v2 directory (under the cgroup2 mount), or None on a host without one."""
    try:
        own = next(line[3:] for line in Path("/proc/self/cgroup").read_text().splitlines() if line.startswith("0::"))
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except (OSError, StopIteration):
        return None
    for line in mounts:
        fields = line.split()
        if " - cgroup2 " in line and len(fields) > 4:
            return Path(fields[4]) / own.lstrip("/")
    return None


def _stat(pid: int) -> tuple[int, int, int] | None:
    """A live process's parent, session and start time (clock ticks since boot); None for a zombie
    or a process gone."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[1]), int(fields[3]), int(fields[19])


def start_ticks(pid: int) -> int | None:
    """A live process's start time (clock ticks since boot): with its pid, what names one process
    for the life of the host (a pid is reused, a pid and start time never)."""
    found = _stat(pid)
    return None if found is None else found[2]


class Members:
    """One engine's processes, by its cgroup or by its tree (module docstring)."""

    def __init__(self, name: str, base: Path | None) -> None:
        self.cgroup: Path | None = None
        if base is not None:
            try:
                (base / name).mkdir(exist_ok=True)
                self.cgroup = base / name
            except OSError as exc:
                log.debug("no cgroup for %s under %s (%s): following its process tree", name, base, exc)
        self._leader = 0
        self._known: dict[int, int] = {}  # pid -> start time: the tree's processes seen so far
        self._lock = threading.Lock()  # a reading and the stop may scan at once, each in a thread

    def join_fd(self) -> int | None:
        """An open ``cgroup.procs`` of the engine's cgroup, for the child to write itself into
        before it execs (``enter``); the caller closes it after the spawn."""
        if self.cgroup is None:
            return None
        try:
            return os.open(self.cgroup / "cgroup.procs", os.O_WRONLY)
        except OSError as exc:
            log.warning("cannot use the cgroup %s (%s): following the engine's process tree", self.cgroup, exc)
            self.cgroup = None
            return None

    def started(self, leader: int) -> None:
        """The engine runs as ``leader`` (the leader of its session); a cgroup it did not join
        (the child's write was refused) is given up for its tree."""
        self._leader = leader
        start = _stat(leader)
        if start is not None:
            self._known = {leader: start[2]}
        if self.cgroup is not None and leader not in self.pids():
            log.warning(
                "the engine (pid %d) did not join the cgroup %s: following its process tree", leader, self.cgroup
            )
            self.close()
            self.cgroup = None

    def pids(self) -> list[int]:
        """The engine's live processes now."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError, ValueError):
                return [int(line) for line in (self.cgroup / "cgroup.procs").read_text().split()]
            return []
        with self._lock:
            return list(self._scan_tree())

    def usage(self) -> Usage:
        pids = tuple(self.pids())
        return Usage(sum(host_bytes(pid) for pid in pids), pids)

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every process of the engine (a tree's, each checked by its start time
        just before, so a reused pid is spared)."""
        if self.cgroup is not None:
            if sig is signal.SIGKILL and (self.cgroup / "cgroup.kill").exists():
                with contextlib.suppress(OSError):
                    (self.cgroup / "cgroup.kill").write_text("1")
                    return
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            return
        with self._lock:
            found = self._scan_tree()
        for pid, start in found.items():
            now = _stat(pid)
            if now is not None and now[2] == start:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)

    def close(self) -> None:
        """After the stop's SIGKILL: wait (briefly) for the cgroup to empty, and remove it."""
        if self.cgroup is None:
            return
        deadline = time.monotonic() + KILL_WAIT_S
        while True:
            try:
                self.cgroup.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # still populated: the killed processes are on their way out
                if time.monotonic() >= deadline:
                    log.warning("the cgroup %s still has processes after the engine's stop", self.cgroup)
                    return
                time.sleep(0.05)

    def _scan_tree(self) -> dict[int, int]:
        """One pass over /proc: the known processes still alive (same start time), the session's
        while its leader is one of them, and every descendant of these. Remembered for the next
        pass."""
        table: dict[int, tuple[int, int, int]] = {}
        with os.scandir(PROC) as entries:
            for entry in entries:
                if entry.name.isdigit() and (found := _stat(int(entry.name))) is not None:
                    table[int(entry.name)] = found
        members = {pid: start for pid, start in self._known.items() if pid in table and table[pid][2] == start}
        if self._leader in members:  # (a session led by a later process of the leader's pid is not the engine's)
            members.update({pid: row[2] for pid, row in table.items() if row[1] == self._leader})
        children: dict[int, list[int]] = {}
        for pid, row in table.items():
            children.setdefault(row[0], []).append(pid)
        stack = list(members)
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in members:
                    members[child] = table[child][2]
                    stack.append(child)
        self._known = members
        return members


def enter(fd: int) -> None:
    """In the child before exec: join the cgroup ``fd`` is ``cgroup.procs`` of ("0" is itself).
    A refusal is not the engine's failure: ``Members.started`` sees it and follows the tree."""
    with contextlib.suppress(OSError):
        os.write(fd, b"0")
