"""What an engine's processes really hold: host memory from /proc, and GPU memory where NVML
reports it per process (``nvmlDeviceGetComputeRunningProcesses`` and the graphics list; on a DGX
Spark too, where NVML has no device totals).

Host memory is each process's proportional set size (PSS, ``/proc/<pid>/smaps_rollup``): the
pages it shares with its siblings (a server's worker processes mapping one model file, the same
libraries) are split among them instead of counted once per process, so the sum over an engine's
processes is what the engine holds. A process whose smaps_rollup cannot be read counts its
resident set (``statm``). Plain reads of small files, run off the event loop by the caller.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Usage:
    """One reading of an engine: the host memory its processes (or its container) hold, and the
    processes whose GPU memory counts too."""

    host_bytes: int
    pids: tuple[int, ...]


def session_pids(session: int) -> list[int]:
    """Every live process of a session: an engine runs in its own, so the processes it started
    are in it (unless one left it with setsid: ``runtimes.members`` follows those too)."""
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


def host_bytes(pid: int) -> int:
    """The process's proportional set size, or its resident set; 0 once it is gone."""
    with contextlib.suppress(OSError, ValueError):
        for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((PROC / str(pid) / "statm").read_text().split()[1]) * PAGE
    return 0


def gpu_bytes(pids: tuple[int, ...]) -> int:
    """The GPU memory NVML reports in use by any of ``pids``, on every device; 0 where there is
    no NVIDIA driver (the usual case off a GPU host)."""
    return sum(gpu_by_device(pids).values())


def gpu_by_device(pids: tuple[int, ...]) -> dict[int, int]:
    """The GPU memory NVML reports in use by any of ``pids``, per device index (only devices
    where some is in use); empty where there is no NVIDIA driver."""
    if not pids:
        return {}
    try:
        import pynvml  # nvidia-ml-py, pinned

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver, no device: nothing is measured
        return {}
    wanted, found = set(pids), dict[int, int]()
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            seen: set[int] = set()
            for listing in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
                with contextlib.suppress(pynvml.NVMLError):
                    for proc in listing(handle):
                        if proc.pid in wanted and proc.pid not in seen and proc.usedGpuMemory:
                            seen.add(proc.pid)  # a process in both lists counts once
                            found[index] = found.get(index, 0) + int(proc.usedGpuMemory)
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return found
