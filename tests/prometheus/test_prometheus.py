"""A real Prometheus scrapes a served dgxmm while a cold start, a queued request, a make-room
stop, a reaper stop and a refused request go through the gateway; its HTTP API then shows the
counters and histograms moved, every rule evaluates, and every expression of the Grafana
dashboard returns data (issue 13)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from pathlib import Path

import pytest
from conftest import caller, engine_command, gateway_settings, wait_until
from engines.litellm_standin import StandIn

from prometheus.promserver import ROOT, PromServer, binary

pytestmark = pytest.mark.timeout(240)

DASHBOARD = ROOT / "examples" / "grafana" / "dgxmm.json"
CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
# What Grafana puts in for the dashboard's variables: every model, a rate window of a few scrapes.
VARIABLES = {"$__rate_interval": "30s", "$served_name": ".*", "${datasource}": ""}


def dashboard_queries() -> list[tuple[str, str, bool]]:
    """(panel title, PromQL, instant) of every target of the dashboard, variables filled in as
    Grafana does; ``instant`` for table targets, else Grafana asks for a range."""
    board = json.loads(DASHBOARD.read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, (panel["title"], expr)
            found.append((panel["title"], expr, bool(target.get("instant"))))
    return found


def variable_queries() -> list[str]:
    """The dashboard's ``label_values(metric, label)`` variables as PromQL."""
    board = json.loads(DASHBOARD.read_text())
    out = []
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["query"]["query"]).groups()
            out.append(f"count by ({label}) ({metric})")
    return out


async def expect(prom: PromServer, checks: list[tuple[str, float, float]], timeout: float = 60) -> None:
    """Wait until every ``(expr, low, high)`` has one sample within [low, high] in the same poll.
    Polling, not a single look: a scrape that timed out on a loaded machine makes a target's
    series stale until the next one."""
    deadline = time.monotonic() + timeout
    while True:
        wrong = []
        for expr, low, high in checks:
            got = await prom.value(expr)
            if got is None or not low <= got <= high:
                wrong.append(f"{expr} = {got}, want {low}..{high}")
        if not wrong:
            return
        if time.monotonic() > deadline:
            raise AssertionError("Prometheus did not see: " + "; ".join(wrong))
        await asyncio.sleep(0.5)


def exactly(expr: str, want: float) -> tuple[str, float, float]:
    return expr, want, want


async def test_prometheus_sees_cold_starts_queueing_stops_and_refusals(serve, tmp_path: Path) -> None:
    binary("prometheus")
    lite = await StandIn().start()
    (tmp_path / "master.key").write_text(lite.master_key + "\n")
    prom: PromServer | None = None
    try:
        svc = await serve(
            gateway_settings(
                tmp_path,
                memory={"capacity_gib": 2},
                ondemand={"idle_timeout_s": 0.5, "reaper_interval_s": 3600},  # the test runs the reaper
                litellm={
                    "enabled": True,
                    "url": lite.url,
                    "master_key_file": tmp_path / "master.key",
                    "sync_interval_s": 1,
                },
            )
        )
        a = await svc.create(name="a", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
        b = await svc.create(name="b", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
        token = svc.settings.server.data_dir / "admin-token"
        began = time.time()
        prom = await PromServer(tmp_path / "prom", f"127.0.0.1:{svc.settings.server.port}", token).start()
        # scraped at least once before any traffic: every histogram starts at zero
        await expect(
            prom,
            [exactly('up{job="dgxmm"}', 1), exactly('dgxmm_ondemand_cold_start_seconds_count{served_name="a"}', 0)],
        )

        async with caller(svc) as g:
            first = await g.post(f"/{a['id']}/v1/chat/completions", json={**CHAT, "model": "a"})
            assert first.status_code == 200  # a cold start of "a"
            # its engine's own counts, sampled by dgxmm, scraped while it runs (a dashboard panel)
            await expect(prom, [('dgxmm_engine_requests_running{served_name="a"}', 0, 1)])
            slot = await svc.ctx.ondemand.acquire(a["id"])  # "a" is busy: "b" cannot make room yet
            queued = asyncio.create_task(
                g.post(f"/{b['id']}/v1/chat/completions", json={**CHAT, "model": "b", "stream": True})
            )
            await wait_until(lambda: svc.ctx.ondemand.status(b["id"])["phase"] == "queued", timeout=20)
            slot.release()  # idle 0.5 s later, "a" is stopped to make room for "b"
            answer = await asyncio.wait_for(queued, 60)
        assert answer.status_code == 200 and "ondemand-queued" in answer.text and "[DONE]" in answer.text
        assert (await svc.view(a["id"]))["state"] == "stopped"
        async with caller(svc, key="wrong") as intruder:
            assert (await intruder.post(f"/{a['id']}/v1/chat/completions", json=CHAT)).status_code == 401

        async def reaped() -> bool:
            return b["id"] in await svc.ctx.ondemand.reap_once()

        await wait_until(reaped, timeout=20, interval=0.2)

        # counters as Prometheus scraped them
        await expect(
            prom,
            [
                exactly(expr, want)
                for expr, want in (
                    ('dgxmm_ondemand_stops_total{served_name="b",reason="idle"}', 1),
                    ('dgxmm_ondemand_cold_start_seconds_count{served_name="a"}', 1),
                    ('dgxmm_ondemand_cold_start_seconds_count{served_name="b"}', 1),
                    ('dgxmm_ondemand_starts_total{served_name="b"}', 1),
                    ('dgxmm_ondemand_queued_requests_total{served_name="b"}', 1),
                    ('dgxmm_ondemand_queue_wait_seconds_count{served_name="b"}', 1),
                    ('dgxmm_ondemand_waits_total{served_name="b",outcome="granted"}', 1),
                    ('dgxmm_ondemand_stops_total{served_name="a",reason="make_room"}', 1),
                    ('dgxmm_ondemand_stops_total{served_name="a",reason="idle"}', 0),
                    ('dgxmm_gateway_refusals_total{deployment="",reason="key"}', 1),
                    (
                        'sum(dgxmm_gateway_requests_total{served_name=~"a|b",route="chat/completions",status_class="2xx"})',
                        2,
                    ),
                    ('dgxmm_deployment_start_seconds_count{served_name="b",kind="start",outcome="ready"}', 1),
                    ('sum(dgxmm_engine_launch_seconds_count{engine="command"})', 2),
                    ('dgxmm_deployment_state{served_name="b",state="stopped"}', 1),
                    ('dgxmm_deployment_memory_held_bytes{served_name="b"}', 0),
                    ("dgxmm_memory_capacity_bytes", 2 * 1024**3),
                    ('sum(dgxmm_litellm_entries_written_total{operation="add"})', 2),
                )
            ]
            + [("dgxmm_litellm_last_success_timestamp_seconds", 1.7e9, math.inf)],
        )
        # the histograms moved as time series: zero at the first scrape, one cold start each later;
        # the recording rule Prometheus evaluates has each model's p95
        moved = []
        for name in ("a", "b"):
            moved += [
                (f'increase(dgxmm_ondemand_cold_start_seconds_count{{served_name="{name}"}}[5m])', 0.01, 10),
                (f'dgxmm_ondemand_cold_start_seconds_sum{{served_name="{name}"}}', 0.001, 60),
                (f'served_name:dgxmm_ondemand_cold_start_seconds:p95_1h{{served_name="{name}"}}', 0.001, 60),
            ]
        moved.append(('increase(dgxmm_ondemand_stops_total{served_name="a",reason="make_room"}[5m])', 0.01, 10))
        await expect(prom, moved)

        # every rule of the example files loaded and evaluated without an error
        async def rules_ok() -> list[dict] | None:
            rules = [rule for group in (await prom.api("rules"))["groups"] for rule in group["rules"]]
            return rules if len(rules) == prom.rules and all(rule["health"] == "ok" for rule in rules) else None

        await wait_until(rules_ok, timeout=30, interval=0.5)
        # every dashboard expression parses and returns data over the test's time (as a panel asks)
        for title, expr, instant in dashboard_queries():
            result = await prom.query(expr) if instant else await prom.query_range(expr, began, time.time())
            assert result, f"panel {title!r}: no series for {expr}"
        for expr in variable_queries():
            assert {r["metric"]["served_name"] for r in await prom.query(expr)} == {"a", "b"}
        cold = next(expr for title, expr, _ in dashboard_queries() if title.startswith("Cold start"))
        finite = [r for r in await prom.query(cold) if not math.isnan(float(r["value"][1]))]
        assert {r["metric"]["served_name"] for r in finite} == {"a", "b"}
    finally:
        if prom is not None:
            await prom.stop()
        await lite.stop()
