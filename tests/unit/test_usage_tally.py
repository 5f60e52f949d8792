"""What requests cost, counted (dgxmm.records.tally): today by the UTC day, the last hour by the
minute (the current one and the 59 before it), and in all; clocks are given."""

from __future__ import annotations

import datetime as dt

from dgxmm.records.tally import Tally, Usage

NOON = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC).timestamp()


def test_a_request_counts_today_in_the_last_hour_and_in_all() -> None:
    tally = Tally()
    tally.add(NOON, 10, 20, failed=False)
    tally.add(NOON + 1, 5, 0, failed=True)
    both = Usage(requests=2, prompt_tokens=15, completion_tokens=20, errors=1)
    assert tally.today_at(NOON + 2) == tally.last_hour(NOON + 2) == tally.total == both
    assert both.tokens == 35


def test_the_last_hour_is_the_current_minute_and_the_59_before() -> None:
    tally = Tally()
    tally.add(NOON + 30, 1, 1, failed=False)  # in the minute 12:00
    tally.add(NOON + 61, 2, 2, failed=False)  # in the minute 12:01
    assert tally.last_hour(NOON + 59 * 60 + 59).requests == 2  # 12:59:59: 12:00 is still in
    assert tally.last_hour(NOON + 60 * 60).requests == 1  # 13:00: 12:00 left, 12:01 is in
    assert tally.last_hour(NOON + 61 * 60) == Usage()
    assert tally.total.requests == 2


def test_today_starts_again_at_utc_midnight() -> None:
    tally = Tally()
    midnight = NOON + 12 * 3600
    tally.add(midnight - 1, 7, 7, failed=False)
    assert tally.today_at(midnight) == Usage()  # read after midnight, before the next request
    tally.add(midnight + 1, 1, 0, failed=False)
    assert (tally.day, tally.today.requests, tally.total.requests) == ("2026-12-04", 1, 2)
    assert tally.last_hour(midnight + 1).requests == 2  # the last hour spans midnight


def test_a_clock_set_back_counts_in_the_latest_minute() -> None:
    tally = Tally()
    tally.add(NOON + 120, 1, 0, failed=False)
    tally.add(NOON, 1, 0, failed=False)
    assert len(tally.minutes) == 1 and tally.last_hour(NOON + 120).requests == 2


def test_an_hour_of_minutes_is_all_that_is_kept() -> None:
    tally = Tally()
    for minute in range(200):
        tally.add(NOON + minute * 60, 1, 1, failed=False)
    assert len(tally.minutes) == 60
    assert tally.last_hour(NOON + 199 * 60).requests == 60 and tally.total.requests == 200
