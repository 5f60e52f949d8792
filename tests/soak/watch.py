"""What the soak watches while it runs: dgxmm's own resident memory and open files, and every
engine process on the host, each of which must belong to a deployment whose record says it runs.

Engines are found by the marker the process runtime puts in their environment
(``DGXMM_DEPLOYMENT_ID``), whoever started them, so an engine dgxmm lost track of is found too.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from fleet import HANG_BOUND_S, STOP_GRACE_S, Fleet

MARKER = b"DGXMM_DEPLOYMENT_ID="
RUNNING = ("starting", "ready", "asleep", "stopping")
# A failed deployment's engine is still being ended for up to the stop grace (docs/deployer.md).
ENDING_S = STOP_GRACE_S + 2.0
UNTRACKED_LIMIT_S = STOP_GRACE_S + HANG_BOUND_S + 2.0


@dataclass(frozen=True)
class ProcessSample:
    at: float
    run: int  # which dgxmm process (1, then 2 after the restart)
    rss_mib: float
    fds: int


def marked_engines(ids: Collection[str]) -> dict[int, str]:
    """Every live process carrying the marker of one of the deployments ``ids`` (another dgxmm's
    engines on the same host carry other ids): pid -> deployment id."""
    found = {}
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if (environ.parent / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            for var in environ.read_bytes().split(b"\0"):
                if var.startswith(MARKER) and (dep_id := var.removeprefix(MARKER).decode()) in ids:
                    found[int(environ.parent.name)] = dep_id
        except (OSError, IndexError):
            continue
    return found


def process_sample(pid: int, run: int) -> ProcessSample | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return ProcessSample(time.monotonic(), run, rss / 1024, fds)


@dataclass
class Watch:
    fleet: Fleet
    ids: Collection[str]  # the soak's deployments
    run_no: int = 1
    up: bool = True  # False while dgxmm restarts: nothing to ask, nothing to sample
    samples: list[ProcessSample] = field(default_factory=list)
    # pid -> (deployment id, first seen untracked, last seen untracked)
    untracked: dict[int, tuple[str, float, float]] = field(default_factory=dict)
    failed_since: dict[str, float] = field(default_factory=dict)

    async def run(self, stop: asyncio.Event) -> None:
        tick = 0
        while not stop.is_set():
            if self.up:
                sample = process_sample(self.fleet.pid, self.run_no)
                if sample is not None:
                    self.samples.append(sample)
                if tick % 2 == 0:
                    await asyncio.to_thread(self.check_engines)
            tick += 1
            await asyncio.sleep(1.0)

    def check_engines(self) -> None:
        """One look at every engine process: is its deployment's record one that runs it?"""
        try:
            resp = self.fleet.admin("GET", "/deployments", timeout=10)
        except Exception:  # noqa: BLE001 - dgxmm is going down: the restart's own checks take over
            return
        if resp.status_code != 200 or not self.up:
            return
        now = time.monotonic()
        states = {view["id"]: view["state"] for view in resp.json()}
        for dep_id, state in states.items():
            if state == "failed":
                self.failed_since.setdefault(dep_id, now)
            else:
                self.failed_since.pop(dep_id, None)
        for pid, dep_id in marked_engines(self.ids).items():
            state = states.get(dep_id)
            ending = state == "failed" and now - self.failed_since.get(dep_id, now) <= ENDING_S
            if state in RUNNING or ending:
                self.untracked.pop(pid, None)
                continue
            first = self.untracked.get(pid, (dep_id, now, now))[1]
            self.untracked[pid] = (dep_id, first, now)

    def lost_engines(self) -> list[str]:
        """Engines that ran untracked for longer than a failed engine's ending may take."""
        return [
            f"pid {pid} of {dep_id}: {last - first:.1f} s"
            for pid, (dep_id, first, last) in self.untracked.items()
            if last - first > UNTRACKED_LIMIT_S
        ]
