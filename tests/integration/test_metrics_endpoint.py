"""GET {base}/metrics through the real service: who may read it, the text format, and gateway
traffic moving the counters and histograms (issue 13)."""

from __future__ import annotations

import pytest

import time
from pathlib import Path

import httpx
from conftest import caller, engine_command, gateway_settings, make_settings, wait_until
from integration.test_gateway_checks import CHAT, od_service
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a metrics page by (name, labels)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(page: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    found = [v for (n, ls), v in page.items() if n == name and set(labels.items()) <= ls]
    assert found, f"no sample {name} {labels}"
    return sum(found)


def metrics_client(svc, address: str = "127.0.0.1", **kw) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=svc.url, transport=httpx.AsyncHTTPTransport(local_address=address), timeout=10, **kw
    )


async def scrape(svc) -> dict:
    resp = await svc.client.get("/metrics")
    assert resp.status_code == 200, resp.text
    return samples(resp.text)


async def test_metrics_need_the_admin_token_by_default(serve, tmp_path: Path) -> None:
    svc = await serve(make_settings(tmp_path))
    async with metrics_client(svc) as anonymous:
        refused = await anonymous.get("/metrics")
        wrong = await anonymous.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    assert wrong.status_code == 401
    resp = await svc.client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    page = samples(resp.text)
    assert value(page, "dgxmm_memory_capacity_bytes") == 100 * 1024**3
    assert value(page, "dgxmm_build_info", instance=svc.ctx.instance_id) == 1
    assert value(page, "process_resident_memory_bytes") > 0  # dgxmm's own process
    assert "/metrics" not in (await svc.client.get("/api/openapi.json")).text


async def test_public_metrics_only_from_allowed_peers_without_proxy(serve, tmp_path: Path) -> None:
    svc = await serve(make_settings(tmp_path, metrics={"public": True, "allowed_cidrs": ["127.0.0.2/32"]}))
    async with metrics_client(svc, "127.0.0.2") as allowed, metrics_client(svc, "127.0.0.3") as other:
        assert (await allowed.get("/metrics")).status_code == 200
        assert (await other.get("/metrics")).status_code == 401
        proxied = await allowed.get("/metrics", headers={"X-Forwarded-For": "127.0.0.2"})
        assert proxied.status_code == 401
        token = {"Authorization": f"Bearer {svc.ctx.admin_token}"}
        assert (await other.get("/metrics", headers=token)).status_code == 200
    async with metrics_client(svc) as host:  # 127.0.0.1, not in the list
        assert (await host.get("/metrics")).status_code == 401


async def test_gateway_traffic_moves_counters_and_histograms(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path)
    dep = {"deployment": view["id"], "served_name": "m"}
    before = await scrape(svc)
    assert value(before, "dgxmm_ondemand_cold_start_seconds_count", **dep, engine="command") == 0
    assert value(before, "dgxmm_deployment_state", **dep, state="stopped") == 1
    async with caller(svc) as g:
        first = await g.post(f"/{view['id']}/v1/chat/completions", json=CHAT)  # cold start
        assert first.status_code == 200
        for _ in range(3):
            assert (await g.post(f"/{view['id']}/v1/chat/completions?n=1", json={**CHAT, "stream": True})).is_success
    async with caller(svc, key="wrong") as bad:
        assert (await bad.post(f"/{view['id']}/v1/chat/completions", json=CHAT)).status_code == 401
    page = await scrape(svc)
    assert value(page, "dgxmm_gateway_requests_total", **dep, route="chat/completions", status_class="2xx") == 4
    assert value(page, "dgxmm_gateway_requests_total", deployment="", route="other", status_class="4xx") == 1
    assert value(page, "dgxmm_gateway_refusals_total", deployment="", reason="key") == 1
    assert value(page, "dgxmm_gateway_time_to_first_byte_seconds_count", **dep) == 4
    assert value(page, "dgxmm_gateway_request_duration_seconds_count", **dep) == 4
    assert value(page, "dgxmm_gateway_response_bytes_total", **dep) > 1000
    assert value(page, "dgxmm_ondemand_cold_start_seconds_count", **dep) == 1
    assert value(page, "dgxmm_ondemand_queue_wait_seconds_count", **dep) == 1
    assert value(page, "dgxmm_ondemand_waits_total", **dep, outcome="granted") == 1
    assert value(page, "dgxmm_ondemand_starts_total", **dep) == 1
    assert value(page, "dgxmm_deployment_start_seconds_count", **dep, kind="start", outcome="ready") == 1
    assert value(page, "dgxmm_engine_launch_seconds_count", **dep, engine="command") == 1
    assert value(page, "dgxmm_deployment_state", **dep, state="ready") == 1
    assert value(page, "dgxmm_deployment_memory_held_bytes", **dep) == 1024**3
    assert value(page, "dgxmm_ondemand_inflight", **dep) == 0


async def test_request_ids_reach_the_engine_and_come_back(serve, tmp_path: Path) -> None:
    svc, view = await od_service(serve, tmp_path, state="ready")
    url = f"/{view['id']}/v1/chat/completions"
    async with caller(svc) as g:
        mine = await g.post(url, json=CHAT, headers={"X-Request-Id": "req-42.a:b"})
        insane = await g.post(url, json=CHAT, headers={"X-Request-Id": "two words\t" + "x" * 200})
        made = await g.post(url, json={**CHAT, "stream": True})
        refused = await g.post(f"/{view['id']}/v1/nope", json=CHAT, headers={"X-Request-Id": "r-404"})
    async with caller(svc, "127.0.0.99") as stranger:  # not an allowed peer: the guard's plain 404
        hidden = await stranger.post(url, json=CHAT, headers={"X-Request-Id": "r-guard"})
    assert mine.headers["x-request-id"] == "req-42.a:b"
    generated = insane.headers["x-request-id"]
    assert generated != made.headers["x-request-id"] and len(generated) == 16 and " " not in generated
    assert refused.status_code == 404 and refused.headers["x-request-id"] == "r-404"
    assert hidden.status_code == 404 and "x-request-id" not in hidden.headers
    async with httpx.AsyncClient() as c:
        seen = [r["headers"]["x-request-id"] for r in (await c.get(view["base_url"] + "/_test/requests")).json()]
    assert seen == ["req-42.a:b", generated, made.headers["x-request-id"]]


async def test_a_started_sse_answer_carries_the_request_id(serve, tmp_path: Path) -> None:
    """The queued notice begins the answer before the engine does: it carries the id too."""
    svc = await serve(gateway_settings(tmp_path, memory={"capacity_gib": 2}))
    a = await svc.create(name="a", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    b = await svc.create(name="b", engine="command", memory_gib=2, mode="on_demand", command=engine_command())
    await svc.client.post(f"/api/deployments/{a['id']}/start")
    await svc.wait_state(a["id"], "ready")
    slot = await svc.ctx.ondemand.acquire(a["id"])
    try:
        async with (
            caller(svc) as g,
            g.stream(
                "POST",
                f"/{b['id']}/v1/chat/completions",
                json={**CHAT, "model": "b", "stream": True},
                headers={"X-Request-Id": "queued-1"},
            ) as resp,
        ):
            assert resp.headers["x-request-id"] == "queued-1"
            first = await anext(resp.aiter_lines())
            assert "ondemand-queued" in first
    finally:
        slot.release()

    async def ended() -> dict | None:  # the hang-up reaches the server a moment later
        page = await scrape(svc)
        done = [
            v for (n, ls), v in page.items() if n == "dgxmm_gateway_requests_total" and ("deployment", b["id"]) in ls
        ]
        return page if done else None

    page = await wait_until(ended, timeout=10)
    assert value(page, "dgxmm_gateway_requests_total", deployment=b["id"], status_class="2xx") == 1
    assert value(page, "dgxmm_ondemand_queued_requests_total", deployment=b["id"]) == 1
    assert value(page, "dgxmm_ondemand_waits_total", deployment=b["id"], outcome="gone") == 1
    assert value(page, "dgxmm_gateway_refusals_total", deployment=b["id"]) == 0  # a hang-up is no refusal


def late(page: dict, name: str, bound: str) -> float:
    """Observations of the histogram ``name`` above its bucket ``bound``."""
    return value(page, f"{name}_count") - value(page, f"{name}_bucket", le=bound)


@pytest.mark.bounded
async def test_a_blocked_event_loop_shows_in_the_loop_lag_histograms(serve, tmp_path: Path) -> None:
    """The service runs on this test's loop: computing here for 0.4 s blocks it as a callback of
    dgxmm's would, and the scrape after the probe's next tick counts one lag over 0.25 s."""
    svc = await serve(make_settings(tmp_path))
    lag, cpu = "dgxmm_event_loop_lag_seconds", "dgxmm_event_loop_lag_cpu_seconds"
    before = await scrape(svc)
    ticks = svc.ctx.metrics.loop_lag.lag.count  # (now: ticks may have run since the scrape)
    began = time.thread_time()
    while time.thread_time() - began < 0.4:  # computing (0.35 s of it after the tick was due, at least)
        pass
    page = await wait_until(lambda: ticking(svc, ticks), timeout=30)  # the tick that waited has run
    assert late(page, cpu, "0.25") - late(before, cpu, "0.25") == 1
    assert late(page, lag, "0.25") - late(before, lag, "0.25") >= 1  # (a busy machine may add late ticks)
    assert value(page, f"{cpu}_sum") - value(before, f"{cpu}_sum") >= 0.25


async def ticking(svc, ticks: float) -> dict | None:
    """The metrics page once the probe has observed more than ``ticks`` lags."""
    page = await scrape(svc)
    return page if value(page, "dgxmm_event_loop_lag_seconds_count") > ticks else None


async def test_a_scrape_restricted_by_name_reads_only_those_series(serve, tmp_path: Path) -> None:
    """``name[]`` (as prometheus_client's own handler): the loop's lag alone, none of the
    families that grow with the deployments, so a frequent scrape of it costs the loop nothing."""
    svc = await serve(make_settings(tmp_path))
    await svc.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    names = ["dgxmm_event_loop_lag_seconds_count", "dgxmm_event_loop_lag_cpu_seconds_bucket"]
    resp = await svc.client.get("/metrics", params={"name[]": names})
    assert resp.status_code == 200, resp.text
    assert {name for name, _ in samples(resp.text)} == set(names)
    everything = await scrape(svc)
    assert value(everything, "dgxmm_deployment_info") == 1 and value(everything, "process_cpu_seconds_total") > 0
