"""What the gateway reads of a JSON body (dgxmm.gateway.jsonbody, issue 34): orjson's fast path
and the top-level scan give the same facts wherever both apply, and no body is kept parsed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgxmm.gateway import jsonbody, notice
from dgxmm.gateway.jsonbody import Facts, read, scanned
from dgxmm.gateway.toplevel import MAX_DEPTH, Shape

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
scalars = st.none() | st.booleans() | INT64 | st.floats(allow_nan=False, allow_infinity=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
FIELDS = [
    "model",
    "stream",
    "text",
    "messages",
    "keep_alive",
    "ttl",
    "guided_json",
    "guided_regex",
    *notice.STRUCTURED_FIELDS,
]
field_values = (
    st.sampled_from([None, True, False, "m", "alias", "", 1, "text", {}, []])
    | st.fixed_dictionaries(
        {"format": st.sampled_from([None, {}, {"type": "text"}, {"type": "json_schema"}, {"type": None}, "x"])}
    )
    | values
)
bodies = st.lists(st.tuples(st.sampled_from(FIELDS) | st.text(max_size=6), field_values), max_size=8)


def outcome(body: bytes, facts: Facts) -> tuple[Any, ...]:
    """Everything the gateway decides by: the shape, model, stream, structured, keeps."""
    return facts.shape, facts.model, facts.stream, jsonbody.structured(body, facts), facts.keeps


def write(members: list[tuple[str, Any]], ascii_only: bool, indent: int | None) -> bytes:
    """A JSON object written by hand, so that keys may repeat (the last counts)."""
    sep = "\n" if indent is not None else ""
    return (
        "{"
        + sep
        + ("," + sep).join(
            f"{json.dumps(k, ensure_ascii=ascii_only)}: {json.dumps(v, ensure_ascii=ascii_only, indent=indent)}"
            for k, v in members
        )
        + "}"
    ).encode("utf-8", "surrogatepass")


@settings(max_examples=400, deadline=None)
@given(members=bodies, ascii_only=st.booleans(), indent=st.sampled_from([None, 2]))
def test_the_fast_path_and_the_scan_decide_alike(
    members: list[tuple[str, Any]], ascii_only: bool, indent: int | None
) -> None:
    body = write(members, ascii_only, indent)
    fast, scan = read(body), scanned(body)
    assert outcome(body, fast) == outcome(body, scan)
    data = json.loads(body)  # and both are what the standard library reads
    model = data.get("model")
    assert outcome(body, scan) == (
        Shape.OBJECT,
        model if isinstance(model, str) else None,
        data.get("stream") is True,
        notice.wants_structured_output(data),
        "keep_alive" in data or "ttl" in data,
    )


@settings(max_examples=200, deadline=None)
@given(values)
def test_any_json_document_reads_alike_both_ways(value: Any) -> None:
    body = json.dumps(value).encode()
    assert outcome(body, read(body)) == outcome(body, scanned(body))


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "t": NaN}',
        b'{"model": "m", "s": "\\ud83d"}',
        b'{"model": "m", "s": "\xff"}',
        b'\xef\xbb\xbf{"model": "m"}',
        b'{"model": "m", "x": 1e999}',
    ],
)
def test_what_orjson_refuses_the_scan_reads(body: bytes) -> None:
    assert read(body).model == "m" and read(body).shape is Shape.OBJECT


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        (b"", Shape.NOT_JSON),
        (b"{", Shape.NOT_JSON),
        (b"not json", Shape.NOT_JSON),
        (b'{"a": 1} trailing', Shape.NOT_JSON),
        (b"[1]", Shape.OTHER),
        (b'"x"', Shape.OTHER),
        (b"null", Shape.OTHER),
        (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), Shape.TOO_DEEP),
        (b"[" * 100_000, Shape.TOO_DEEP),
        ('{"model": "m"}'.encode("utf-16"), Shape.NOT_JSON),  # JSON is UTF-8 (RFC 8259)
    ],
)
def test_shapes(body: bytes, shape: Shape) -> None:
    assert read(body).shape is shape


def test_a_deep_body_within_the_bound_is_read_by_the_scan_and_is_json() -> None:
    body = b'{"model": "m", "y": [], "x": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}"  # 512 deep
    assert not jsonbody.fast(body)  # too many brackets for orjson's reading to say how deep
    assert read(body).model == "m" and read(body).shape is Shape.OBJECT


def test_a_large_body_is_scanned_and_says_everything_at_once() -> None:
    body = b'{"model": "m", "stream": true, "x": "' + b"y" * jsonbody.FAST_BYTES + b'", "tools": []}'
    facts = read(body)
    assert (facts.model, facts.stream, facts.structured) == ("m", True, True)
    assert body[facts.span[0] : facts.span[1]] == b'"m"'  # type: ignore[index]


def test_only_a_true_stream_streams() -> None:
    assert read(b'{"stream": true}').stream and scanned(b'{"stream" : true }').stream
    for body in (b'{"stream": 1}', b'[{"stream": true}]', b'{"stream": "true"}', b'{"x": {"stream": true}}'):
        assert not read(body).stream and not scanned(body).stream
