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
        log.warning("line %d", i)
    assert [line["message"] for line in lines.query(10)] == ["line 4", "line 3", "line 2"]
    assert [line["message"] for line in lines.query(1)] == ["line 4"]


def test_words_match_the_message_the_logger_or_a_field_in_any_case() -> None:
    lines = RecentLines()
    log = logger_with(lines)
    log.info("GET /v1/models 200", extra=fields("dep1", "qwen", "Req-ABC", "10.0.0.9"))
    log.info("unrelated")
    [found] = lines.query(10, text="req-abc")
    assert found | {"time": 0} == {"time": 0, "level": "info", "logger": "dgxmm.unit", "message": "GET /v1/models 200",
                                    "deployment": "dep1", "served_name": "qwen", "request_id": "Req-ABC",
                                    "peer": "10.0.0.9"}  # fmt: skip
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
