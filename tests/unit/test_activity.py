"""What each request cost and how it ended (issue 30): tokens read from the engine's bytes as they
pass (JSON answers, streams split anywhere, llama-server's timings, Anthropic's names), the
activity record and its outcome, and the log's filters, file and rotation."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgxmm.gateway.keyrecord import KEY_FILE
from dgxmm.gateway.exchange import GONE, HEALTH_CHECK, Exchange, model_given
from dgxmm.gateway.usagescan import UsageReader
from dgxmm.telemetry.activity import Activity, outcome_of, record_of
from dgxmm.telemetry.metrics import Load

STREAM = (
    b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":48,"total_tokens":57}}\n\n'
    b"data: [DONE]\n\n"
)


def test_a_json_answers_usage_whole_or_in_pieces() -> None:
    body = json.dumps(
        {"choices": [{"message": {"content": "x" * 5000}}], "usage": {"prompt_tokens": 12, "completion_tokens": 7}}
    ).encode()
    whole = UsageReader(stream=False)
    whole.whole(body)
    pieces = UsageReader(stream=False)
    for i in range(0, len(body), 1000):
        pieces.feed(body[i : i + 1000])
    pieces.end()
    assert (whole.prompt_tokens, whole.completion_tokens) == (pieces.prompt_tokens, pieces.completion_tokens) == (12, 7)


@given(cuts=st.lists(st.integers(1, len(STREAM) - 1), max_size=6, unique=True))
def test_a_streams_usage_wherever_its_chunks_are_cut(cuts: list[int]) -> None:
    reader = UsageReader(stream=True)
    edges = [0, *sorted(cuts), len(STREAM)]
    for start, end in zip(edges, edges[1:], strict=False):
        reader.feed(STREAM[start:end])
    reader.end()
    assert (reader.prompt_tokens, reader.completion_tokens) == (9, 48)


def test_llama_servers_timings_and_anthropics_names() -> None:
    llama = UsageReader(stream=True)
    llama.feed(
        b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":8},'
        b'"timings":{"predicted_per_second":123.4}}\n\n'
    )
    assert (llama.completion_tokens, llama.engine_tps) == (8, 123.4)
    anthropic = UsageReader(stream=False)
    anthropic.whole(b'{"type":"message","usage":{"input_tokens":5,"output_tokens":2}}')
    assert (anthropic.prompt_tokens, anthropic.completion_tokens) == (5, 2)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b'{"usage": "x"}',
        b'{"usage": {"prompt_tokens": true}}',
        b'{"usage": {"completion_tokens": "5"}}',
        b"[1, 2]",
    ],
)
def test_answers_without_a_usable_usage_count_none(body: bytes) -> None:
    reader = UsageReader(stream=False)
    reader.whole(body)
    assert (reader.prompt_tokens, reader.completion_tokens, reader.engine_tps) == (None, None, None)


def exchange(**kw: object) -> Exchange:
    ex = Exchange(100.0, "r-1", "127.0.0.2")
    ex.deployment_id, ex.served_name, ex.route, ex.status = "d1", "chat", "chat/completions", 200
    for name, value in kw.items():
        setattr(ex, name, value)
    return ex


@pytest.mark.parametrize(
    ("kw", "outcome"),
    [
        ({}, "answered"),
        ({"status": 429}, "engine_error"),
        ({"status": GONE}, "hang_up"),
        ({"status": 503, "code": "ondemand_queue_timeout"}, "queue_timeout"),
        ({"status": 200, "code": "ondemand_queue_timeout"}, "queue_timeout"),  # inside a stream after the notice
        ({"status": 502, "code": "ondemand_upstream_error"}, "upstream_error"),
        ({"status": 401, "code": "invalid_api_key"}, "refused"),
        ({"status": 404, "code": "guard"}, "refused"),
        ({"route": HEALTH_CHECK}, "health_check"),
    ],
)
def test_the_outcome_names_how_it_ended(kw: dict[str, object], outcome: str) -> None:
    assert outcome_of(exchange(**kw)) == outcome


@pytest.mark.parametrize(
    ("kw", "failed"),
    [
        ({}, False),
        ({"status": 0}, False),  # the caller hung up before an answer (GONE once finished)
        ({"status": GONE}, False),
        ({"status": 429}, True),
        ({"status": 500}, True),
        ({"status": 200, "code": "ondemand_queue_timeout"}, True),  # inside a stream after the notice
        ({"status": 200, "code": "ondemand_upstream_error"}, True),  # the engine broke off mid-stream
        ({"status": 404, "code": "model_not_found"}, True),
    ],
)
def test_an_error_answer_is_a_usage_error_and_a_hang_up_none(kw: dict[str, object], failed: bool) -> None:
    assert exchange(**kw).failed is failed


def test_a_record_says_what_the_request_waited_for_and_what_it_cost() -> None:
    usage = UsageReader(stream=True)
    usage.feed(STREAM)
    ex = exchange(cold=True, slot_at=102.5, first_byte=102.6, engine_byte=102.6, usage=usage, caller=KEY_FILE)
    record = record_of(ex, now=103.6, wall=1_800_000_003.6, load=Load(102.4, 1.8789, 0.25))
    assert record == {
        "time": 1_800_000_000.0,
        "request_id": "r-1",
        "deployment_id": "d1",
        "served_name": "chat",
        "model": None,
        "route": "chat/completions",
        "api": "openai",
        "status": 200,
        "stream": True,
        "queued_s": 2.5,
        "cold_start": True,
        "load_s": 1.879,
        "cached_fraction": 0.25,
        "ttfb_s": 2.6,
        "ttft_s": 2.6,
        "duration_s": 3.6,
        "prompt_tokens": 9,
        "completion_tokens": 48,
        "tokens_per_s": 48.0,
        "client": "127.0.0.2",
        "key": "key-file",
        "priority": 0,
        "outcome": "answered",
    }
    bare = record_of(exchange(status=401, code="invalid_api_key"), now=100.01, wall=1.0)
    assert (
        bare["stream"],
        bare["queued_s"],
        bare["ttfb_s"],
        bare["ttft_s"],
        bare["prompt_tokens"],
        bare["tokens_per_s"],
        bare["load_s"],
        bare["cached_fraction"],
    ) == (False, 0.0, None, None, None, None, None, None)


def test_a_queued_stream_times_its_notice_and_the_engines_first_token_apart() -> None:
    """The queued notice is the caller's first byte; the engine's first token came seconds later."""
    ex = exchange(cold=True, slot_at=104.28, first_byte=100.007, engine_byte=104.35, usage=UsageReader(stream=True))
    record = record_of(ex, now=105.0, wall=1_800_000_005.0)
    assert (record["queued_s"], record["ttfb_s"], record["ttft_s"]) == (4.28, 0.007, 4.35)


def rec(i: int, dep: str = "d1", status: int = 200) -> dict[str, object]:
    return {"time": float(i), "deployment_id": dep, "served_name": f"n-{dep}", "status": status, "i": i}


def test_the_log_keeps_the_newest_and_filters_them_newest_first() -> None:
    seen: list[dict[str, object]] = []
    log = Activity(keep=5, publish=seen.append)
    for i in range(8):
        log.add(rec(i, "d1" if i % 2 else "d2", 200 if i != 7 else 500))
    assert [r["i"] for r in log.query()] == [7, 6, 5, 4, 3] and len(seen) == 8
    assert [r["i"] for r in log.query(deployment="d1")] == [7, 5, 3]
    assert [r["i"] for r in log.query(deployment="n-d2")] == [6, 4]  # by served name too
    assert [r["i"] for r in log.query(status=500)] == [7]
    assert [r["i"] for r in log.query(since=5)] == [7, 6, 5]
    assert [r["i"] for r in log.query(limit=2)] == [7, 6]


def test_the_file_takes_a_line_a_record_and_is_rotated(tmp_path: Path) -> None:
    path = tmp_path / "activity.jsonl"
    log = Activity(keep=10, path=path, max_bytes=2000, backups=2)
    for i in range(100):
        log.add(rec(i))
    log.close()
    lines = path.read_text().splitlines()
    assert json.loads(lines[-1])["i"] == 99 and all(json.loads(line) for line in lines)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["activity.jsonl", "activity.jsonl.1", "activity.jsonl.2"]
    assert log.dropped_lines == 0


def test_the_file_and_its_backups_are_private_and_old_ones_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "activity.jsonl"
    old = tmp_path / "activity.jsonl.2"
    old.write_text("{}\n")
    old.chmod(0o644)  # what an older dgxmm left
    before = os.umask(0o022)  # the usual umask, under which open() makes 0644
    try:
        log = Activity(keep=10, path=path, max_bytes=2000, backups=2)
        for i in range(100):
            log.add(rec(i))
        log.close()
    finally:
        os.umask(before)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == {"activity.jsonl": 0o600, "activity.jsonl.1": 0o600, "activity.jsonl.2": 0o600}


def test_a_line_the_disk_refuses_is_dropped_and_counted(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    log = Activity(keep=10, path=blocked / "activity.jsonl", max_bytes=2000, backups=1)
    log.add(rec(1))
    assert log.dropped_lines == 1 and [r["i"] for r in log.query()] == [1]


def test_the_rate_is_generation_tokens_over_generation_time_or_null() -> None:
    """Issue 41: 5 tokens of an answer sent whole are no rate (it was "10025.06/s"); a stream's is
    from its first token to its last, the queue and the cold start beside it, not inside."""
    whole = UsageReader(stream=False)
    whole.whole(b'{"usage":{"prompt_tokens":3,"completion_tokens":5}}')
    sent_whole = exchange(first_byte=100.0005, engine_byte=100.0005, usage=whole)
    assert sent_whole.tokens_per_s(100.001) is None and record_of(sent_whole, 100.001, 1.0)["tokens_per_s"] is None
    timed = UsageReader(stream=False)
    timed.whole(b'{"usage":{"completion_tokens":5},"timings":{"predicted_per_second":41.5}}')
    assert exchange(engine_byte=100.5, usage=timed).tokens_per_s(101.0) == 41.5  # the engine's own figure
    stream = UsageReader(stream=True)
    stream.feed(STREAM)  # 48 completion tokens
    cold = exchange(cold=True, slot_at=104.0, first_byte=100.01, engine_byte=104.5, usage=stream)
    record = record_of(cold, now=106.5, wall=10.0)
    assert (record["tokens_per_s"], record["queued_s"], record["ttft_s"]) == (24.0, 4.0, 4.5)
    assert exchange(usage=stream).tokens_per_s(101.0) is None  # no engine byte: nothing to time


def test_the_log_lists_by_arrival_though_it_keeps_them_as_they_ended() -> None:
    """Issue 41: a long request that came first ended last; the list is in start order."""
    log = Activity(keep=10)
    for i, (start, took) in enumerate([(10.0, 1.0), (0.0, 30.0), (20.0, 1.0), (25.0, 0.5), (5.0, 40.0)]):
        log.add({**rec(i), "time": start, "duration_s": took})  # added in the order they ended
    assert [r["time"] for r in log.query()] == [25.0, 20.0, 10.0, 5.0, 0.0]
    assert [r["time"] for r in log.query(limit=2)] == [25.0, 20.0]
    assert [r["time"] for r in log.query(limit=4)] == [25.0, 20.0, 10.0, 5.0]
    assert [r["time"] for r in log.query(since=6.0)] == [25.0, 20.0, 10.0]
    assert log.query(limit=0) == []


@given(
    spans=st.lists(st.tuples(st.floats(0, 100), st.floats(0, 50)), max_size=30),
    limit=st.integers(1, 12),
    since=st.one_of(st.none(), st.floats(0, 150)),
)
def test_the_search_by_arrival_stops_early_but_finds_what_a_full_sort_would(
    spans: list[tuple[float, float]], limit: int, since: float | None
) -> None:
    log = Activity(keep=100)
    records = [{**rec(i), "time": start, "duration_s": took} for i, (start, took) in enumerate(spans)]
    for record in sorted(records, key=lambda r: r["time"] + r["duration_s"]):
        log.add(record)
    wanted = sorted((r for r in records if since is None or r["time"] >= since), key=lambda r: r["time"], reverse=True)
    assert [r["time"] for r in log.query(since=since, limit=limit)] == [r["time"] for r in wanted[:limit]]


def test_the_model_a_caller_named_is_kept_short_and_printable() -> None:
    assert model_given("gpt-4o") == "gpt-4o"
    assert model_given("a\nb\x1b") == "a?b?" and len(model_given("x" * 5000)) == 200
    record = record_of(
        exchange(deployment_id=None, served_name=None, status=404, code="model_not_found", model=model_given("nosuch")),
        now=100.01,
        wall=1.0,
    )
    assert (record["model"], record["served_name"], record["outcome"]) == ("nosuch", None, "refused")
