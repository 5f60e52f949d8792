"""Who holds a listening TCP socket, read from /proc: how the process runtime makes sure the port
it gave an engine is the engine's before the engine is marked ready.

dgxmm picks a free port, and the engine binds it a moment later; the port is in the engine's
command line, which every local user can read. A process that binds it first and answers the
health check would otherwise be taken for the engine, and get the callers' prompts. So the
listener's socket (asked of the kernel through sock_diag) must be among the open files of a
process of the engine's session (``/proc/<pid>/fd``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from pathlib import Path

from dgxmm.deploy.procmemory import session_pids

PROC = Path("/proc")

# The kernel's socket monitoring interface (man 7 sock_diag), asked for the listening TCP sockets
# only: /proc/net/tcp lists every socket of the host, TIME_WAIT ones included, and took 22-28 ms
# to read with 3,000 of them (after a burst of requests): that much was added to every cold start.
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_REQUEST = struct.Struct("=BBBxI48x")  # struct inet_diag_req_v2, its inet_diag_sockid all zero
_ANSWER = struct.Struct("=BBBB2s2s16s16sI8sIIIII")  # struct inet_diag_msg


def listening_inodes(port: int, host: str = "127.0.0.1") -> set[int]:
    """The inodes of the sockets listening on ``host:port`` (IPv4 and IPv6, the wildcard
    addresses included: a socket on 0.0.0.0 takes 127.0.0.1's connections too)."""
    wanted = ipaddress.ip_address(host)
    found: set[int] = set()
    for family in (socket.AF_INET, socket.AF_INET6):
        for source, inode in _listeners(family, port):
            address = ipaddress.ip_address(source[:4] if family == socket.AF_INET else source)
            if (
                address == wanted
                or address.is_unspecified
                or (isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped == wanted)
            ):
                found.add(inode)
    return found


def _listeners(family: int, port: int) -> list[tuple[bytes, int]]:
    """(source address, inode) of the TCP sockets of ``family`` listening on ``port``."""
    found: list[tuple[bytes, int]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as diag:
        body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 1 << TCP_LISTEN)
        diag.send(_HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
        while True:
            data, offset = diag.recv(65536), 0
            while offset < len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    (errno,) = struct.unpack_from("=i", data, offset + _HEADER.size)
                    raise OSError(-errno, f"sock_diag: {os.strerror(-errno)}")
                answer = _ANSWER.unpack_from(data, offset + _HEADER.size)
                if int.from_bytes(answer[4], "big") == port:
                    found.append((answer[6], answer[14]))
                offset += (length + 3) & ~3


def socket_inodes(pid: int) -> set[int]:
    found: set[int] = set()
    try:
        names = os.listdir(PROC / str(pid) / "fd")
    except OSError:
        return found
    for name in names:
        try:
            target = os.readlink(PROC / str(pid) / "fd" / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


def held_by_session(port: int, session: int) -> bool | None:
    """Whether every socket listening on 127.0.0.1:``port`` is one of ``session``'s; None when
    nothing listens there."""
    listening = listening_inodes(port)
    if not listening:
        return None
    owned = set().union(*(socket_inodes(pid) for pid in session_pids(session)))
    return listening <= owned
