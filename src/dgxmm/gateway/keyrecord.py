"""A caller key's record, frozen, and its live counters; their rows in the store.

A key's settings (its models, expiry and limits) are a frozen ``CallerKey``: a request that
checked a key holds the record it checked, and an administrator's change is a new record that
``callerkeys.CallerKeys``, the one writer, puts in the old one's place (``dataclasses.replace``).
What every request changes (its requests and tokens in flight, its usage, its last use) is not a
setting: it is the key's ``KeyCounters``, one object shared by every record of the key, so that a
request that began before a change releases what it took from the same counters. Only
``CallerKeys`` moves them.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Any

from dgxmm.records.tally import Tally, Usage
from dgxmm.settings import Progress

KEY_FILE_NAME = "key-file"  # the key file's name in activity rows and metrics
PRIORITY_MIN, PRIORITY_MAX = -1000, 1000  # a key's priority, and a request's, within these


@dataclass(slots=True)
class KeyCounters:
    """What a key's requests change: moved by ``CallerKeys`` alone (admit, release, done)."""

    usage: Tally = field(default_factory=Tally)  # today's and the total kept in the store
    last_used_at: float | None = None
    in_flight: int = 0
    reserved: int = 0  # tokens its requests in flight hold of ``tokens_per_day`` (gateway/quota.py)


def pattern_of(models: tuple[str, ...] | None) -> re.Pattern[str] | None:
    """One pattern for a key's globs (None: every model; no glob: none)."""
    if models is None:
        return None
    return re.compile("|".join(fnmatch.translate(g) for g in models) or "(?!)")


@dataclass(frozen=True, slots=True)
class CallerKey:
    """A caller key's record (its secret's digest, never the secret) and its counters."""

    id: str
    name: str
    prefix: str
    digest: bytes
    models: tuple[str, ...] | None = None  # globs over served names and aliases; None: every model
    expires_at: float | None = None  # Unix time
    max_concurrent: int | None = None
    tokens_per_day: int | None = None
    # It may set its model's idle timer (``keep_alive``/``ttl`` on /v1, ``keep_alive`` on /api/*).
    keep_alive: bool = True
    progress: Progress = "off"  # a wait's lines in a streamed chat's reasoning (gateway/progress.py)
    priority: int = 0  # its requests' priority at most (controller/priority.py); the key file's: 0
    created_at: float = 0.0
    counters: KeyCounters = field(default_factory=KeyCounters, compare=False)  # shared by its records
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pattern", pattern_of(self.models))  # (built once, with the record)

    @property
    def limited(self) -> bool:
        """Whether ``admit`` has anything to check (the key file never has)."""
        return self.max_concurrent is not None or self.tokens_per_day is not None

    def allows(self, name: str) -> bool:
        """Whether a model called ``name`` (a served name or an alias) is this key's to use."""
        return self._pattern is None or self._pattern.match(name) is not None

    def allows_any(self, names: Iterable[str]) -> bool:
        return self._pattern is None or any(self.allows(name) for name in names)

    def view(self, wall: float) -> dict[str, Any]:
        """The record as the admin API shows it: no secret, its first characters only."""
        return {
            "id": self.id,
            "name": self.name,
            "prefix": self.prefix,
            "models": None if self.models is None else list(self.models),
            "expires_at": None if self.expires_at is None else iso(self.expires_at),
            "expired": self.expires_at is not None and wall >= self.expires_at,
            "max_concurrent": self.max_concurrent,
            "tokens_per_day": self.tokens_per_day,
            "keep_alive": self.keep_alive,
            "progress": self.progress,
            "priority": self.priority,
            "created_at": iso(self.created_at),
            "in_flight": self.counters.in_flight,
            "usage": usage_view(self, wall),
        }


def usage_view(key: CallerKey, wall: float) -> dict[str, Any]:
    """A key's usage as the admin API shows it: today (UTC), the last hour, in all, the last use."""
    counters = key.counters
    return {
        "today": counters.usage.today_at(wall).as_dict(),
        "last_hour": counters.usage.last_hour(wall).as_dict(),
        "total": counters.usage.total.as_dict(),
        "last_used_at": None if counters.last_used_at is None else iso(counters.last_used_at),
    }


def iso(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.UTC).isoformat().replace("+00:00", "Z")


KEY_FILE = CallerKey(id=KEY_FILE_NAME, name=KEY_FILE_NAME, prefix="", digest=b"")


def usage_row_of(key: CallerKey) -> dict[str, Any]:
    """The key's usage as the store keeps it (the last hour is not kept)."""
    usage = key.counters.usage
    today, total = usage.today, usage.total
    return {
        "id": key.id,
        "day": usage.day,
        "today_requests": today.requests,
        "today_prompt_tokens": today.prompt_tokens,
        "today_completion_tokens": today.completion_tokens,
        "today_errors": today.errors,
        "total_requests": total.requests,
        "total_prompt_tokens": total.prompt_tokens,
        "total_completion_tokens": total.completion_tokens,
        "total_errors": total.errors,
        "last_used_at": key.counters.last_used_at,
    }


def row_of(key: CallerKey) -> dict[str, Any]:
    """The key's row in the store: its digest in hex, never a secret."""
    return {
        "name": key.name,
        "prefix": key.prefix,
        "digest": key.digest.hex(),
        "models": None if key.models is None else list(key.models),
        "expires_at": key.expires_at,
        "max_concurrent": key.max_concurrent,
        "tokens_per_day": key.tokens_per_day,
        "keep_alive": int(key.keep_alive),
        "progress": key.progress,
        "priority": key.priority,
        "created_at": key.created_at,
        **usage_row_of(key),
    }


def key_from_row(row: dict[str, Any]) -> CallerKey:
    return CallerKey(
        id=row["id"],
        name=row["name"],
        prefix=row["prefix"],
        digest=bytes.fromhex(row["digest"]),
        models=None if row["models"] is None else tuple(row["models"]),
        expires_at=row["expires_at"],
        max_concurrent=row["max_concurrent"],
        tokens_per_day=row["tokens_per_day"],
        keep_alive=bool(row.get("keep_alive", 1)),
        progress="reasoning" if row["progress"] == "reasoning" else "off",
        priority=row["priority"],
        created_at=row["created_at"],
        counters=KeyCounters(
            Tally(
                total=Usage(
                    row["total_requests"],
                    row["total_prompt_tokens"],
                    row["total_completion_tokens"],
                    row["total_errors"],
                ),
                today=Usage(
                    row["today_requests"],
                    row["today_prompt_tokens"],
                    row["today_completion_tokens"],
                    row["today_errors"],
                ),
                day=row["day"],
            ),
            row["last_used_at"],
        ),
    )
