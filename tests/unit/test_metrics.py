"""dgxmm's metrics without a server: what is recorded, and how the scrape renders it (issue 13)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dgxmm.deploy.budget import Snapshot
from dgxmm.records.changes import Change
from dgxmm.deploy.sampler import Sample
from dgxmm.records.deployment import Deployment, Mode, State
from dgxmm.telemetry import catalog
from dgxmm.telemetry.collector import Sources, register
from dgxmm.gateway.exchange import Exchange
from dgxmm.telemetry.metrics import Metrics
from dgxmm.telemetry.stats import Buckets

GIB = 1024**3


def dep(dep_id: str = "d1", state: State = State.STOPPED, served: str | None = None, **kw: object) -> Deployment:
    return Deployment(
        id=dep_id,
        name=dep_id,
        served_name=served or dep_id,
        engine="llamacpp",
        memory_gib=2,
        mode=Mode.ON_DEMAND,
        state=state,
        **kw,
    )


@dataclass
class FakeDeployer:
    deps: list[Deployment] = field(default_factory=list)
    listeners: list = field(default_factory=list)

    def all(self) -> list[Deployment]:
        return list(self.deps)

    def add_listener(self, listener) -> None:  # type: ignore[no-untyped-def]
        self.listeners.append(listener)

    def snapshot(self, exclude: str | None = None) -> Snapshot:
        held = sum(d.memory_gib for d in self.deps if d.holds_memory)
        return Snapshot(usable=10, held=held, fixed=1, measured_free=None)


@dataclass
class FakeTrack:
    inflight: int = 3
    waiting: int = 2
    refused_until: float = 142.5


class FakeController:
    """Every deployment has 3 requests in flight, 2 waiting, and 42.5 s of backoff left."""

    def clock(self) -> float:
        return 100.0

    def tracked(self, deployment_id: str) -> FakeTrack:
        return FakeTrack()


class FakeSampler:
    def latest(self, deployment_id: str) -> Sample | None:
        return Sample(0.0, 1, 4)


class FakeSync:
    ready = True


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def scrape(metrics: Metrics, deployer: FakeDeployer, litellm: object | None = FakeSync()) -> dict:
    """Families by name, each a dict of (sample name, labels) -> value."""
    register(
        metrics.registry,
        metrics,
        Sources(
            deployer,
            FakeController(),
            FakeSampler(),
            litellm,  # type: ignore[arg-type]
            "1.2.3",
            "host-a",
        ),
    )
    text = generate_latest(metrics.registry).decode()
    return {
        f.name: {(s.name, frozenset(s.labels.items())): s.value for s in f.samples} | {"type": f.type}
        for f in text_string_to_metric_families(text)
    }


def one(family: dict, name: str, **labels: str) -> float:
    found = [v for k, v in family.items() if k != "type" and k[0] == name and set(labels.items()) <= k[1]]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def watched(*deps: Deployment, clock: Clock | None = None) -> tuple[Metrics, FakeDeployer]:
    metrics = Metrics(clock=clock or Clock())
    deployer = FakeDeployer(list(deps))
    metrics.watch(deployer)
    return metrics, deployer


def test_buckets_count_values_up_to_and_including_each_bound() -> None:
    b = Buckets((0.1, 1.0, 10.0))
    for value in (0.05, 0.1, 0.5, 1.0, 11.0):
        b.observe(value)
    assert b.counts == [2, 2, 0, 1] and b.count == 5 and abs(b.sum - 12.65) < 1e-9


def test_every_metric_of_the_catalog_is_rendered_with_its_type_and_labels() -> None:
    metrics, deployer = watched(dep(state=State.READY))
    ex = Exchange(1.0, "r", "127.0.0.2")
    ex.deployment_id, ex.route, ex.status = "d1", "chat/completions", 200
    metrics.exchange_done(ex, 2.0)
    families = scrape(metrics, deployer)
    for fam in catalog.ALL:
        name = fam.name.removesuffix("_total")
        assert name in families, fam.name
        assert families[name]["type"] == fam.kind, fam.name
        for key in families[name]:
            if key != "type":
                assert set(dict(key[1])) - {"le"} == set(fam.labels), (fam.name, key)
    assert len(catalog.ALL) == len({f.name for f in catalog.ALL})


def test_a_kept_family_is_declared_once_in_the_catalog_and_rendered_from_there(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Adding a counter or a histogram is its catalog entry and the record call: the numbers and
    the scrape take everything else (its labels, its zero series) from the declaration."""
    new_counter = catalog.Family(
        "dgxmm_test_things_total", "counter", "Things.", (*catalog.DEP, "kind"), kept=True, zeros=(("a",), ("b",))
    )
    new_histogram = catalog.Family(
        "dgxmm_test_speed", "histogram", "Speed.", (*catalog.DEP, "engine"), (1.0, 10.0), kept=True
    )
    monkeypatch.setattr(catalog, "KEPT", (*catalog.KEPT, new_counter, new_histogram))
    metrics, deployer = watched(dep())
    stats = metrics.of("d1")
    assert stats is not None
    stats.add(new_counter, ("b",), 3)
    stats.observe(new_histogram, 5.0)
    families = scrape(metrics, deployer)
    things = families["dgxmm_test_things"]
    assert one(things, "dgxmm_test_things_total", deployment="d1", served_name="d1", kind="a") == 0
    assert one(things, "dgxmm_test_things_total", kind="b") == 3 and things["type"] == "counter"
    speed = families["dgxmm_test_speed"]
    assert one(speed, "dgxmm_test_speed_bucket", engine="llamacpp", le="10.0") == 1
    assert one(speed, "dgxmm_test_speed_bucket", le="1.0") == 0 and one(speed, "dgxmm_test_speed_sum") == 5


def test_kept_families_give_the_deployment_labels_first_and_zeros_of_the_record_labels() -> None:
    for family in catalog.KEPT:
        own = [label for label in family.labels if label in catalog.BASE_LABELS]
        assert list(family.labels[: len(own)]) == own, family.name
        assert all(len(key) == len(family.record_labels) for key in family.zeros), family.name


def test_histograms_are_cumulative_with_sum_and_count() -> None:
    clock = Clock()
    metrics, deployer = watched(dep(), clock=clock)
    for arrival, first in ((0.0, 0.003), (10.0, 10.3), (20.0, 1020.0)):
        ex = Exchange(arrival, "r", "p")
        ex.deployment_id, ex.status, ex.first_byte, ex.engine_byte, ex.bytes = "d1", 200, first, first, 10
        metrics.exchange_done(ex, first + 1)
    ttfb = scrape(metrics, deployer)["dgxmm_gateway_time_to_first_byte_seconds"]
    bucket = "dgxmm_gateway_time_to_first_byte_seconds_bucket"
    assert one(ttfb, bucket, le="0.01") == 1 and one(ttfb, bucket, le="0.25") == 1
    assert one(ttfb, bucket, le="0.5") == 2 and one(ttfb, bucket, le="300.0") == 2
    assert one(ttfb, bucket, le="+Inf") == 3 and one(ttfb, "dgxmm_gateway_time_to_first_byte_seconds_count") == 3
    assert abs(one(ttfb, "dgxmm_gateway_time_to_first_byte_seconds_sum") - 1000.303) < 1e-6


def test_a_request_counts_by_route_status_class_and_reason() -> None:
    metrics, deployer = watched(dep())
    for status, code, route in (
        (200, None, "chat/completions"),
        (503, "ondemand_queue_timeout", "chat/completions"),
        (499, None, "embeddings"),
        (404, "not_found", "other"),
        (401, "invalid_api_key", "other"),
        (404, "guard", "other"),
        (400, "something_new", "other"),
    ):
        ex = Exchange(0.0, "r", "p")
        ex.route, ex.status, ex.code = route, status, code
        ex.deployment_id = "d1" if code in (None, "ondemand_queue_timeout") else None
        metrics.exchange_done(ex, 1.0)
    families = scrape(metrics, deployer)
    requests, refusals = families["dgxmm_gateway_requests"], families["dgxmm_gateway_refusals"]
    name = "dgxmm_gateway_requests_total"
    assert one(requests, name, deployment="d1", route="chat/completions", status_class="2xx") == 1
    assert one(requests, name, deployment="d1", route="chat/completions", status_class="5xx") == 1
    assert one(requests, name, deployment="d1", route="embeddings", status_class="4xx") == 1
    assert one(requests, name, deployment="", served_name="", route="other", status_class="4xx") == 4
    reasons = {dict(k[1])["reason"]: v for k, v in refusals.items() if k != "type" and dict(k[1])["deployment"] == ""}
    assert reasons["not_found"] == reasons["key"] == reasons["guard"] == reasons["other"] == 1
    assert one(refusals, "dgxmm_gateway_refusals_total", deployment="d1", reason="queue_timeout") == 1
    assert one(refusals, "dgxmm_gateway_refusals_total", deployment="d1", reason="start_failed") == 0
    # only requests answered by the engine have a first byte; every one has a duration
    assert (
        one(
            families["dgxmm_gateway_time_to_first_byte_seconds"],
            "dgxmm_gateway_time_to_first_byte_seconds_count",
            deployment="d1",
        )
        == 0
    )
    assert (
        one(
            families["dgxmm_gateway_request_duration_seconds"],
            "dgxmm_gateway_request_duration_seconds_count",
            deployment="d1",
        )
        == 3
    )


def test_cold_start_is_arrival_to_the_first_engine_byte_of_a_request_that_waited() -> None:
    metrics, deployer = watched(dep())
    for cold in (True, False):
        ex = Exchange(0.0, "r", "p")
        ex.deployment_id, ex.status, ex.cold = "d1", 200, cold
        ex.first_byte, ex.engine_byte = 2.0, 37.0  # the queued notice at 2 s, the engine's first byte at 37 s
        metrics.exchange_done(ex, 40.0)
    families = scrape(metrics, deployer)
    cold = families["dgxmm_ondemand_cold_start_seconds"]
    assert one(cold, "dgxmm_ondemand_cold_start_seconds_count", engine="llamacpp") == 1
    assert one(cold, "dgxmm_ondemand_cold_start_seconds_sum") == 37.0
    assert (
        one(families["dgxmm_gateway_time_to_first_byte_seconds"], "dgxmm_gateway_time_to_first_byte_seconds_sum") == 4.0
    )  # the notice counts as first byte


def test_a_request_that_waited_for_a_start_has_that_engines_load() -> None:
    """The activity row's load_s and cached_fraction: the deployment's latest load, when it
    became ready between the request's arrival and its slot."""
    clock = Clock()
    metrics, _ = watched(dep("d1"), dep("d2"), clock=clock)
    clock.now = 50.0
    metrics.launched("d1", 7.5, 0.4)

    def request(arrival: float, slot_at: float, cold: bool = True, dep_id: str = "d1") -> Exchange:
        ex = Exchange(arrival, "r", "p")
        ex.deployment_id, ex.cold, ex.slot_at = dep_id, cold, slot_at
        return ex

    load = metrics.load_waited_for(request(40.0, 50.0))
    assert load is not None and (load.seconds, load.cached_fraction) == (7.5, 0.4)  # it waited for that start
    assert metrics.load_waited_for(request(45.0, 52.0)) == load  # it joined the start under way
    assert metrics.load_waited_for(request(51.0, 52.0)) is None  # it came after the engine was ready
    assert metrics.load_waited_for(request(40.0, 0.0, cold=False)) is None  # a slot at once
    assert metrics.load_waited_for(request(40.0, 50.0, dep_id="d2")) is None  # no load of its own
    metrics.launched("gone", 1.0, 1.0)  # (a deployment it does not know: nothing kept)
    assert metrics.load_waited_for(request(40.0, 50.0, dep_id="gone")) is None
    metrics.on_change(Change("removed", dep("d1")))
    assert metrics.load_waited_for(request(40.0, 50.0)) is None


def test_series_come_and_go_with_their_deployment() -> None:
    metrics, deployer = watched(dep("a"))
    metrics.stopped("a", "idle")
    deployer.deps.append(dep("b"))
    metrics.on_change(Change("created", dep("b")))
    families = scrape(metrics, deployer)
    stops = families["dgxmm_ondemand_stops"]
    assert one(stops, "dgxmm_ondemand_stops_total", deployment="a", reason="idle") == 1
    assert one(stops, "dgxmm_ondemand_stops_total", deployment="b", reason="make_room") == 0  # zero from the start
    metrics.on_change(Change("removed", dep("a")))
    metrics.stopped("a", "idle")  # a late record of a removed deployment is dropped
    renamed = dep("b", served="b2")
    metrics.on_change(Change("config", renamed, old=dep("b")))
    assert [(s.base["deployment"], s.base["served_name"]) for s in metrics.stats()] == [("b", "b2")]


def test_start_durations_by_kind_and_outcome_and_watchdog_failures() -> None:
    clock = Clock()
    metrics, deployer = watched(dep(), clock=clock)

    def move(old: State, new: State, seconds: float = 0.0) -> None:
        clock.now += seconds
        metrics.on_change(Change("state", dep(state=new), old_state=old))

    move(State.STOPPED, State.STARTING)
    move(State.STARTING, State.READY, 30)
    move(State.READY, State.ASLEEP)
    move(State.ASLEEP, State.STARTING)
    move(State.STARTING, State.READY, 2)
    move(State.READY, State.FAILED)  # the watchdog
    move(State.FAILED, State.STARTING)
    move(State.STARTING, State.FAILED, 5)
    move(State.FAILED, State.STARTING)
    move(State.STARTING, State.STOPPING, 1)  # stopped while starting: not a start outcome
    metrics.launched("d1", 25.0, None)
    families = scrape(metrics, deployer)
    starts = families["dgxmm_deployment_start_seconds"]
    count = "dgxmm_deployment_start_seconds_sum"
    assert one(starts, count, kind="start", outcome="ready") == 30
    assert one(starts, count, kind="wake", outcome="ready") == 2
    assert one(starts, count, kind="start", outcome="failed") == 5
    assert one(families["dgxmm_watchdog_failures"], "dgxmm_watchdog_failures_total") == 1
    assert one(families["dgxmm_engine_launch_seconds"], "dgxmm_engine_launch_seconds_sum", engine="llamacpp") == 25


def test_state_memory_engine_and_ondemand_gauges_are_read_at_scrape_time() -> None:
    metrics, deployer = watched(dep("a", state=State.READY), dep("b"))
    families = scrape(metrics, deployer)
    state = families["dgxmm_deployment_state"]
    assert one(state, "dgxmm_deployment_state", deployment="a", state="ready") == 1
    assert sum(v for k, v in state.items() if k != "type" and dict(k[1])["deployment"] == "a") == 1
    assert (
        one(families["dgxmm_deployment_memory_held_bytes"], "dgxmm_deployment_memory_held_bytes", deployment="a")
        == 2 * GIB
    )
    assert (
        one(families["dgxmm_deployment_memory_held_bytes"], "dgxmm_deployment_memory_held_bytes", deployment="b") == 0
    )
    assert one(families["dgxmm_memory_capacity_bytes"], "dgxmm_memory_capacity_bytes") == 9 * GIB
    assert one(families["dgxmm_memory_free_bytes"], "dgxmm_memory_free_bytes") == 8 * GIB
    # engine samples only for engines that run; controller gauges for every deployment
    assert {dict(k[1])["deployment"] for k in families["dgxmm_engine_requests_waiting"] if k != "type"} == {"a"}
    assert (
        one(
            families["dgxmm_ondemand_backoff_remaining_seconds"],
            "dgxmm_ondemand_backoff_remaining_seconds",
            deployment="b",
        )
        == 42.5
    )
    assert one(families["dgxmm_deployment_info"], "dgxmm_deployment_info", deployment="a", mode="on_demand") == 1


def test_litellm_series_only_when_the_sync_is_enabled() -> None:
    metrics, deployer = watched()
    assert not any(name.startswith("dgxmm_litellm") for name in scrape(metrics, deployer, litellm=None))
    metrics, deployer = watched()
    metrics.litellm_synced(ok=False)
    metrics.litellm_synced(ok=True)
    metrics.litellm_written("add")
    families = scrape(metrics, deployer)
    assert one(families["dgxmm_litellm_syncs"], "dgxmm_litellm_syncs_total") == 2
    assert one(families["dgxmm_litellm_sync_failures"], "dgxmm_litellm_sync_failures_total") == 1
    assert one(families["dgxmm_litellm_entries_written"], "dgxmm_litellm_entries_written_total", operation="add") == 1
    assert (
        one(families["dgxmm_litellm_last_success_timestamp_seconds"], "dgxmm_litellm_last_success_timestamp_seconds")
        > 1.7e9
    )
