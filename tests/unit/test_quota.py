"""A caller key's tokens of the day (issue 47): what a request reserves from its body, the body
asking the engine for its stream's usage, what an answer is charged, and admission's rule, under
which requests in any number pass the quota by at most one request's reservation."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgxmm.gateway.refused import Refused
from dgxmm.gateway import quota
from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.quota import Reservation
from dgxmm.gateway.usagescan import UsageReader
from unit.test_callerkeys import make

DEFAULT = 4096


def asked(body: Any, endpoint: str = "chat/completions") -> quota.Asked:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return quota.asked(raw, endpoint, DEFAULT)


@pytest.mark.parametrize(
    ("body", "completion"),
    [
        ({"model": "m", "max_tokens": 7}, 7),
        ({"model": "m", "max_completion_tokens": 9}, 9),
        ({"model": "m", "max_tokens": 50, "max_completion_tokens": 9}, 9),  # the smallest the engine holds to
        ({"model": "m", "max_output_tokens": 3}, 3),
        ({"model": "m"}, DEFAULT),
        ({"model": "m", "max_tokens": None}, DEFAULT),
        ({"model": "m", "max_tokens": -1}, DEFAULT),
        ({"model": "m", "max_tokens": 1.5}, DEFAULT),
        ({"model": "m", "max_tokens": "12"}, DEFAULT),
        ({"model": "m", "max_tokens": 10**20}, DEFAULT),  # no limit an engine holds to
    ],
)
@pytest.mark.parametrize("pad", [0, 70_000])  # read by orjson, or by the scan (past jsonbody.FAST_BYTES)
def test_a_reservation_is_the_prompts_bytes_and_the_answers_limit(
    body: dict[str, Any], completion: int, pad: int
) -> None:
    raw = json.dumps({**body, "pad": "p" * pad}).encode()
    assert asked(raw).reservation == Reservation(len(raw), completion)


def test_embeddings_reserve_their_prompt_and_a_form_the_default() -> None:
    raw = json.dumps({"model": "m", "input": "hello there"}).encode()
    assert asked(raw, "embeddings").reservation == Reservation(len(raw), 0)
    form = asked(b"--b\r\nContent-Disposition: form-data; name=model\r\n\r\nm\r\n--b--\r\n", "audio/transcriptions")
    assert form == quota.Asked(Reservation(0, DEFAULT))


def rewritten(body: dict[str, Any] | bytes, endpoint: str = "chat/completions") -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    changed = quota.with_usage(raw, endpoint, asked(raw, endpoint))
    return None if changed is None else json.loads(changed)


STREAM = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.mark.parametrize(
    ("options", "engine_gets"),
    [
        (None, {"include_usage": True}),  # absent: added
        ({"stream_options": None}, {"include_usage": True}),
        ({"stream_options": "x"}, {"include_usage": True}),  # no object: replaced
        ({"stream_options": {}}, {"include_usage": True}),
        ({"stream_options": {"include_usage": False}}, {"include_usage": True}),  # the last of the two
        (
            {"stream_options": {"continuous_usage_stats": False}},
            {"continuous_usage_stats": False, "include_usage": True},
        ),
    ],
)
def test_a_stream_asks_the_engine_for_its_usage(options: dict[str, Any] | None, engine_gets: dict[str, Any]) -> None:
    changed = rewritten({**STREAM, **(options or {})})
    assert changed == {**STREAM, "stream_options": engine_gets}


def test_nothing_changes_where_there_is_no_need() -> None:
    assert rewritten({**STREAM, "stream_options": {"include_usage": True}}) is None  # the client asked
    assert rewritten({**STREAM, "stream": False}) is None
    assert rewritten({k: v for k, v in STREAM.items() if k != "stream"}) is None
    assert rewritten(STREAM, "responses") is None  # its stream has the usage anyway
    assert rewritten(STREAM, "embeddings") is None
    assert rewritten(b"[1, 2]") is None


def test_every_other_byte_reaches_the_engine_as_it_came() -> None:
    raw = b'\xef\xbb\xbf \n{"model": "m", "x": 1.0e5, "s": "\\ud800", "stream": true}'
    changed = quota.with_usage(raw, "completions", asked(raw, "completions"))
    assert (
        changed
        == b'\xef\xbb\xbf \n{"stream_options":{"include_usage":true},"model": "m", "x": 1.0e5, "s": "\\ud800", "stream": true}'
    )


def ended(status: int, usage: UsageReader | None, engine_byte: float = 1.0, code: str | None = None) -> Exchange:
    ex = Exchange(0.0, "r", "127.0.0.2")
    ex.status, ex.usage, ex.engine_byte, ex.code = status, usage, engine_byte, code
    return ex


def test_an_answer_is_charged_the_engines_count_else_its_reservation() -> None:
    held = Reservation(80, 4096)
    counted = UsageReader(stream=True)
    counted.whole(b'data: {"choices":[],"usage":{"prompt_tokens":6,"completion_tokens":5}}\n\n')
    assert quota.charged(ended(200, counted), held) == (6, 5)
    assert quota.charged(ended(200, UsageReader(stream=True)), held) == (80, 4096)  # hung up before the usage
    assert quota.charged(ended(200, UsageReader(stream=True), engine_byte=0.0), held) == (0, 0)  # never answered
    assert quota.charged(ended(400, UsageReader(stream=False)), held) == (0, 0)  # the engine refused it
    assert quota.charged(ended(502, None, code="ondemand_upstream_error"), held) == (0, 0)


def test_admission_holds_reservations_and_settlement_frees_them() -> None:
    keys = make()
    key, _ = keys.create("alice", None, None, None, 100)
    keys.admit(key, 60)
    keys.admit(key, 60)  # 0 used + 60 held < 100: admitted
    with pytest.raises(Refused) as refused:
        keys.admit(key, 60)  # 120 held: the rest of the day is held
    assert (refused.value.code, refused.value.retry_after) == ("quota_exceeded", 1)
    assert (key.counters.in_flight, key.counters.reserved) == (2, 120)
    keys.release(key, 60)
    keys.done(key, 3, 4)
    assert (key.counters.in_flight, key.counters.reserved) == (1, 60)
    keys.admit(key, 60)  # 7 used + 60 held < 100
    keys.release(key, 60)
    keys.release(key, 60)
    assert (key.counters.in_flight, key.counters.reserved) == (0, 0)


@given(
    quota_tokens=st.integers(1, 500),
    requests=st.lists(st.tuples(st.integers(1, 300), st.floats(0, 1)), min_size=1, max_size=50),
    seed=st.integers(0, 2**16),
)
def test_requests_in_any_order_pass_the_quota_by_at_most_one_reservation(
    quota_tokens: int, requests: list[tuple[int, float]], seed: int
) -> None:
    """Requests arrive and end in a random order, each costing at most what it reserved: the
    day's count never passes the quota by more than the largest reservation."""
    keys = make()
    key, _ = keys.create("alice", None, None, None, quota_tokens)
    shuffle = random.Random(seed)
    pending, running = list(requests), []
    while pending or running:
        if pending and (not running or shuffle.random() < 0.5):
            reserve, share = pending.pop()
            try:
                keys.admit(key, reserve)
            except Refused:
                continue
            running.append((reserve, share))
        else:
            reserve, share = running.pop(shuffle.randrange(len(running)))
            keys.release(key, reserve)
            keys.done(key, 0, int(reserve * share))
    assert key.counters.reserved == 0 and key.counters.in_flight == 0
    assert key.counters.usage.today.tokens < quota_tokens + max(reserve for reserve, _ in requests)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@given(
    members=st.dictionaries(st.sampled_from(["model", "messages", "n", "include_usage", "x"]), JSON, max_size=4),
    options=st.none() | JSON,
    spaced=st.booleans(),
    padded=st.booleans(),
)
def test_any_stream_body_asks_for_usage_and_keeps_the_rest(
    members: dict[str, Any], options: Any, spaced: bool, padded: bool
) -> None:
    """Whatever else a streamed body holds, read by orjson or (past 64 KiB) by the scan, the
    engine gets it as it was, with its ``stream_options`` an object whose ``include_usage`` is
    true (the client's own members kept)."""
    members = {**members, "pad": "p" * 70_000} if padded else members
    body = {**members, "stream": True} if options is None else {**members, "stream": True, "stream_options": options}
    raw = json.dumps(body, indent=1 if spaced else None).encode()
    changed = quota.with_usage(raw, "chat/completions", asked(raw))
    if isinstance(options, dict) and options.get("include_usage") is True:
        assert changed is None
        return
    assert changed is not None
    got = json.loads(changed)
    kept = options if isinstance(options, dict) else {}
    assert got == {**body, "stream_options": {**kept, "include_usage": True}}
