"""A caller's keep_alive and ttl in an OpenAI body (gateway/keepalive.py): Ollama's forms read
by one parser, held to the idle timeout's bounds (the header's words), and the members taken out
of the body byte for byte as the alias rename leaves the rest."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from dgxmm.gateway import jsonbody, keepalive
from dgxmm.gateway.keepalive import BadKeepAlive, held, seconds, taken
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.toplevel import MAX_REPEATS


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, None),
        (0, 0.0),
        ("0", 0.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        (30, 30.0),
        ("-1", math.inf),
        (-1, math.inf),
    ],
)
def test_ollamas_forms(given: Any, expected: float | None) -> None:
    assert seconds(given) == expected


@pytest.mark.parametrize("given", ["soon", "5 m", "1h 30m", True, [], {}, "m5"])
def test_what_is_no_duration(given: Any) -> None:
    with pytest.raises(BadKeepAlive):
        seconds(given)


def test_held_to_the_bounds_and_said_so() -> None:
    assert held(3600, 60, 86400) == (3600, b"3600")
    assert held(10**9, 60, 86400) == (86400, b"86400; held to the maximum")
    assert held(0, 60, 86400) == (60, b"60; held to the minimum")
    assert held(math.inf, 60, 86400) == (math.inf, b"never")
    assert held(1_000_000, 0.5, 10**7) == (1_000_000, b"1000000") and held(0.25, 0.5, 60) == (
        0.5,
        b"0.5; held to the minimum",
    )
    assert held(90.5, 60, 86400) == (90.5, b"90.5")


@pytest.mark.parametrize(
    ("body", "left", "asked"),
    [
        (b'{"model":"m","keep_alive":"1h"}', b'{"model":"m"}', 3600.0),
        (b'{"keep_alive":"1h","model":"m"}', b'{"model":"m"}', 3600.0),
        (b'{"keep_alive": 5}', b"{}", 5.0),
        (b'{"a":1, "ttl": 30, "b":"\\u00e9", "keep_alive": "1m" }', b'{"a":1, "b":"\\u00e9"}', 60.0),
        (b'{"ttl":1,"keep_alive":-1,"x":[1e400]}', b'{"x":[1e400]}', math.inf),
        (b'{"keep_alive":1,"m":0,"keep_alive":"2h"}', b'{"m":0}', 7200.0),  # the last one counts
        (b'{"keep_alive":null,"m":0}', b'{"m":0}', None),
    ],
)
def test_taken_out_the_rest_as_it_came(body: bytes, left: bytes, asked: float | None) -> None:
    assert jsonbody.read(body).keeps and jsonbody.scanned(body).keeps
    out, got = taken(body)
    assert (out, got) == (left, asked)
    json.loads(out)


def test_ttl_is_seconds_only_and_a_bad_value_is_refused() -> None:
    for body in (b'{"ttl":"1h"}', b'{"keep_alive":"soon"}', b'{"keep_alive":true}'):
        with pytest.raises(Refused) as caught:
            taken(body)
        assert caught.value.status == 400 and caught.value.code == "invalid_request"


def test_a_name_repeated_past_the_bound_is_refused() -> None:
    body = b"{" + b",".join([b'"ttl":1'] * (MAX_REPEATS + 1)) + b"}"
    with pytest.raises(Refused, match="repeats"):
        taken(body)


def test_the_names_are_the_facts_own() -> None:
    assert keepalive.NAMES == {"keep_alive", "ttl"} and not jsonbody.read(b'{"model":"m"}').keeps
