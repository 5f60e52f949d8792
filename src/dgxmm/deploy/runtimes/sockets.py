"""Who holds a listening TCP socket, read from /proc: how the process runtime makes sure the port
it gave an engine is the engine's before the engine is marked ready.

dgxmm picks a free port, and the engine binds it a moment later; the port is in the engine's
command line, which every local user can read. A process that binds it first and answers the
health check would otherwise be taken for the engine, and get the callers' prompts. So the
listener's socket (``/proc/net/tcp``, ``tcp6``) must be among the open files of a process of the
engine's session (``/proc/<pid>/fd``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

PROC = Path("/proc")
LISTEN = "0A"


def listening_inodes(port: int, host: str = "127.0.0.1") -> set[int]:
    """The inodes of the sockets listening on ``host:port`` (IPv4 and IPv6, the wildcard
    addresses included: a socket on 0.0.0.0 takes 127.0.0.1's connections too)."""
    wanted = ipaddress.ip_address(host)
    found: set[int] = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = (PROC / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            address_hex, port_hex = local.split(":")
            if state != LISTEN or int(port_hex, 16) != port:
                continue
            address = _address(address_hex, family)
            if address == wanted or address.is_unspecified or (
                family == socket.AF_INET6 and getattr(address, "ipv4_mapped", None) == wanted
            ):
                found.add(inode)
    return found


def _address(hex_text: str, family: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_text)
    if family == socket.AF_INET:
        return ipaddress.IPv4Address(raw[::-1])  # one 32-bit word, host order
    words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]  # four 32-bit words, each host order
    return ipaddress.IPv6Address(b"".join(words))


def session_pids(session: int) -> list[int]:
    """Every live process of a session (an engine runs in its own, so its children are in it)."""
    pids = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def socket_inodes(pid: int) -> set[int]:
    found = set()
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
