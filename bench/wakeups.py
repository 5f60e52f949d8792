#!/usr/bin/env python3
"""What one state change costs the on-demand controller with 200 waiters: two versions side by side.

    .venv/bin/python bench/wakeups.py [--baseline REV | --baseline-src DIR] [--changes N]

A waiter (a request inside ``Controller.acquire``) waits for a change; what a change costs is
who wakes, re-reads and decides again. This builds a controller on an in-memory fake of its
``Effects`` (no store, no engines, no HTTP), puts 200 waiters in place, then makes N changes of
the records and lets the event loop run until everything woken went back to sleep, and reports
per change: the wall time (``perf_counter``) and the waiter looks (records read by waiters and
attempts, counted in the fake). Three scenarios:

* ``200 starting``: 200 deployments starting, one waiter each; the change is another deployment's
  (a model going to sleep and waking, by turns). Nobody waits for it.
* ``1 starting``: 200 waiters of one starting deployment; the same change of another.
* ``20 queued``: 20 deployments queued for memory (a busy model holds it), 10 waiters each; the
  change is of a third model's settings (what a queued start decides on may have changed: the
  queue looks again, in both versions).

It runs this checkout's ``src`` and the baseline's (``--baseline REV``: that commit's ``src``, by
``git archive``; default ``HEAD~1``; or ``--baseline-src DIR``), each in its own process, one
after the other in the same run, and prints both and their ratio. The fake implements both
versions' ``Effects`` (the baseline's generic ``update`` and copying ``find``, this one's named
mode operations).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WAITERS = 200


def child(changes: int) -> dict[str, dict[str, float]]:
    """Run in the version under test (its ``src`` first on the path)."""
    from dgxmm.controller.controller import Controller
    from dgxmm.deploy.budget import Snapshot
    from dgxmm.deploy.placement import Need
    from dgxmm.deploy.sampler import Sample
    from dgxmm.records.changes import Change
    from dgxmm.records.deployment import HOLDS_MEMORY, Deployment, Mode, State
    from dgxmm.settings import OndemandSettings

    class Fake:
        def __init__(self, capacity: float) -> None:
            self.capacity = capacity
            self.deps: dict[str, Deployment] = {}
            self.listeners: list[Any] = []
            self.reads = 0

        def find(self, deployment_id: str) -> Deployment | None:
            self.reads += 1
            dep = self.deps.get(deployment_id)
            return None if dep is None else dep.model_copy()

        def peek(self, deployment_id: str) -> Deployment | None:
            self.reads += 1
            return self.deps.get(deployment_id)

        def all(self) -> list[Deployment]:
            return list(self.deps.values())

        def snapshot(self, exclude: str | None = None) -> Snapshot:
            held = [d for d in self.deps.values() if d.id != exclude and d.state in HOLDS_MEMORY]
            return Snapshot(usable=self.capacity, held=sum(d.memory_gib for d in held), fixed=0.0, measured_free=None)

        def held_gib(self, dep: Deployment) -> float:
            return dep.memory_gib

        def need_of(self, dep: Deployment) -> Need:
            return Need(dep.memory_gib)

        def devices_of(self, dep: Deployment) -> tuple[int, ...]:
            return (0,)

        def add_listener(self, listener: Any) -> None:
            self.listeners.append(listener)

        def latest(self, deployment_id: str) -> Sample | None:
            return Sample(time.monotonic(), 0, 0)

        def event(self, *args: Any) -> None:
            pass

        def audit(self, *args: Any, **kw: Any) -> None:
            pass

        def restart(self, deployment_id: str, **kw: Any) -> None:
            raise AssertionError("nothing starts in this benchmark")

        wake = restart

        async def stop(self, *args: Any, **kw: Any) -> bool:
            return False

        def update(self, deployment_id: str, **changes: Any) -> Deployment:
            old = self.deps[deployment_id]
            self.deps[deployment_id] = old.model_copy(update=changes)
            self.tell(Change("config", self.deps[deployment_id], old=old))
            return self.deps[deployment_id]

        def switch_mode(self, deployment_id: str, mode: Mode, idle_timeout_s: float | None) -> None:
            self.update(deployment_id, mode=mode, idle_timeout_s=idle_timeout_s, pending_mode=None)

        def pend_mode(self, deployment_id: str, pending: Mode | None, idle_timeout_s: float | None) -> None:
            self.update(deployment_id, pending_mode=pending, idle_timeout_s=idle_timeout_s)

        def add(self, name: str, gib: float, state: State, mode: Mode = Mode.ON_DEMAND) -> None:
            self.deps[name] = Deployment(
                id=name, name=name, served_name=name, engine="command", memory_gib=gib, mode=mode, state=state
            )
            self.tell(Change("created", self.deps[name]))

        def set_state(self, name: str, state: State) -> None:
            old = self.deps[name]
            self.deps[name] = old.model_copy(update={"state": state})
            self.tell(Change("state", self.deps[name], old_state=old.state))

        def tell(self, change: Change) -> None:
            for listener in self.listeners:
                listener(change)

    settings = OndemandSettings(
        max_queued=10_000,
        queue_timeout_s=3600,
        waiter_wake_s=600,
        idle_timeout_min_s=1,
        idle_timeout_s=3600,
        counters_publish_s=0,
        max_drain_wait_s=0,
        stop_settle_s=0,
    )

    async def settle() -> None:
        for _ in range(8):  # a woken waiter looks in the next tick; an attempt it starts in the one after
            await asyncio.sleep(0)

    async def scenario(name: str) -> dict[str, float]:
        fx = Fake(capacity=1000 if name != "20 queued" else 10)
        controller = Controller(settings, fx, lambda _: None)
        fx.add("other", 1, State.READY)
        tasks = []
        if name == "200 starting":
            for i in range(WAITERS):
                fx.add(f"d{i:03}", 1, State.STARTING)
                tasks.append(asyncio.create_task(controller.acquire(f"d{i:03}")))
        elif name == "1 starting":
            fx.add("one", 1, State.STARTING)
            tasks = [asyncio.create_task(controller.acquire("one")) for _ in range(WAITERS)]
        else:
            fx.add("busy", 9, State.READY)
            slot = await controller.acquire("busy")  # in flight: never a victim
            for i in range(20):
                fx.add(f"q{i:02}", 5, State.STOPPED)
                tasks += [asyncio.create_task(controller.acquire(f"q{i:02}")) for _ in range(WAITERS // 20)]
        await settle()
        if name == "20 queued":
            assert len(controller.queue_ids()) == 20, controller.queue_ids()
        fx.reads = 0
        started = time.perf_counter()
        for n in range(changes):
            if name == "20 queued":
                fx.update("other", idle_timeout_s=3600 + n % 2)
            else:
                fx.set_state("other", State.ASLEEP if n % 2 == 0 else State.READY)
            await settle()
        seconds = time.perf_counter() - started
        reads = fx.reads
        assert not any(t.done() for t in tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if name == "20 queued":
            slot.release()
        controller.close()
        return {"us_per_change": seconds / changes * 1e6, "looks_per_change": reads / changes}

    async def main() -> dict[str, dict[str, float]]:
        return {name: await scenario(name) for name in ("200 starting", "1 starting", "20 queued")}

    return asyncio.run(main())


def run(src: Path, changes: int) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", "--changes", str(changes)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def export(rev: str, dest: Path) -> Path:
    archive = dest / "src.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), rev, "src"], cwd=ROOT, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / "src"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="HEAD~1", help="a git revision whose src is the baseline")
    parser.add_argument("--baseline-src", type=Path, help="a checkout's src directory instead")
    parser.add_argument("--changes", type=int, default=400)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(opts.changes)))
        return 0
    with tempfile.TemporaryDirectory(prefix="dgxmm-wakeups-") as tmp:
        base_src = opts.baseline_src or export(opts.baseline, Path(tmp))
        label = str(opts.baseline_src) if opts.baseline_src else opts.baseline
        base = run(base_src, opts.changes)
        this = run(ROOT / "src", opts.changes)
    print(f"{WAITERS} waiters, {opts.changes} changes each; baseline {label}, this checkout's src\n")
    print(f"{'scenario':<14} {'µs/change':>22} {'ratio':>7}   {'waiter looks/change':>22}")
    for name in base:
        b, t = base[name], this[name]
        ratio = t["us_per_change"] / b["us_per_change"]
        looks = f"{b['looks_per_change']:.0f} -> {t['looks_per_change']:.0f}"
        print(f"{name:<14} {b['us_per_change']:>10.0f} -> {t['us_per_change']:<9.0f} {ratio:>7.3f}   {looks:>22}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
