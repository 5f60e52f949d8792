"""The gateway reads a request body with orjson, and whatever orjson refuses with the standard
library: the outcome must be the standard library's (dgxmm.gateway.gateway._json), but for
integers past 64 bits, which orjson reads as floats and no decision of the gateway looks at."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dgxmm.gateway import notice
from dgxmm.gateway.gateway import _json, _streaming

INT64 = st.integers(min_value=-(2**63), max_value=2**64 - 1)
scalars = st.none() | st.booleans() | INT64 | st.floats(allow_nan=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)  # fmt: skip


def same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN and the types kept apart (1 is not 1.0, nor True)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@given(values)
def test_any_json_reads_as_the_standard_library_reads_it(value: Any) -> None:
    body = json.dumps(value).encode()
    assert same(_json(body), json.loads(body))


@pytest.mark.parametrize("body", [
    b'{"a": NaN, "b": Infinity, "c": -Infinity}',  # the standard library's extensions
    b'{"x": 1e400}',  # past a double: inf
    b'{"k": 1, "k": 2}',  # a repeated key: the last one
    '{"s": "\u00e9\u4e2d"}'.encode("utf-16"),  # UTF-16 with a byte-order mark
    b'{"s": "\\ud800"}',  # a lone surrogate
])  # fmt: skip
def test_what_orjson_refuses_is_read_by_the_standard_library(body: bytes) -> None:
    assert same(_json(body), json.loads(body))


@pytest.mark.parametrize("body", [b"{", b"not json", b'{"a": 1} trailing', b"\xff\xfe\x00", b'{"a": 01}'])
def test_a_body_that_is_not_json_is_none(body: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(body)
    assert _json(body) is None


@pytest.mark.parametrize("depth", [1100, 100_000])  # past orjson's 1024, and far past Python's limit
def test_nesting_too_deep_for_python_raises_recursion_error(depth: int) -> None:
    with pytest.raises(RecursionError):
        _json(b"[" * depth + b"]" * depth)


def test_an_integer_past_64_bits_is_a_float_and_changes_no_decision() -> None:
    body = b'{"stream": true, "seed": 123456789012345678901234567890, "tools": null}'
    payload = _json(body)
    assert payload["seed"] == pytest.approx(1.2345678901234568e29)
    assert _streaming(payload) and not notice.wants_structured_output(payload)
    assert list(payload) == list(json.loads(body))


def test_an_empty_body_is_none_and_only_a_true_stream_streams() -> None:
    assert _json(b"") is None
    assert _streaming(_json(b'{"stream": true}'))
    assert not _streaming(_json(b'{"stream": 1}')) and not _streaming(_json(b'[{"stream": true}]'))
