"""The hostile-input suite: attacks replayed against a served dgxmm (``dgxmm serve`` as a child
process, with the usual open files limit of 1024), each asserting its bound. Run it alone with
``pytest -m hostile``. The RSS figures of every attack are written to
``test-output/hostile/rss.md``."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import httpx
import pytest
from conftest import engine_command
from served import Served, until

RSS_BOUND_MIB = 100.0  # issue 11: RSS stays within 100 MB of its idle figure under each attack
HEADER_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0
DECLARED_DIR = "deployments.d"  # the served dgxmm's deployments_dir, watched every 0.1 s
REPORT = Path(__file__).resolve().parents[2] / "test-output" / "hostile" / "rss.md"


@dataclass
class Front:
    served: Served
    deployment: dict[str, Any]
    engine: str  # the engine's base URL, to ask it what it saw
    idle_rss_mib: float
    figures: list[tuple[str, float, float, float]] = field(default_factory=list)

    engine_client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=10))

    @property
    def declared_dir(self) -> Path:
        """The served dgxmm's ``deployments_dir``: empty, but for the files a test writes there."""
        return self.served.data_dir.parent / DECLARED_DIR

    def engine_requests(self) -> list[dict[str, Any]]:
        return list(self.engine_client.get(self.engine + "/_test/requests").json())

    def clear_engine(self) -> None:
        self.engine_client.delete(self.engine + "/_test/requests")

    def host(self) -> dict[str, Any]:
        with self.served.admin() as admin:
            resp = admin.get("/host")
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def connect(self, address: str = "127.0.0.1") -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.served.port), timeout=30, source_address=(address, 0))

    def settle(self) -> None:
        """Wait until the attack's connections are gone (timeouts and lingers ran out)."""
        until(lambda: self.host()["server"]["connections"] <= 2, timeout=HEADER_TIMEOUT_S + 30)


class Peak(threading.Thread):
    """Samples a process's RSS every 10 ms until stopped; ``peak`` is the highest seen."""

    def __init__(self, served: Served) -> None:
        super().__init__(daemon=True)
        self.served = served
        self.peak = served.rss_mib()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.01):
            self.peak = max(self.peak, self.served.rss_mib())

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, self.served.rss_mib())


def bounded(front: Front, attack: str, peak: Peak) -> None:
    """Record the attack's RSS figures and assert the bound."""
    after = front.served.rss_mib()
    front.figures.append((attack, front.idle_rss_mib, peak.peak, after))
    assert peak.peak - front.idle_rss_mib <= RSS_BOUND_MIB, (attack, front.idle_rss_mib, peak.peak)


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    tmp = tmp_path_factory.mktemp("hostile")
    (tmp / DECLARED_DIR).mkdir()
    served = Served(
        tmp,
        {
            "DGXMM_SERVER__HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
            "DGXMM_SERVER__BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
            "DGXMM_SERVER__LOG_LEVEL": "warning",
            "DGXMM_SERVER__DEPLOYMENTS_DIR": str(tmp / DECLARED_DIR),
            "DGXMM_SERVER__DEPLOYMENTS_POLL_S": "0.1",
        },
        open_files=1024,
    ).start()
    front: Front | None = None
    try:
        with served.admin() as admin:
            view = admin.post(
                "/deployments",
                json={
                    "name": "m",
                    "aliases": ["m-alias"],
                    "engine": "command",
                    "memory_gib": 1,
                    "mode": "on_demand",
                    "idle_timeout_s": 3600,
                    "command": engine_command(),
                },
            ).json()
        with served.gateway() as g:  # the first request starts the engine
            assert g.post(f"/{view['id']}/v1/chat/completions", json={"model": "m", "messages": []}).status_code == 200
        with served.admin() as admin:
            view = admin.get(f"/deployments/{view['id']}").json()
        time.sleep(1)  # let start-up garbage settle before the idle figure
        front = Front(served, view, view["base_url"], served.rss_mib())
        front.clear_engine()
        yield front
    finally:
        served.stop()
        if front is not None:
            front.engine_client.close()
            write_report(front.figures)


def write_report(figures: list[tuple[str, float, float, float]]) -> None:
    if not figures:
        return
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        "| attack | idle RSS (MiB) | peak RSS (MiB) | peak - idle (MiB) | after (MiB) |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {a} | {i:.1f} | {p:.1f} | {p - i:+.1f} | {after:.1f} |" for a, i, p, after in figures]
    with REPORT.open("a") as f:
        f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M:%S')}\n\n" + "\n".join(lines) + "\n")
