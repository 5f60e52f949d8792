"""An engine's processes (dgxmm.deploy.runtimes.members): a child that left the engine's session
(``setsid``) is still the engine's, by its cgroup where dgxmm can make one and by its process
tree elsewhere, also once its parent is gone; a pid that is another process's now is spared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import CGROUP_SKIP

from dgxmm.deploy.runtimes.members import Members, enter, own_cgroup

# The engine: a child in a session of its own (as a daemonizing server leaves one), then sleep.
ESCAPING = [
    sys.executable,
    "-c",
    "import subprocess, sys, time; subprocess.Popen(['sleep', '60'], "
    "start_new_session=True); print(flush=True); time.sleep(60)",
]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def until(check, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def cgroup_base() -> Path:
    base = own_cgroup()
    if base is None or not os.access(base, os.W_OK):
        pytest.skip(CGROUP_SKIP)
    return base


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def launch(procs: list[subprocess.Popen[bytes]], members: Members) -> subprocess.Popen[bytes]:
    fd = members.join_fd()
    proc = subprocess.Popen(
        ESCAPING,
        start_new_session=True,
        stdout=subprocess.PIPE,
        preexec_fn=(lambda: enter(fd)) if fd is not None else None,  # noqa: PLW1509
    )
    if fd is not None:
        os.close(fd)
    procs.append(proc)
    members.started(proc.pid)
    assert proc.stdout is not None
    proc.stdout.readline()  # its child runs
    return proc


@pytest.mark.parametrize("way", ["tree", "cgroup"])
def test_a_child_that_left_the_session_is_the_engines_until_the_stop(way: str, procs: list) -> None:
    members = Members(f"dgxmm-test-{os.getpid()}", cgroup_base() if way == "cgroup" else None)
    assert (members.cgroup is not None) == (way == "cgroup")
    leader = launch(procs, members)
    pids = members.pids()
    [child] = [pid for pid in pids if pid != leader.pid]
    assert leader.pid in pids and os.getsid(child) != leader.pid
    leader.kill()  # its parent gone, the child is re-parented outside the tree
    leader.wait()
    assert members.pids() == [child] and members.usage().host_bytes > 0
    members.signal(signal.SIGKILL)
    until(lambda: not alive(child))
    members.close()
    assert members.cgroup is None or not members.cgroup.exists()


def test_a_pid_known_with_another_start_time_is_not_killed(procs: list) -> None:
    members = Members("unused", None)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    procs.append(other)
    members.started(other.pid)
    members._known[other.pid] += 1  # the pid is another process's now: it started at another time
    assert members.pids() == []
    members.signal(signal.SIGKILL)
    time.sleep(0.1)  # (a negative check: a slow machine cannot fail it)
    assert alive(other.pid)
