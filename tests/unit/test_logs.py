"""Log lines as text or JSON, with the fields of a request or deployment when known (issue 13)."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from dgxmm import logs
from dgxmm.gateway.exchange import request_id


def record(message: str = "hello %s", *args: object, exc: bool = False, **extra: str) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("dgxmm.x", logging.WARNING, __file__, 1, message, args or ("you",), exc_info)
    rec.__dict__.update(extra)
    return rec


def test_json_line_has_time_level_logger_message_and_known_fields() -> None:
    line = json.loads(logs.JsonFormatter().format(record(**logs.fields("d1", "tiny", "r1", "127.0.0.2"))))
    assert set(line) == {"time", "level", "logger", "message", "deployment", "served_name", "request_id", "peer"}
    assert (line["level"], line["logger"], line["message"]) == ("warning", "dgxmm.x", "hello you")
    assert (line["deployment"], line["served_name"], line["request_id"], line["peer"]) == (
        "d1",
        "tiny",
        "r1",
        "127.0.0.2",
    )
    assert line["time"].endswith("Z") and line["time"][10] == "T" and len(line["time"]) == 24


def test_json_line_leaves_out_unknown_fields_and_carries_the_traceback() -> None:
    line = json.loads(logs.JsonFormatter().format(record(exc=True)))
    assert set(line) == {"time", "level", "logger", "message", "exception"}
    assert "ValueError: boom" in line["exception"]


def test_json_keeps_one_line_whatever_the_message() -> None:
    text = logs.JsonFormatter().format(record("two\nlines\x1b[31m %s", "x"))
    assert "\n" not in text and json.loads(text)["message"] == "two\nlines\x1b[31m x"


def test_text_line_appends_the_known_fields_and_keeps_a_traceback_below() -> None:
    plain = logs.TextFormatter().format(record())
    assert plain.endswith("WARNING dgxmm.x: hello you")
    tagged = logs.TextFormatter().format(record(exc=True, **logs.fields(request_id="r1", peer="10.0.0.1")))
    first, rest = tagged.split("\n", 1)
    assert first.endswith("hello you [request_id=r1 peer=10.0.0.1]") and "ValueError: boom" in rest


def test_printable_escapes_control_characters_and_cuts_long_paths() -> None:
    assert logs.printable("/a\nb\x1b\x7fc") == "/a\\x0ab\\x1b\\x7fc"
    assert logs.printable("x" * 600) == "x" * 512 + "..."


@pytest.mark.parametrize("fmt,kind", [("json", logs.JsonFormatter), ("text", logs.TextFormatter)])
def test_configure_installs_one_root_handler(fmt: str, kind: type) -> None:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        logs.configure("warning", fmt)
        logs.configure("debug", fmt)  # twice: still one handler
        assert len(root.handlers) == 1 and isinstance(root.handlers[0].formatter, kind)
        assert root.level == logging.DEBUG
    finally:
        root.handlers[:] = saved
        root.setLevel(level)


@pytest.mark.parametrize("given", ["abc", "0f8c9e2a-0b1c-4d5e-8f90-123456789abc", "a.b:c/d+e=f@g_h-i", "x" * 128])
def test_a_sane_request_id_is_kept(given: str) -> None:
    assert request_id([(b"x-request-id", given.encode())]) == given


@pytest.mark.parametrize("given", [b"", b"two words", b"x" * 129, b"a\nb", b'quote"', b"caf\xe9", b"<script>"])
def test_an_insane_request_id_is_replaced(given: bytes) -> None:
    made = request_id([(b"x-request-id", given)])
    assert made != given.decode("latin-1") and len(made) == 16 and made.isalnum()


def test_generated_request_ids_differ() -> None:
    made = {request_id([]) for _ in range(1000)}
    assert len(made) == 1000
