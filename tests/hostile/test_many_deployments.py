"""Many deployments (issue 26): with 1,000 of them the list takes under a second of dgxmm's CPU,
opening the event stream (whose first message is every deployment's view) does not stall the
event loop (its own lag probe says so, issue 57), and no reader sees a dict change under it while
deployments are created. Against ``dgxmm serve`` as a
child process, with one ready engine taking gateway traffic throughout."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import engine_command
from prometheus_client.parser import text_string_to_metric_families
from served import Served, until

pytestmark = pytest.mark.hostile

COUNT = 1000
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def body(i: int) -> dict[str, Any]:
    return {"name": f"d{i:04d}", "engine": "command", "memory_gib": 1, "mode": "on_demand", "command": engine_command()}


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    """A served dgxmm with COUNT stopped on-demand deployments and one ready one (its id)."""
    served = Served(tmp_path_factory.mktemp("many"), {"DGXMM_SERVER__LOG_LEVEL": "warning"}).start()
    try:
        with served.admin() as admin:
            view = admin.post("/deployments", json={**body(-1), "name": "m", "idle_timeout_s": 3600}).json()
            with ThreadPoolExecutor(4) as pool:
                codes = list(pool.map(lambda i: admin.post("/deployments", json=body(i)).status_code, range(COUNT)))
            assert codes == [201] * COUNT
        with served.gateway() as g:  # the first request starts its engine
            assert g.post(f"/{view['id']}/v1/chat/completions", json=CHAT).status_code == 200
        yield served, str(view["id"])
    finally:
        served.stop()


class Traffic(threading.Thread):
    """Gateway requests one after another, counted."""

    def __init__(self, served: Served, deployment_id: str) -> None:
        super().__init__(daemon=True)
        self.served, self.url = served, f"/{deployment_id}/v1/chat/completions"
        self.stop, self.count, self.failures = threading.Event(), 0, 0

    def run(self) -> None:
        with self.served.gateway() as g:
            while not self.stop.is_set():
                status = g.post(self.url, json=CHAT).status_code
                self.count += 1
                self.failures += status != 200

    def __enter__(self) -> Traffic:
        self.start()
        until(lambda: self.count >= 5, timeout=60, interval=0.01)  # warmed up: a connection and a slot are in use
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(30)


def cpu_seconds(served: Served) -> float:
    """dgxmm's process CPU time, user and system (/proc/PID/stat: no request to dgxmm)."""
    fields = Path(f"/proc/{served.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


@pytest.mark.bounded
def test_the_list_of_a_thousand_deployments_takes_under_a_second_of_cpu(many: tuple[Served, str]) -> None:
    """Counted in dgxmm's CPU time, not the answer's wall time, which a busy machine stretches."""
    served, _ = many
    with served.admin() as admin:
        for _ in range(3):
            began = cpu_seconds(served)
            resp = admin.get("/deployments")
            spent = cpu_seconds(served) - began
            assert resp.status_code == 200 and len(resp.json()) == COUNT + 1
            assert spent < 1.0, f"GET /api/deployments took {spent:.2f} s of CPU"  # (it was 1.8 s with 2,000)


LAG = ("dgxmm_event_loop_lag_seconds", "dgxmm_event_loop_lag_cpu_seconds")


def loop_lag(served: Served) -> dict[str, float]:
    """The event loop's lag histograms, each series' value by its name and bucket
    (``dgxmm_event_loop_lag_cpu_seconds_bucket 0.25``...): a scrape restricted to them, as the
    whole page's collection would itself hold the loop up with a thousand deployments."""
    names = [f"{name}_{part}" for name in LAG for part in ("bucket", "count", "sum")]
    resp = httpx.get(
        served.base + "/metrics", params={"name[]": names}, headers={"Authorization": f"Bearer {served.token()}"}
    )
    assert resp.status_code == 200, resp.text
    return {
        f"{s.name} {s.labels.get('le', '')}".strip(): s.value
        for family in text_string_to_metric_families(resp.text)
        for s in family.samples
    }


def ticked(served: Served) -> dict[str, float]:
    """The lag histograms once the probe's tick pending now has run: the one that waited
    through whatever ended just before (a stall shows in the scrape after its tick)."""
    pending = loop_lag(served)["dgxmm_event_loop_lag_seconds_count"]
    return until(lambda: (page := loop_lag(served))["dgxmm_event_loop_lag_seconds_count"] > pending and page)


@pytest.mark.bounded
def test_opening_the_event_stream_does_not_stall_the_gateway(many: tuple[Served, str]) -> None:
    """Its first message is every deployment's view: 3.4 s of blocked event loop with 2,000 once;
    built at once on the loop it still holds it about 0.1 s with 1,000 (each of the three opens
    leaves a lag with 0.01-0.1 s of the loop's own computing). Measured from inside dgxmm, by its
    loop-lag probe: in pieces of 50 views no tick waits on the loop's own work at all (0 s in
    every tick), and a busy machine's lag, which is not the loop computing, does not count."""
    served, dep_id = many
    stalls = "dgxmm_event_loop_lag_cpu_seconds"
    with Traffic(served, dep_id) as traffic, served.admin() as admin:
        before = ticked(served)
        for _ in range(3):
            views = 0
            with admin.stream("GET", "/events") as resp:
                for line in resp.iter_lines():
                    views += line == "event: deployment"
                    if views == COUNT + 1:
                        break
            assert views == COUNT + 1
        after = ticked(served)
    assert traffic.failures == 0 and traffic.count > 10
    assert after[f"{stalls}_count"] > before[f"{stalls}_count"]
    over = [page[f"{stalls}_count"] - page[f"{stalls}_bucket 0.01"] for page in (before, after)]
    computed = after[f"{stalls}_sum"] - before[f"{stalls}_sum"]
    assert over[1] == over[0], (
        f"{over[1] - over[0]:.0f} lags with over 0.01 s of the loop's own work ({computed:.2f} s in all)"
    )


def test_host_and_lists_never_fail_while_deployments_are_created(many: tuple[Served, str]) -> None:
    """The one-thread rule: readers and writers of the deployments all run on the event loop
    (``GET /api/host`` answered 500 "dictionary changed size during iteration" 83 times in 114)."""
    served, _ = many
    stop, codes = threading.Event(), []

    def read(path: str) -> None:
        with served.admin() as admin:
            while not stop.is_set():
                try:
                    codes.append(admin.get(path).status_code)
                except httpx.HTTPError as exc:  # (in the list, not lost with the thread)
                    codes.append(type(exc).__name__)
                    return

    readers = [threading.Thread(target=read, args=(p,), daemon=True) for p in ("/host", "/host", "/deployments")]
    for reader in readers:
        reader.start()
    try:
        with served.admin() as admin:
            i = 0
            reading = lambda: all(r.is_alive() for r in readers)  # noqa: E731
            while i < 30 or (len(codes) <= 20 and reading() and i < 1000):  # (a loaded machine reads slowly)
                created = admin.post("/deployments", json=body(COUNT + i))
                assert created.status_code == 201, created.text
                removed = admin.delete(f"/deployments/{created.json()['id']}")
                assert removed.status_code == 200, removed.text
                i += 1
    finally:
        stop.set()
        for reader in readers:
            reader.join(30)
    assert len(codes) > 20 and set(codes) == {200}, sorted(set(map(str, codes)))
