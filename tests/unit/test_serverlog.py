"""The ring of dgxmm's latest log lines (telemetry/serverlog.py): records in, lines out, no I/O."""

from __future__ import annotations

import logging

from dgxmm.logs import fields
from dgxmm.telemetry.serverlog import MAX_MESSAGE, RecentLines


def logger_with(lines: RecentLines) -> logging.Logger:
    log = logging.Logger("dgxmm.unit")  # its own: not the root's handlers
    log.addHandler(lines)
    return log


def test_it_keeps_the_newest_lines_and_gives_them_newest_first() -> None:
    lines = RecentLines(keep=3)
    log = logger_with(lines)
    for i in range(5):
        log.info("line %d", i)
    assert [line["message"] for line in lines.query(10)] == ["line 4", "line 3", "line 2"]
    assert [line["message"] for line in lines.query(1)] == ["line 4"]


def test_words_match_the_message_the_logger_or_a_field_in_any_case() -> None:
    lines = RecentLines()
    log = logger_with(lines)
    log.info("GET /v1/models 200", extra=fields("dep1", "qwen", "Req-ABC", "10.0.0.9"))
    log.info("unrelated")
    [found] = lines.query(10, text="req-abc")
    assert found | {"time": 0} == {
        "time": 0,
        "level": "info",
        "logger": "dgxmm.unit",
        "message": "GET /v1/models 200",
        "deployment": "dep1",
        "served_name": "qwen",
        "request_id": "Req-ABC",
        "peer": "10.0.0.9",
    }
    assert len(lines.query(10, text="DGXMM.UNIT")) == 2
    assert lines.query(10, text="info") == []  # the level is not a word of the line


def test_a_level_keeps_it_and_the_levels_above() -> None:
    lines = RecentLines()
    log = logger_with(lines)
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL):
        log.log(level, logging.getLevelName(level))
    assert [line["level"] for line in lines.query(10, level="warning")] == ["critical", "error", "warning"]
    assert len(lines.query(10)) == 5


def test_a_long_message_is_cut() -> None:
    lines = RecentLines()
    logger_with(lines).error("x" * (MAX_MESSAGE + 100))
    assert len(lines.query(1)[0]["message"]) == MAX_MESSAGE + 3


def test_warnings_are_kept_apart_and_read_with_the_rest_in_order() -> None:
    lines = RecentLines(keep=2, keep_warnings=2)
    log = logger_with(lines)
    for i in range(6):
        (log.warning if i in (1, 3, 4) else log.info)("line %d", i)
    # the newest two info lines (5, 2: 0 fell out) and the newest two warnings (4, 3), in the order logged
    assert [line["message"] for line in lines.query(10)] == ["line 5", "line 4", "line 3", "line 2"]
    assert [line["message"] for line in lines.query(10, level="warning")] == ["line 4", "line 3"]
    assert [line["message"] for line in lines.query(2)] == ["line 5", "line 4"]


def test_a_warning_outlives_twenty_thousand_access_lines() -> None:
    """Issue 41: access lines fill their own ring; the warning logged before them stays."""
    lines = RecentLines()
    log = logger_with(lines)
    log.warning("request failed: ondemand_queue_timeout", extra=fields(request_id="r-warned"))
    access = logging.Logger("dgxmm.access")
    access.addHandler(lines)
    for i in range(20_000):
        access.info("POST /v1/chat/completions 200 0.010 s", extra=fields(request_id=f"r-{i}"))
    [warning] = lines.query(10, level="warning")
    assert (warning["message"], warning["request_id"]) == ("request failed: ondemand_queue_timeout", "r-warned")
    assert lines.query(1, text="r-warned") == [warning]
    newest = lines.query(2000)
    assert newest[0]["request_id"] == "r-19999" and warning not in newest  # the newest 2000 are access lines
    assert len(lines.query(100_000)) == 2001  # the 2000 latest access lines and the warning
