"""The top-level scan of a JSON body (issue 34): the members asked for and their values' spans,
found without building the document, as json.loads would read them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgxmm.gateway import toplevel
from dgxmm.gateway.toplevel import MAX_DEPTH, Shape, scan

NAMES = frozenset({"model", "stream", "text"})
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)
keys = st.sampled_from(["model", "stream", "text", "guided_x", "guided_y", "mode", "streams", "m", ""]) | st.text(
    max_size=6
)


def values_of(body: bytes, names: frozenset[str] = NAMES) -> dict[str, Any]:
    found = scan(body, names)
    assert found.shape is Shape.OBJECT, found
    return {name: json.loads(body[lo:hi]) for name, (lo, hi) in found.spans.items()}


@settings(max_examples=300, deadline=None)
@given(
    members=st.lists(st.tuples(keys, values), max_size=8),
    indent=st.sampled_from([None, 0, 2, "\t"]),
    ascii_only=st.booleans(),
)
def test_the_members_asked_for_are_those_json_loads_reads(
    members: list[tuple[str, Any]], indent: Any, ascii_only: bool
) -> None:
    # Written by hand, so that keys repeat: the last of a name counts, as json.loads keeps it.
    sep = "\n" if indent is not None else ""
    text = (
        "{"
        + sep
        + ("," + sep).join(
            f"{json.dumps(k, ensure_ascii=ascii_only)} : {json.dumps(v, indent=indent, ensure_ascii=ascii_only)}"
            for k, v in members
        )
        + sep
        + "}"
    )
    body = text.encode("utf-8", "surrogatepass")
    expected = json.loads(text)
    names = frozenset({"model", "stream", "text", "guided_x"})
    assert values_of(body, names) == {k: v for k, v in expected.items() if k in names}
    found = scan(body, names, guided=True)
    assert found.guided == any(k.startswith("guided_") and v is not None for k, v in expected.items())


@settings(max_examples=200, deadline=None)
@given(values)
def test_any_json_document_is_json_to_the_scan(value: Any) -> None:
    body = json.dumps(value).encode()
    assert scan(body, NAMES).shape is (Shape.OBJECT if isinstance(value, dict) else Shape.OTHER)


@pytest.mark.parametrize(
    ("body", "model"),
    [
        (b'{"model": "a", "model": "b"}', "b"),  # a repeated key: the last, as the engines read it
        (b'{"x": {"model": "no"}, "model": "yes"}', "yes"),  # a nested model is not the body's
        (b'{"x": [{"model": "no"}], "y": "{\\"model\\": \\"no\\"}", "model": "yes"}', "yes"),
        (b'{"\\u006dodel": "escaped key"}', "escaped key"),
        (b'{"a": "\\\\", "model": "after an escaped backslash"}', "after an escaped backslash"),
        (b'{"a": "\\\\\\"}", "model": "after an escaped quote"}', "after an escaped quote"),
        (b'{"model": "q\\"uote\\\\"}', 'q"uote\\'),
        (b'\xef\xbb\xbf {"model":"bom"}', "bom"),
        (b' \t\r\n{ \t\r\n"model" \t\r\n: \t\r\n"ws" \t\r\n} \t\r\n', "ws"),
        (b'{"model": "\\ud83d"}', "\ud83d"),  # a lone surrogate: json.loads reads it, so does the scan
        (b'{"a": "\xff\xfe", "model": "m"}', "m"),  # invalid UTF-8 elsewhere: the engine's to refuse
    ],
)
def test_the_model_is_the_last_top_level_one(body: bytes, model: str) -> None:
    assert values_of(body)["model"] == model


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"   ",
        b"{",
        b'{"model": "m"',
        b'{"model": "m",}',
        b'{"model" "m"}',
        b'{"model": }',
        b'{,"model": 1}',
        b'{"model": "m"} x',
        b'{"model": "m"}{}',
        b'{"a": [1, 2}',
        b'{"a": "unterminated}',
        b'{"model": "m"]',
        b'{"a": 1 2}',
        b'{"a" 1: 2}',
        b'{"a": 1, , "b": 2}',
        b"[1, 2",
        b'"open',
        b"nope",
        b"-" * 100,
        b"{1: 2}",
    ],
)
def test_a_top_level_that_is_not_json_is_not(body: bytes) -> None:
    assert scan(body, NAMES).shape is Shape.NOT_JSON


@pytest.mark.parametrize("body", [b"[]", b"[1, {}]", b'"x"', b"12", b"true", b"null", b" NaN ", b"-1e999"])
def test_json_that_is_not_an_object_is_other(body: bytes) -> None:
    assert scan(body, NAMES).shape is Shape.OTHER


def test_nesting_past_the_bound_is_too_deep_whatever_follows() -> None:
    assert scan(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH, NAMES).shape is Shape.OTHER
    assert scan(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), NAMES).shape is Shape.TOO_DEEP
    assert scan(b'{"a":' + b"[" * 100_000, NAMES).shape is Shape.TOO_DEEP
    assert scan(b'{"a": "' + b"[" * 100_000 + b'"}', NAMES).shape is Shape.OBJECT  # brackets in a string


@pytest.mark.parametrize("piece", [7, 64, 1024])
def test_tokens_split_across_pieces_read_the_same(monkeypatch: pytest.MonkeyPatch, piece: int) -> None:
    body = (
        b'{"a": "x\\\\\\\\\\"y", "n": [1, {"model": 2}, "]"], "t": {"type": "json"}, '
        b'"model"  :  "the\\\\ name",  "stream": true, "s": "\\\\"}'
    )
    whole = values_of(body)
    monkeypatch.setattr(toplevel, "PIECE", piece)
    assert values_of(body) == whole == {"model": "the\\ name", "stream": True}


def test_guided_keys_count_by_their_last_value() -> None:
    assert not scan(b'{"guided_json": {}, "guided_json": null}', NAMES, guided=True).guided
    assert scan(b'{"guided_json": null, "guided_json": 1}', NAMES, guided=True).guided
    assert scan(b'{"guided_\\u006ason": 1}', NAMES, guided=True).guided
    many = b"{" + b",".join(b'"guided_%d": null' % i for i in range(toplevel.MAX_GUIDED + 1)) + b"}"
    assert scan(many, NAMES, guided=True).guided  # too many to follow: counted as structured


def test_a_span_inside_the_body_is_scanned_alone() -> None:
    body = b'{"text": {"format": {"type": "json_schema"}, "x": 1}, "model": "m"}'
    text = scan(body, frozenset({"text"})).spans["text"]
    fmt = scan(body, frozenset({"format"}), lo=text[0], hi=text[1]).spans["format"]
    assert json.loads(body[fmt[0] : fmt[1]]) == {"type": "json_schema"}
