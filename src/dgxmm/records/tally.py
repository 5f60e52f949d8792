"""What requests cost, counted: requests, prompt and completion tokens and errors, for the UTC
day, the last hour and in all. A caller key's usage (gateway/callerkeys.py) and a model's
(status/history.py) are both a ``Tally``, so "today" and "the last hour" mean the same thing for
both: a request counts when it ends, in the UTC day and the minute it ended in.

The last hour is kept by the minute (at most 60 counts): what a console polls is a sum of 60,
whatever the traffic, and nothing is kept per request.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from dataclasses import dataclass, field

MINUTE = 60.0
HOUR_MINUTES = 60  # the last hour: the current minute and the 59 before it


def utc_day(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.UTC).date().isoformat()


def day_bounds(wall: float) -> tuple[float, float]:
    """The UTC day ``wall`` is in, as Unix times: its midnight and the next."""
    midnight = dt.datetime.fromtimestamp(wall, dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return midnight.timestamp(), (midnight + dt.timedelta(days=1)).timestamp()


@dataclass(slots=True)
class Usage:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0  # requests that ended with an error answer (``Exchange.failed``)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, prompt: int, completion: int, failed: bool = False) -> None:
        self.requests += 1
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.errors += failed

    def merge(self, other: Usage) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.errors += other.errors

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "errors": self.errors,
        }


@dataclass(slots=True)
class Tally:
    """One caller's or one model's usage: ``today`` (the UTC ``day``), ``total``, and the last
    hour by the minute (``minutes``: each minute's start, Unix time, and its counts)."""

    total: Usage = field(default_factory=Usage)
    today: Usage = field(default_factory=Usage)
    day: str = ""
    minutes: deque[tuple[float, Usage]] = field(default_factory=lambda: deque(maxlen=HOUR_MINUTES))
    _bounds: tuple[float, float] = (0.0, 0.0)  # ``day`` as Unix times, once known: no date maths per request

    def roll(self, wall: float) -> None:
        """A new UTC day starts ``today`` again."""
        if self._bounds[0] <= wall < self._bounds[1]:
            return
        self._bounds = day_bounds(wall)
        day = utc_day(wall)
        if self.day != day:
            self.day, self.today = day, Usage()

    def add(self, wall: float, prompt: int, completion: int, failed: bool) -> None:
        """A request ended at ``wall`` (Unix time), having cost these tokens."""
        self.roll(wall)
        self.today.add(prompt, completion, failed)
        self.total.add(prompt, completion, failed)
        start = wall - wall % MINUTE
        if not self.minutes or self.minutes[-1][0] < start:  # a clock set back counts in the last minute
            self.minutes.append((start, Usage()))
        self.minutes[-1][1].add(prompt, completion, failed)

    def today_at(self, wall: float) -> Usage:
        """Today's counts as of ``wall``: none yet when the day they were counted in is over."""
        return self.today if self.day == utc_day(wall) else Usage()

    def last_hour(self, wall: float) -> Usage:
        """The counts of the minute ``wall`` is in and the 59 before it."""
        since = wall - wall % MINUTE - (HOUR_MINUTES - 1) * MINUTE
        hour = Usage()
        for start, counts in self.minutes:
            if start >= since:
                hour.merge(counts)
        return hour
