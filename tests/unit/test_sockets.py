"""Who holds a listening socket (dgxmm/deploy/runtimes/sockets.py), asked of the kernel (sock_diag)
and /proc as the process runtime asks before an engine is marked ready."""

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
    code = (
        "import socket, sys, time; s = socket.create_server(('0.0.0.0', 0)); "
        "print(s.getsockname()[1], flush=True); time.sleep(30)"
    )
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


def test_the_kernel_names_the_listeners_socket_and_only_those_that_take_the_address() -> None:
    with socket.create_server(("127.0.0.1", 0)) as mine:
        port = mine.getsockname()[1]
        assert listening_inodes(port) == {os.fstat(mine.fileno()).st_ino}
        assert listening_inodes(port, "127.0.0.2") == set()  # (another address of loopback)
    with socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True) as wildcard:
        port = wildcard.getsockname()[1]  # (on "::" it takes 127.0.0.1's connections too)
        assert listening_inodes(port) == {os.fstat(wildcard.fileno()).st_ino}
    with socket.create_server(("127.0.0.1", 0)) as bound:
        with socket.socket() as client:
            client.connect(bound.getsockname())  # a connection on the port is not a listener
            conn, _ = bound.accept()
            conn.close()
        assert listening_inodes(bound.getsockname()[1]) == {os.fstat(bound.fileno()).st_ino}
