"""The request headers read in one pass (dgxmm.gateway.heads.Heads): what the gateway and its
guard read, and the header lines sent up, checked against a plain reference of the rules (every
header on its own, no memo) for any mix of names, spellings and repeats."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dgxmm.gateway import heads as heads_module
from dgxmm.gateway.heads import DROP_UP, FORWARDING, MAX_KINDS, PLAIN_CONNECTION, SINGLETONS, WATCHED, Heads


def reference(headers: list[tuple[bytes, bytes]]) -> tuple[dict[bytes, bytes], bytes | None, str | None, bytes]:
    """The rules as the docs state them, one header at a time: first copies of the watched
    names, the first singleton repeated, the first forwarding header (``_`` read as ``-``), and
    the lines sent up (no dropped name, none named in a Connection header)."""

    def key(name: bytes) -> bytes:
        return name.replace(b"_", b"-")

    found: dict[bytes, bytes] = {}
    repeated = None
    for name, value in headers:
        if name in WATCHED:
            if name in found and name in SINGLETONS and repeated is None:
                repeated = name
            found.setdefault(name, value)
    forwarding = next((FORWARDING[key(n)] for n, _ in headers if key(n) in FORWARDING), None)
    named = set()
    for name, value in headers:
        if key(name) == b"connection" and value.lower() not in PLAIN_CONNECTION:
            named |= {t.strip().lower().replace(b"_", b"-") for t in value.split(b",") if t.strip()}
    named -= DROP_UP
    up = b"".join(
        b"%b: %b\r\n" % (n, v)
        for n, v in headers
        if not (key(n) in DROP_UP or key(n).startswith(b"x-forwarded-")) and key(n) not in named
    )
    return found, repeated, forwarding, up


NAMES = st.sampled_from(
    [
        b"host",
        b"authorization",
        b"content-type",
        b"content-length",
        b"user-agent",
        b"transfer-encoding",
        b"x-request-id",
        b"x-dgxmm-health-check",
        b"accept",
        b"accept-encoding",
        b"cookie",
        b"connection",
        b"keep-alive",
        b"x-forwarded-for",
        b"x_forwarded_for",
        b"x-forwarded-host",
        b"x_forwarded_proto",
        b"forwarded",
        b"x-real-ip",
        b"x_real_ip",
        b"proxy_authorization",
        b"te",
        b"upgrade",
        b"openai-beta",
        b"x-secret",
        b"x_secret",
        b"x-stainless-lang",
        b"expect",
    ]
)
VALUES = st.sampled_from(
    [
        b"1",
        b"keep-alive",
        b"close",
        b"x-secret",
        b"X_Secret, keep-alive",
        b"openai-beta",
        b"Bearer k",
        b"application/json",
        b" , ",
        b"upgrade",
    ]
)


@given(st.lists(st.tuples(NAMES, VALUES), max_size=14))
def test_one_pass_reads_what_the_rules_say(headers: list[tuple[bytes, bytes]]) -> None:
    heads = Heads(headers)
    found, repeated, forwarding, up = reference(headers)
    assert heads.found == found
    assert heads.repeated == repeated
    assert heads.forwarding_header() == forwarding
    assert heads.upstream == up


def test_a_singleton_twice_is_noted_and_its_first_copy_counts() -> None:
    heads = Heads(
        [
            (b"authorization", b"Bearer first"),
            (b"x-request-id", b"a"),
            (b"authorization", b"Bearer second"),
            (b"x-request-id", b"b"),
        ]
    )
    assert heads.repeated == b"authorization" and heads.get(b"authorization") == "Bearer first"
    assert heads.request_id() == b"a"  # x-request-id is not a singleton: the first counts, no refusal
    # Equal values are one object for one-byte bytes in CPython: the repeat is found by name.
    assert Heads([(b"content-length", b"5"), (b"content-length", b"5")]).repeated == b"content-length"


def test_the_memo_of_names_is_bounded_and_names_past_it_still_count(monkeypatch) -> None:
    monkeypatch.setattr(heads_module, "_KINDS", {})
    for i in range(MAX_KINDS + 500):
        assert Heads([(b"x-h-%d" % i, b"v")]).upstream == b"x-h-%d: v\r\n" % i
    assert len(heads_module._KINDS) == MAX_KINDS
    assert Heads([(b"x-forwarded-for", b"1.2.3.4")]).forwarding_header() == "X-Forwarded-For"  # not in the memo
