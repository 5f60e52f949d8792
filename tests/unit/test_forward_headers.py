"""Header filtering of the forwarder: what goes up (dgxmm.gateway.heads.Heads.upstream, with
forward.upstream_headers) and what comes down (forward.response_headers).

Spec (Gateway, "Forwarding" and "LiteLLM health checks"): Authorization, Cookie, Host,
forwarding headers and hop-by-hop headers (including any named in Connection) are removed on the
way up, with the health-check marker, and Accept-Encoding: identity is sent; on the way down
hop-by-hop headers, Server and Date are removed. ``x-request-id`` is replaced by the request's
id both ways (issue 13): the helpers below check that every list ends with exactly that one.
(Headers are bytes both ways; the request side is read here as latin-1 text.)
"""

from __future__ import annotations

import pytest

from dgxmm.gateway import forward
from dgxmm.gateway.heads import Heads

RID = "rid-1"


def request_headers(scope: dict) -> list[tuple[str, str]]:
    lines = forward.upstream_headers(Heads(scope["headers"]), RID)
    assert lines.endswith(b"\r\n")
    out = [(k, v) for k, _, v in (line.decode("latin-1").partition(": ") for line in lines.split(b"\r\n")[:-1])]
    assert out[-1] == ("x-request-id", RID) and "x-request-id" not in names(out[:-1])
    return out[:-1]


def response_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    out = forward.response_headers(raw, (b"x-request-id", RID.encode()))
    assert out[-1] == (b"x-request-id", RID.encode()) and b"x-request-id" not in [k for k, _ in out[:-1]]
    return out[:-1]


def scope(*headers: tuple[str, str]) -> dict:
    """Names lowercased, as the front door (and ASGI) hands them over."""
    return {"type": "http", "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]}


def names(pairs: list[tuple[str, str]]) -> list[str]:
    return [k.lower() for k, _ in pairs]


# --- request_headers ----------------------------------------------------------------------------

KEPT_UP = [
    ("content-type", "application/json"),
    ("openai-beta", "assistants=v2"),
    ("user-agent", "litellm/1.0"),
    ("accept", "text/event-stream"),
]


@pytest.mark.parametrize(
    "header",
    [
        ("authorization", "Bearer sk-ondemand"),
        ("cookie", "session=abc"),
        ("host", "dgxmm:8090"),
        ("x-forwarded-for", "1.2.3.4"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "evil"),
        ("x-forwarded-port", "443"),
        ("forwarded", "for=1.2.3.4"),
        ("x-real-ip", "1.2.3.4"),
        ("connection", "keep-alive"),
        ("keep-alive", "timeout=5"),
        ("te", "trailers"),
        ("trailer", "x-foo"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "websocket"),
        ("proxy-authorization", "Basic eA=="),
        ("x-dgxmm-health-check", "1"),
        ("content-length", "42"),
        ("accept-encoding", "gzip, br"),
        ("x-request-id", "the-callers-id"),
        ("expect", "100-continue"),
    ],
    ids=lambda h: h[0],
)
def test_request_header_is_removed(header):
    out = request_headers(scope(*KEPT_UP, header))
    if header[0] == "accept-encoding":
        assert ("accept-encoding", "gzip, br") not in out
    else:
        assert header[0] not in names(out)


def test_request_header_removal_ignores_case():
    out = request_headers(
        scope(
            ("Authorization", "Bearer x"),
            ("X-Forwarded-For", "1.2.3.4"),
            ("COOKIE", "a=b"),
            ("X-DGXMM-Health-Check", "1"),
            ("Content-Type", "application/json"),
        )
    )
    assert names(out) == ["content-type", "accept-encoding"]


def test_request_headers_named_in_connection_are_removed():
    out = request_headers(scope(("connection", "close, X-Secret"), ("x-secret", "s3cr3t"), *KEPT_UP))
    assert "x-secret" not in names(out)
    assert "connection" not in names(out)


def test_request_headers_named_in_several_connection_headers_are_removed():
    out = request_headers(
        scope(("connection", "x-one"), ("Connection", " X-Two ,,"), ("x-one", "1"), ("x-two", "2"), ("x-three", "3"))
    )
    assert names(out) == ["x-three", "accept-encoding"]


def test_request_connection_naming_a_kept_header_removes_it():
    out = request_headers(scope(("connection", "openai-beta"), *KEPT_UP))
    assert "openai-beta" not in names(out)
    assert "content-type" in names(out)


def test_request_adds_exactly_one_accept_encoding_identity():
    out = request_headers(scope(("accept-encoding", "gzip"), ("Accept-Encoding", "br"), *KEPT_UP))
    assert [pair for pair in out if pair[0].lower() == "accept-encoding"] == [("accept-encoding", "identity")]


def test_request_adds_accept_encoding_identity_when_client_sent_none():
    out = request_headers(scope(*KEPT_UP))
    assert [pair for pair in out if pair[0].lower() == "accept-encoding"] == [("accept-encoding", "identity")]


def test_request_adds_accept_encoding_identity_to_empty_headers():
    assert request_headers(scope()) == [("accept-encoding", "identity")]


def test_request_keeps_other_headers_with_their_values_in_order():
    out = request_headers(scope(("authorization", "Bearer x"), *KEPT_UP, ("host", "h")))
    assert [pair for pair in out if pair[0] != "accept-encoding"] == KEPT_UP


def test_request_keeps_repeated_headers():
    out = request_headers(scope(("x-tag", "a"), ("x-tag", "b")))
    assert [v for k, v in out if k == "x-tag"] == ["a", "b"]


def test_request_keeps_latin1_values_byte_for_byte():
    out = request_headers(scope(("x-note", "caf\xe9")))
    assert ("x-note", "caf\xe9") in out


def test_request_does_not_remove_lookalike_headers():
    out = request_headers(scope(("x-forwarded", "kept"), ("authorization-hint", "kept"), ("x-cookie", "kept")))
    assert names(out) == ["x-forwarded", "authorization-hint", "x-cookie", "accept-encoding"]


def test_request_removes_all_in_one_go():
    headers = [
        ("Authorization", "Bearer k"),
        ("Cookie", "c=1"),
        ("Host", "dgxmm:8090"),
        ("X-Forwarded-For", "1.1.1.1"),
        ("Forwarded", "for=1.1.1.1"),
        ("X-Real-IP", "1.1.1.1"),
        ("Connection", "close, X-Secret"),
        ("X-Secret", "s"),
        ("Keep-Alive", "5"),
        ("TE", "trailers"),
        ("Trailer", "t"),
        ("Transfer-Encoding", "chunked"),
        ("Upgrade", "h2c"),
        ("Proxy-Authorization", "p"),
        ("x-dgxmm-health-check", "1"),
        ("Content-Length", "10"),
        ("Accept-Encoding", "gzip"),
        *KEPT_UP,
    ]
    assert request_headers(scope(*headers)) == [*KEPT_UP, ("accept-encoding", "identity")]


# --- response_headers ---------------------------------------------------------------------------


def raw(*headers: tuple[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]


KEPT_DOWN = [("content-type", "application/json"), ("content-length", "123"), ("x-ratelimit-remaining", "9")]


@pytest.mark.parametrize(
    "header",
    [
        ("connection", "keep-alive"),
        ("keep-alive", "timeout=5"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "h2c"),
        ("trailer", "x-foo"),
        ("te", "trailers"),
        ("proxy-authenticate", "Basic"),
        ("server", "uvicorn"),
        ("date", "Mon, 01 Jan 2024 00:00:00 GMT"),
        ("x-request-id", "engines-own"),
    ],
    ids=lambda h: h[0],
)
def test_response_header_is_removed(header):
    out = response_headers(raw(*KEPT_DOWN, header))
    assert header[0].encode() not in [k for k, _ in out]


def test_response_headers_named_in_connection_are_removed():
    out = response_headers(raw(("Connection", "close, X-Internal"), ("X-Internal", "secret"), *KEPT_DOWN))
    assert out == raw(*KEPT_DOWN)


def test_response_keeps_content_type_length_and_others():
    assert response_headers(raw(*KEPT_DOWN)) == raw(*KEPT_DOWN)


def test_response_removal_ignores_case_and_lowercases_names():
    out = response_headers(
        raw(("Server", "uvicorn"), ("Date", "x"), ("Content-Type", "text/event-stream"), ("X-Request-ID", "r1"))
    )
    assert out == [(b"content-type", b"text/event-stream")]


def test_response_keeps_repeated_headers():
    out = response_headers(raw(("set-cookie", "a=1"), ("set-cookie", "b=2")))
    assert out == raw(("set-cookie", "a=1"), ("set-cookie", "b=2"))


def test_response_removes_all_in_one_go():
    headers = [
        ("date", "d"),
        ("server", "s"),
        ("connection", "keep-alive, x-hop"),
        ("x-hop", "1"),
        ("keep-alive", "5"),
        ("transfer-encoding", "chunked"),
        *KEPT_DOWN,
    ]
    assert response_headers(raw(*headers)) == raw(*KEPT_DOWN)
