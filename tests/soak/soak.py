#!/usr/bin/env python3
"""``make soak``: dgxmm under mixed traffic and injected faults, then a table of its invariants.

    python tests/soak/soak.py [--minutes 10] [--callers 6] [--out test-output/soak]

Needs ``DGXMM_LLAMA_SERVER`` (``make soak`` builds llama-server and sets it). It runs ``dgxmm
serve`` as users do, with three llama-server deployments on the tiny random model (memory for
two of them) and two test-engine deployments, and for ``--minutes``:

* callers from four peers send mixed streaming and non-streaming chat completions, one in ten
  hanging up on purpose (traffic.py);
* faults, one every 9 s in turn: the ``faulty`` engine SIGKILLed, then SIGSTOPped (it must be
  found as hung and replaced), a key rotation, a mode switch to always on and back, a llama
  engine SIGKILLed; all along, the ``busy`` engine's health check takes 8 s while it answers;
  in the middle, one SIGTERM of dgxmm and a restart (chaos.py).

Then it prints the invariants (invariants.py): no failed request that a fault does not explain
(they are counted by cause), no slot leaked, no busy engine stopped, no engine process untracked,
no orphan, dgxmm's RSS and open files flat; and reports the p99 queue wait and the cold-start
overhead. The table also goes to ``--out``/soak.md. Exit code 1 when an invariant does not hold.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import httpx  # noqa: E402
from chaos import Chaos  # noqa: E402
from fleet import Deployments, Fleet  # noqa: E402
from invariants import render, rows  # noqa: E402
from traffic import Callers  # noqa: E402
from watch import Watch, marked_engines  # noqa: E402

SETTLE_S = 30.0  # after the traffic: how long slots and queues may take to come back to zero


def scrape(fleet: Fleet) -> str:
    resp = httpx.get(
        f"http://127.0.0.1:{fleet.dgxmm.port}/dgxmm/metrics",
        headers={"Authorization": f"Bearer {fleet.dgxmm.token}"},
        timeout=30,
    )
    resp.raise_for_status()
    return resp.text


def orphans_after(what: str, deps: Deployments, wait_s: float = 5.0) -> list[str]:
    """Engine processes still alive ``wait_s`` after dgxmm exited (there must be none)."""
    deadline = time.monotonic() + wait_s
    while (left := marked_engines(deps.all)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [f"{what}: pid {pid} of {deps.names.get(dep_id, dep_id)}" for pid, dep_id in left.items()]


def leaks(fleet: Fleet) -> dict[str, object]:
    """What is still held once the traffic has stopped: slots, queued requests, busy connections."""
    views = fleet.admin("GET", "/deployments").json()
    found: dict[str, object] = {}
    for view in views:
        status = view["ondemand"] or {}
        if status.get("inflight") or status.get("queued"):
            found[view["name"]] = f"{status.get('inflight')} in flight, {status.get('queued')} queued"
    server = fleet.admin("GET", "/host").json()["server"]
    if server["busy"] > 1 or server["gateway_requests"]:  # (the admin call asking counts as busy)
        found["server"] = f"{server['busy']} busy connections, {server['gateway_requests']} gateway requests"
    return found


def able_at(root: Path, deps: Deployments) -> dict[str, list[float]]:
    """When each start of the test engines could answer (the line they write, in their logs)."""
    found: dict[str, list[float]] = {}
    for dep in (deps.busy, deps.faulty):
        log = root / "data" / "logs" / f"{dep}.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        found[dep] = [float(line.rsplit(" ", 1)[1]) for line in lines if " able to answer at " in line]
    return found


def busy_failures(fleet: Fleet, deps: Deployments) -> list[str]:
    """The busy engine (slow health while it answers) must never be failed or replaced."""
    events = fleet.admin("GET", "/events/history", params={"deployment_id": deps.busy, "limit": 5000}).json()
    return [f"{event['text'][:120]}" for event in events if event["text"].startswith("Failed")]


async def soak(minutes: float, count: int, out: Path) -> bool:
    llama = os.environ.get("DGXMM_LLAMA_SERVER")
    if not llama:
        raise SystemExit("DGXMM_LLAMA_SERVER is not set: run `make soak`, which builds llama-server")
    root = Path(tempfile.mkdtemp(prefix="dgxmm-soak-"))
    fleet = Fleet(root, llama)
    await asyncio.to_thread(fleet.dgxmm.start)
    orphans: list[str] = []
    metrics: list[str] = []
    try:
        deps = await asyncio.to_thread(fleet.create)
        key = [fleet.key]
        callers = Callers(fleet.gateway, deps, lambda: key[0], count)
        chaos = Chaos(fleet, deps, lambda new: key.__setitem__(0, new))
        watch = Watch(fleet, deps.all)
        stop = asyncio.Event()

        async def restart() -> None:
            watch.up = False
            metrics.append(await asyncio.to_thread(scrape, fleet))
            await asyncio.to_thread(fleet.dgxmm.stop)  # SIGTERM, as systemd or docker stop would
            orphans.extend(await asyncio.to_thread(orphans_after, "after the restart's shutdown", deps))
            await asyncio.to_thread(fleet.dgxmm.start)
            watch.run_no += 1
            watch.up = True

        began = time.monotonic()
        print(f"soak: {minutes:g} min, {count} callers, dgxmm in {root}", flush=True)
        tasks = [
            asyncio.create_task(callers.run(stop)),
            asyncio.create_task(watch.run(stop)),
            asyncio.create_task(chaos.run(stop, began + minutes * 30, restart)),
        ]
        await asyncio.sleep(minutes * 60)
        stop.set()
        await asyncio.gather(*tasks)
        deadline = time.monotonic() + SETTLE_S
        while (leaked := await asyncio.to_thread(leaks, fleet)) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        metrics.append(await asyncio.to_thread(scrape, fleet))
        busy = await asyncio.to_thread(busy_failures, fleet, deps)
    finally:
        await asyncio.to_thread(fleet.dgxmm.stop)
    orphans.extend(await asyncio.to_thread(orphans_after, "after the run", deps))
    table = rows(
        callers.outcomes,
        chaos.faults,
        watch.samples,
        leaked=leaked,
        busy_failures=busy,
        lost_engines=watch.lost_engines(),
        orphans=orphans,
        metrics=metrics,
        skipped=chaos.skipped,
        able_at=able_at(root, deps),
    )
    text = render(table)
    print(text, flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.md").write_text(f"# make soak: {minutes:g} min, {count} callers\n\n{text}\n")
    held = all(row.ok is not False for row in table)
    print(
        f"soak: every invariant holds (dgxmm's logs in {root})"
        if held
        else f"soak: an invariant does not hold (dgxmm's logs in {root})",
        flush=True,
    )
    return held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--callers", type=int, default=6)
    parser.add_argument("--out", type=Path, default=HERE.parents[1] / "test-output" / "soak")
    args = parser.parse_args()
    sys.exit(0 if asyncio.run(soak(args.minutes, args.callers, args.out)) else 1)


if __name__ == "__main__":
    main()
