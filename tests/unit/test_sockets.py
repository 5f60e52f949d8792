"""Who holds a listening socket (dgxmm/deploy/runtimes/sockets.py), read from /proc as the process
runtime reads it before an engine is marked ready."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from dgxmm.deploy.runtimes.sockets import held_by_session, listening_inodes


def test_a_listener_of_this_session_is_held_by_it_and_not_by_another() -> None:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
        assert listening_inodes(port)
        assert held_by_session(port, os.getsid(0)) is True
        assert held_by_session(port, os.getsid(0) + 1_000_000) is False
    assert held_by_session(port, os.getsid(0)) is None  # nothing listens any more


def test_a_listener_of_a_child_in_its_own_session_is_that_sessions() -> None:
    code = ("import socket, sys, time; s = socket.create_server(('0.0.0.0', 0)); "
            "print(s.getsockname()[1], flush=True); time.sleep(30)")  # fmt: skip
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        deadline = time.monotonic() + 5
        while not listening_inodes(port) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert held_by_session(port, child.pid) is True  # (on 0.0.0.0: it takes 127.0.0.1's connections)
        assert held_by_session(port, os.getsid(0)) is False
    finally:
        child.kill()
        child.wait()
