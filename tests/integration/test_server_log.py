"""dgxmm's own log in the console (issue 30): its latest lines through ``GET /api/log``, found by a
caller's request id (the gateway's access line carries it) or by words, filtered by level, newest
first; a traceback kept with its line; nothing without the admin token."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import gateway_settings, refused_request

pytestmark = pytest.mark.timeout(60)


async def test_the_latest_lines_found_by_request_id_words_and_level(serve, tmp_path: Path, caplog) -> None:
    caplog.set_level(logging.INFO)  # dgxmm's default log_level
    svc = await serve(gateway_settings(tmp_path))
    await refused_request(svc, "caller-req-4242")
    lines = (await svc.client.get("/api/log", params={"q": "caller-req-4242"})).json()
    assert lines and all(line["request_id"] == "caller-req-4242" for line in lines), lines
    [access] = [line for line in lines if line["logger"] == "dgxmm.access"]
    assert access["level"] == "info" and " 401" in access["message"] and access["peer"] == "127.0.0.2"

    try:
        raise RuntimeError("a fault for the log")
    except RuntimeError:
        logging.getLogger("dgxmm.test").exception("something failed here")
    logging.getLogger("dgxmm.test").warning("a later warning")
    warnings = (await svc.client.get("/api/log", params={"level": "warning", "limit": 2})).json()
    assert [line["message"].splitlines()[0] for line in warnings] == ["a later warning", "something failed here"]
    assert "RuntimeError: a fault for the log" in warnings[1]["message"]  # the traceback with its line
    assert not [
        line
        for line in (await svc.client.get("/api/log", params={"level": "error"})).json()
        if line["logger"] == "dgxmm.access"
    ]

    bad = await svc.client.get("/api/log", params={"level": "loud"})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_input"
    svc.client.headers.pop("Authorization")
    assert (await svc.client.get("/api/log")).status_code == 401


async def test_a_warning_stays_in_the_log_after_twenty_thousand_access_lines(serve, tmp_path: Path, caplog) -> None:
    """Issue 41: warnings are kept apart from access lines (10,000 of them), so a busy gateway's
    access lines do not push out the warning an operator opens the panel for."""
    caplog.set_level(logging.INFO)
    svc = await serve(gateway_settings(tmp_path))
    logging.getLogger("dgxmm.gateway").warning("request failed: ondemand_queue_timeout (the warned one)")
    access = logging.getLogger("dgxmm.access")
    for i in range(20_000):
        access.info("POST /dgxmm/ondemand/x/v1/chat/completions 200 0.010 s", extra={"request_id": f"bulk-{i}"})
    await refused_request(svc, "after-the-bulk")  # a real access line after them all
    warnings = (await svc.client.get("/api/log", params={"level": "warning"})).json()
    assert "request failed: ondemand_queue_timeout (the warned one)" in [w["message"] for w in warnings]
    latest = (await svc.client.get("/api/log", params={"limit": 2000})).json()
    assert any(line.get("request_id") == "after-the-bulk" for line in latest[:10])  # access lines go on
    assert not any(line["message"].endswith("(the warned one)") for line in latest)  # the rest moved on
