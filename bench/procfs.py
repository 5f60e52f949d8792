"""Readings of other processes from /proc: their children, CPU seconds and resident memory.

The benchmark measures the proxies from outside (nothing is added to dgxmm or nginx for it), so
these are the only view it has of them. A process that is gone counts as nothing rather than
failing the run: the caller decides whether a missing process matters.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (to find nginx's worker and the engine dgxmm started)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a granian worker's engine is a grandchild of the server)."""
    found = []
    todo = [pid]
    while todo:
        below = children_of(todo.pop())
        found += below
        todo += below
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds, summed over the processes."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)
    return total


def rss_kib(pids: list[int]) -> int:
    """VmRSS in KiB, summed over the processes."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
                    break
    return total


class RssSampler(threading.Thread):
    """Peak summed VmRSS of some processes, every 50 ms until stopped (a single reading at the
    end would miss the peak of streams that have already finished)."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.peak = rss_kib(pids) if pids else 0
        self.halt = threading.Event()

    def run(self) -> None:
        while self.pids and not self.halt.wait(0.05):
            self.peak = max(self.peak, rss_kib(self.pids))

    def stop(self) -> int:
        self.halt.set()
        self.join(2)
        return self.peak
