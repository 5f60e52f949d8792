"""Property-based fuzz of gateway paths and headers against the served dgxmm: whatever the
request, dgxmm itself never answers 5xx, and the engine sees a request only when it passed every
check, with nothing it should not see (keys, cookies, forwarding headers in any spelling)."""

from __future__ import annotations

import json
import socket
from urllib.parse import quote, unquote

import pytest
from conftest import KEY
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hostile.harness import Front

pytestmark = pytest.mark.hostile

TRAFFIC = {
    "chat/completions",
    "completions",
    "embeddings",
    "responses",
    "messages",
    "chat/completions/batch",
    "audio/transcriptions",
    "audio/translations",
    "rerank",
    "score",
}
FORWARDING = {"x-forwarded-for", "forwarded", "x-real-ip"}
NEVER_UP = {"authorization", "cookie", "forwarded", "x-real-ip", "x-dgxmm-health-check", "proxy-authorization"}

segment = st.one_of(
    st.sampled_from(
        [
            "v1",
            "models",
            "m",
            "chat",
            "completions",
            "embeddings",
            "responses",
            "messages",
            "batch",
            "audio",
            "transcriptions",
            "rerank",
            "score",
            "health",
            "metrics",
            "sleep",
            "tokenize",
            ".",
            "..",
            "",
            "%2e",
            "%2E%2e",
            "%2f",
            "%5C",
            "%23",
            "%3F",
            "%00",
            "%",
            "%zz",
            "%C0%AF",
            "%C2%85",
            "%E2%80%AE",
            "%E2%80%8B",
            "%EF%BB%BF",
            ";",
            "m;x",
            "@",
            "~",
            "*",
        ]
    ),
    st.text(st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=8).map(lambda t: quote(t, safe="")),
    st.text("abcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@%", max_size=8),
)
header_name = st.one_of(
    st.sampled_from(
        [
            "X-Forwarded-For",
            "X_Forwarded_For",
            "x-forwarded_for",
            "Forwarded",
            "X-Real-IP",
            "X_Real_Ip",
            "X-Forwarded-Host",
            "X_Forwarded_Proto",
            "Cookie",
            "Proxy-Authorization",
            "Proxy_Authorization",
            "x-dgxmm-health-check",
            "Connection",
            "Keep-Alive",
            "TE",
            "Trailer",
            "Upgrade",
            "Expect",
            "Accept-Encoding",
            "X-Custom",
            "Host",
        ]
    ),
    st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!#$%&'*+.^`|~", min_size=1, max_size=20),
)
header_value = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40)
valid = st.sampled_from(
    [
        ("POST", "chat/completions"),
        ("POST", "completions"),
        ("POST", "embeddings"),
        ("POST", "rerank"),
        ("GET", "models"),
        ("GET", "models/m"),
        ("HEAD", "models/m"),
    ]
)
anything = st.tuples(
    st.sampled_from(["GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"]),
    st.sampled_from(["", "models", "models/m", "chat/completions", "v1/models", "health"]),
)
plain_header = st.tuples(st.sampled_from(["X-Custom", "Accept", "User-Agent", "OpenAI-Organization"]), header_value)
request = st.fixed_dictionaries(
    {
        "target": st.one_of(valid, anything),  # half of them a route the gateway serves
        "segments": st.one_of(st.just([]), st.just([]), st.lists(segment, min_size=1, max_size=5)),
        "query": st.one_of(st.just(""), st.text("abc=&%20x", max_size=10)),
        "headers": st.one_of(
            st.lists(plain_header, max_size=3), st.lists(st.tuples(header_name, header_value), max_size=4)
        ),
        "body": st.one_of(st.just(b""), st.just(b'{"model": "m", "messages": []}'), st.binary(max_size=64)),
    }
)


def send(front: Front, raw: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", front.served.port), timeout=30, source_address=("127.0.0.2", 0)) as s:
        s.sendall(raw)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def build(front: Front, r: dict) -> tuple[bytes, str, list[str]]:
    """The raw request, its target path, and the gateway path segments after the prefix."""
    method, route = r["target"]
    parts = ([front.deployment["id"], "v1", *route.split("/")] if route else []) + r["segments"]
    path = "/dgxmm/ondemand/" + "/".join(parts) + (f"?{r['query']}" if r["query"] else "")
    lines = [f"{method} {path} HTTP/1.1", "Host: x", f"Authorization: Bearer {KEY}", "Connection: close"]
    for name, value in r["headers"]:
        if name.lower().replace("_", "-") not in (
            "content-length",
            "transfer-encoding",
            "authorization",
            "connection",
            "host",
        ):
            lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(r['body'])}")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + r["body"]
    return raw, path, parts


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(r=request)
def test_fuzzed_gateway_requests(front: Front, r: dict) -> None:
    raw, path, parts = build(front, r)
    status, body = send(front, raw)
    seen = front.engine_requests()
    front.clear_engine()
    event("forwarded to the engine" if seen else f"answered {status} by dgxmm")  # --hypothesis-show-statistics
    assert status < 500, (status, body[:300], path)
    names = {name.lower().replace("_", "-") for name, _ in r["headers"]}
    if seen:
        [request] = seen
        parts = [unquote(part) for part in parts]
        endpoint = "/".join(parts[2:])
        method = r["target"][0]
        route_ok = (method == "POST" and endpoint in TRAFFIC) or (
            method in ("GET", "HEAD") and len(parts) == 4 and parts[2] == "models"
        )
        assert route_ok and parts[:2] == [front.deployment["id"], "v1"], path
        assert not names & FORWARDING, names
        forwarded = {name.replace("_", "-") for name in request["headers"]}
        assert not forwarded & NEVER_UP and not any(n.startswith("x-forwarded-") for n in forwarded), forwarded
    elif status >= 400 and body.startswith(b"{"):
        error = json.loads(body).get("error", {})
        assert {"message", "type", "code"} <= set(error), body
