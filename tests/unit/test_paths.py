"""Path checks of the gateway (dgxmm.gateway.paths).

Spec (Gateway, check 2 and "Forwarding"): a ., .. or empty segment, \\, ?, #, a control character
or an encoded /, \\, #, ? or NUL is 400 invalid_path; the upstream path is rebuilt from the
checked segments.
"""

from __future__ import annotations

import pytest

from dgxmm.gateway.paths import InvalidPath, segments, under, upstream_path

PREFIX = "/dgxmm/ondemand"
BASE = PREFIX + "/dep-1/v1/"


def seg(path: str | bytes) -> list[str]:
    return segments(path.encode("latin-1") if isinstance(path, str) else path, PREFIX)


# --- under: the one "is this the gateway's or the router's path" test ------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1", True),
        ("/v1/", True),
        ("/v1/models", True),
        ("/v1x", False),
        ("/v1x/models", False),
        ("/v", False),
        ("/", False),
        ("/api/v1", False),
    ],
)
def test_under_is_the_prefix_or_a_path_below_it(path, expected):
    assert under(path, "/v1") is expected


def test_the_router_and_the_outermost_app_share_the_test():
    """asgi and gateway.router call the one function, not copies of it."""
    import inspect

    from dgxmm import asgi
    from dgxmm.gateway import router

    for module in (asgi, router):
        source = inspect.getsource(module)
        assert "from dgxmm.gateway.paths import under" in source
        assert "path[len(" not in source


# --- accepted -----------------------------------------------------------------------------------


def test_plain_path_is_split_into_segments():
    assert seg(BASE + "chat/completions") == ["dep-1", "v1", "chat", "completions"]


def test_single_segment_after_prefix():
    assert seg(PREFIX + "/dep-1") == ["dep-1"]


def test_percent_encoded_ordinary_character_is_decoded():
    assert seg(BASE + "models/%41bc") == ["dep-1", "v1", "models", "Abc"]


def test_lowercase_percent_encoding_is_decoded():
    assert seg(BASE + "models/a%2db") == ["dep-1", "v1", "models", "a-b"]


def test_model_name_with_colon_is_accepted():
    assert seg(BASE + "models/qwen3:8b") == ["dep-1", "v1", "models", "qwen3:8b"]
    assert seg(BASE + "models/qwen3%3A8b") == ["dep-1", "v1", "models", "qwen3:8b"]


def test_encoded_utf8_is_decoded():
    assert seg(BASE + "models/caf%C3%A9") == ["dep-1", "v1", "models", "café"]


def test_dots_inside_a_segment_are_accepted():
    assert seg(BASE + "models/Llama-3.1...8B") == ["dep-1", "v1", "models", "Llama-3.1...8B"]
    assert seg(BASE + "models/.hidden") == ["dep-1", "v1", "models", ".hidden"]


def test_encoded_percent_stays_a_literal_percent():
    assert seg(BASE + "models/a%252fb") == ["dep-1", "v1", "models", "a%2fb"]


# --- refused ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [BASE + ".", BASE + "./models", PREFIX + "/./dep-1/v1/models"])
def test_dot_segment_is_invalid(path):
    with pytest.raises(InvalidPath):
        seg(path)


@pytest.mark.parametrize("path", [BASE + "..", BASE + "../models", PREFIX + "/dep-1/../other/v1/models"])
def test_dotdot_segment_is_invalid(path):
    with pytest.raises(InvalidPath):
        seg(path)


@pytest.mark.parametrize(
    "path",
    [BASE + "chat//completions", PREFIX + "//dep-1/v1/models", BASE + "models/", PREFIX + "/"],
    ids=["double-slash", "double-slash-after-prefix", "trailing-slash", "prefix-slash-only"],
)
def test_empty_segment_is_invalid(path):
    with pytest.raises(InvalidPath):
        seg(path)


@pytest.mark.parametrize("path", [BASE + "models\\x", BASE + "..\\..\\admin", BASE + "\\"])
def test_backslash_is_invalid(path):
    with pytest.raises(InvalidPath):
        seg(path)


@pytest.mark.parametrize("path", [BASE + "models?x=1", BASE + "models#frag", BASE + "?", BASE + "#"])
def test_literal_question_mark_or_hash_is_invalid(path):
    with pytest.raises(InvalidPath):
        seg(path)


@pytest.mark.parametrize("char", ["\x00", "\x01", "\t", "\n", "\r", "\x1b", "\x1f", "\x7f"])
def test_raw_control_character_is_invalid(char):
    with pytest.raises(InvalidPath):
        seg(BASE + "models/a" + char + "b")


@pytest.mark.parametrize("encoded", ["%01", "%09", "%0a", "%0A", "%0d", "%1b", "%1F", "%7f", "%7F"])
def test_encoded_control_character_is_invalid(encoded):
    with pytest.raises(InvalidPath):
        seg(BASE + "models/a" + encoded + "b")


@pytest.mark.parametrize("encoded", ["%2f", "%2F", "%5c", "%5C", "%23", "%3f", "%3F", "%00"])
def test_encoded_slash_backslash_hash_question_nul_is_invalid(encoded):
    with pytest.raises(InvalidPath):
        seg(BASE + "models/a" + encoded + "b")


@pytest.mark.parametrize("encoded", ["%2f", "%2F", "%5c", "%5C"])
def test_encoded_separator_used_for_traversal_is_invalid(encoded):
    with pytest.raises(InvalidPath):
        seg(BASE + ".." + encoded + ".." + encoded + "admin")


@pytest.mark.parametrize("segment", ["%2e%2e", "%2E%2E", ".%2e", "%2e.", "%2e", "%2E"])
def test_encoded_dot_segment_is_invalid(segment):
    with pytest.raises(InvalidPath):
        seg(BASE + segment + "/models")


@pytest.mark.parametrize("raw", ["é".encode(), b"\xff", b"\x80", "模型".encode()])
def test_non_ascii_raw_bytes_are_invalid(raw):
    with pytest.raises(InvalidPath):
        seg(BASE.encode() + b"models/" + raw)


@pytest.mark.parametrize("encoded", ["%ff", "%FF", "%c3", "%c3%28", "%80", "%ed%a0%80"])
def test_invalid_utf8_percent_sequence_is_invalid(encoded):
    with pytest.raises(InvalidPath):
        seg(BASE + "models/a" + encoded)


@pytest.mark.parametrize(
    "path",
    [
        "/other/dep-1/v1/models",
        "/dgxmm/ondemandx/dep-1/v1/models",
        "/dgxmm/ondemand",
        "/dgxmm",
        "dgxmm/ondemand/dep-1/v1/models",
        "",
        "/api/dgxmm/ondemand/dep-1/v1/models",
    ],
)
def test_path_not_under_prefix_is_invalid(path):
    with pytest.raises(InvalidPath):
        seg(path)


def test_invalid_path_is_an_exception():
    assert issubclass(InvalidPath, Exception)


# --- upstream_path ------------------------------------------------------------------------------


def test_upstream_path_joins_plain_segments():
    assert upstream_path(["v1", "chat", "completions"]) == "/v1/chat/completions"


def test_upstream_path_keeps_colon_and_subdelims():
    assert upstream_path(["v1", "models", "qwen3:8b"]) == "/v1/models/qwen3:8b"


def test_upstream_path_reencodes_special_characters():
    assert upstream_path(["v1", "models", "a b"]) == "/v1/models/a%20b"
    assert upstream_path(["v1", "models", "a%2fb"]) == "/v1/models/a%252fb"
    assert upstream_path(["v1", "models", "café"]) == "/v1/models/caf%C3%A9"


def test_upstream_path_encodes_slash_inside_a_segment():
    assert upstream_path(["v1", "models", "org/name"]) == "/v1/models/org%2Fname"


def test_upstream_path_of_checked_segments_round_trips():
    raw = BASE + "models/qwen3%3A8b%20q4"
    parts = seg(raw)
    assert upstream_path(parts[1:]) == "/v1/models/qwen3:8b%20q4"
    assert seg(PREFIX + "/dep-1" + upstream_path(parts[1:])) == parts
