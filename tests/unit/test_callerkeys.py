"""The gateway's callers (dgxmm.gateway.callerkeys): the key file and the caller keys, checked
in one place; the keys' models, expiry, requests in flight and tokens per UTC day; their usage
kept, and only a digest of each secret. No I/O: the records live in a dict, clocks are given."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from dgxmm.gateway.refused import Refused
from dgxmm.errors import StoreUnavailable
from dgxmm.gateway.callerkeys import KEY_FILE, CallerKeys, glob_problem, seconds_to_next_day
from dgxmm.gateway.keys import KeyFile, Verdict
from dgxmm.store.db import Store

NOON = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC).timestamp()


class Wall:
    def __init__(self) -> None:
        self.now = NOON

    def __call__(self) -> float:
        return self.now


class Records:
    """The store's part, in memory; ``full``: every write fails as on a full disk."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.usage_writes = 0
        self.full = False

    def _check(self) -> None:
        if self.full:
            raise StoreUnavailable("the disk is full")

    def load_caller_keys(self) -> list[dict[str, Any]]:
        return [dict(row) for row in self.rows.values()]

    def put_caller_key(self, row: dict[str, Any]) -> None:
        self._check()
        self.rows[row["id"]] = dict(row)

    def delete_caller_key(self, key_id: str) -> None:
        self._check()
        del self.rows[key_id]

    def put_caller_usage(self, rows: list[dict[str, Any]]) -> None:
        self._check()
        self.usage_writes += 1
        for row in rows:
            self.rows[row["id"]].update(row)


class FixedKeyFile(KeyFile):
    def __init__(self, key: str) -> None:
        super().__init__(None, 1.0, 300.0)
        self._key = key
        self._checked_at = float("inf")  # never re-read

    def current(self) -> str | None:
        return self._key


FILE_KEY = "the-key-file-secret"


def make(records: Records | None = None, wall: Wall | None = None) -> CallerKeys:
    return CallerKeys(FixedKeyFile(FILE_KEY), records or Records(), wall or Wall())


def test_the_key_file_is_one_caller_among_the_keys() -> None:
    keys = make()
    key, secret = keys.create("alice", None, None, None, None)
    assert keys.check(FILE_KEY) is KEY_FILE and KEY_FILE.name == "key-file"
    assert keys.check(secret) is key
    assert keys.check(secret + "x") is Verdict.BAD
    assert keys.check("") is Verdict.BAD
    assert secret.startswith(key.prefix) and len(key.prefix) < len(secret) // 3


def test_only_a_digest_is_kept() -> None:
    records = Records()
    keys = make(records)
    _, secret = keys.create("alice", ["a-*"], None, 2, 100)
    assert secret not in repr(records.rows) and secret not in repr(keys.all())


def test_models_are_globs_over_names() -> None:
    keys = make()
    key, _ = keys.create("alice", ["a-*", "exact"], None, None, None)
    assert key.allows("a-1") and key.allows("exact")
    assert not key.allows("b-1") and not key.allows("exactly") and not key.allows("xa-1")
    assert key.allows_any(("b-1", "a-2")) and not key.allows_any(("b-1",))
    nothing, _ = keys.create("bob", [], None, None, None)
    assert not nothing.allows("a-1")
    assert KEY_FILE.allows("anything")


def test_an_expired_key_is_told_apart() -> None:
    wall = Wall()
    keys = make(wall=wall)
    key, secret = keys.create("alice", None, NOON + 60, None, None)
    assert keys.check(secret) is key
    wall.now += 60
    assert keys.check(secret) is Verdict.EXPIRED


def test_revoked_is_bad_at_once() -> None:
    records = Records()
    keys = make(records)
    key, secret = keys.create("alice", None, None, None, None)
    keys.revoke(key)
    assert keys.check(secret) is Verdict.BAD and records.rows == {}


def test_max_concurrent_refuses_before_taking() -> None:
    keys = make()
    key, _ = keys.create("alice", None, None, 1, None)
    keys.admit(key)
    with pytest.raises(Refused) as refused:
        keys.admit(key)
    assert (refused.value.status, refused.value.code, refused.value.retry_after) == (429, "concurrency_limit", 1)
    assert key.counters.in_flight == 1
    keys.release(key)
    keys.admit(key)
    assert key.counters.in_flight == 1


def test_tokens_per_day_until_the_next_utc_day() -> None:
    wall = Wall()
    keys = make(wall=wall)
    key, _ = keys.create("alice", None, None, None, 100)
    keys.admit(key)  # a stream that goes over finishes...
    keys.release(key)
    keys.done(key, 30, 80)
    with pytest.raises(Refused) as refused:  # ...and the next request is refused
        keys.admit(key)
    assert (refused.value.status, refused.value.code) == (429, "quota_exceeded")
    assert refused.value.retry_after == 12 * 3600
    wall.now += 12 * 3600  # midnight UTC
    keys.admit(key)
    assert key.view(wall.now)["usage"]["total"] == {
        "requests": 1,
        "prompt_tokens": 30,
        "completion_tokens": 80,
        "errors": 0,
    }


def test_seconds_to_next_day() -> None:
    assert seconds_to_next_day(NOON) == 43200
    assert seconds_to_next_day(NOON + 43199.5) == 1


def test_usage_survives_a_restart_through_flush() -> None:
    records = Records()
    wall = Wall()
    keys = make(records, wall)
    key, secret = keys.create("alice", ["a-*"], None, 3, 1000)
    for i in range(5):
        keys.done(key, 10, 20, failed=i == 0)
    assert records.usage_writes == 0  # counted in memory, written at a bounded rate
    keys.flush()
    keys.flush()  # nothing changed since: no write
    assert records.usage_writes == 1
    again = make(records, wall)
    [back] = again.all()
    assert again.check(secret) is back
    usage = back.view(wall.now)["usage"]
    assert usage["today"] == {"requests": 5, "prompt_tokens": 50, "completion_tokens": 100, "errors": 1}
    assert usage["total"] == usage["today"]
    assert usage["last_hour"]["requests"] == 0  # the last hour is kept in memory only
    assert back.view(wall.now + 86400)["usage"]["today"]["requests"] == 0
    assert (back.models, back.max_concurrent, back.tokens_per_day) == (("a-*",), 3, 1000)


def test_change_applies_and_stores() -> None:
    records = Records()
    keys = make(records)
    key, _ = keys.create("alice", ["a-*"], None, None, None)
    old = key
    key, persisted = keys.change(key, {"models": ["b-*"], "max_concurrent": 2})
    assert persisted is True and keys.get(key.id) is key and key.counters is old.counters
    assert (old.models, old.max_concurrent) == (("a-*",), None), "the record a request holds stays as it was"
    assert key.allows("b-1") and not key.allows("a-1") and key.max_concurrent == 2
    assert records.rows[key.id]["models"] == ["b-*"] and records.rows[key.id]["max_concurrent"] == 2


def test_the_key_file_is_counted_in_memory_only() -> None:
    records = Records()
    keys = make(records)
    keys.done(KEY_FILE, 10, 10)
    keys.done(KEY_FILE, 0, 0, failed=True)
    keys.flush()
    assert (
        records.usage_writes == 0 and KEY_FILE.counters.usage.total.requests == 0
    )  # the shared KEY_FILE counts nothing
    [file_key] = keys.usage()
    assert file_key["name"] == "key-file" and file_key["last_used_at"] is not None
    assert (
        file_key["today"]
        == file_key["last_hour"]
        == {
            "requests": 2,
            "prompt_tokens": 10,
            "completion_tokens": 10,
            "errors": 1,
        }
    )
    assert make(records).usage()[0]["total"]["requests"] == 0  # a new start counts again


def test_usage_lists_the_key_file_first_then_the_keys() -> None:
    wall = Wall()
    keys = make(wall=wall)
    alice, _ = keys.create("alice", None, None, None, None)
    wall.now += 1
    keys.create("bob", None, None, None, None)
    keys.done(alice, 3, 4)
    names = [(row["name"], row["last_hour"]["completion_tokens"]) for row in keys.usage()]
    assert names == [("key-file", 0), ("alice", 4), ("bob", 0)]


@pytest.mark.parametrize("glob", ["", "a b", "a[", "x\n", "[abc"])
def test_invalid_globs(glob: str) -> None:
    assert glob_problem(glob) is not None


@pytest.mark.parametrize("glob", ["a-*", "qwen?", "[ab]-1", "exact.name:7b"])
def test_valid_globs(glob: str) -> None:
    assert glob_problem(glob) is None


def test_the_store_keeps_keys_and_no_secret(tmp_path: Path) -> None:
    path = tmp_path / "dgxmm.db"
    store = Store(path)
    keys = CallerKeys(FixedKeyFile(FILE_KEY), store, Wall())
    key, secret = keys.create("alice", ["a-*"], NOON + 3600, 1, 10, keep_alive=False)
    keys.done(key, 1, 2, failed=True)
    keys.flush()
    store.close()
    assert secret.encode() not in path.read_bytes()
    store = Store(path)
    again = CallerKeys(FixedKeyFile(FILE_KEY), store, Wall())
    [back] = again.all()
    assert again.check(secret) is back and back.counters.usage.total.requests == 1 and back.expires_at == NOON + 3600
    assert back.counters.usage.today.errors == back.counters.usage.total.errors == 1
    assert back.keep_alive is False and back.view(NOON)["keep_alive"] is False, "the right is kept"
    changed, persisted = again.change(back, {"keep_alive": True})
    assert persisted and CallerKeys(FixedKeyFile(FILE_KEY), store, Wall()).all()[0].keep_alive is True
    again.revoke(changed)
    assert CallerKeys(FixedKeyFile(FILE_KEY), store, Wall()).all() == []
    store.close()


def test_a_revocation_the_store_refuses_holds_at_once_and_the_next_flush_that_can_writes_it() -> None:
    records = Records()
    keys = make(records)
    key, secret = keys.create("alice", None, None, None, None)
    other, _ = keys.create("bob", None, None, None, None)
    keys.done(other, 3, 4)
    records.full = True
    assert keys.revoke(key) is False
    assert keys.check(secret) is Verdict.BAD and keys.get(key.id) is None, "refused from the moment it was asked"
    assert keys.unwritten() == ["the revocation of key alice"] and key.id in records.rows
    with pytest.raises(StoreUnavailable):
        keys.flush()
    records.full = False
    keys.flush()
    assert key.id not in records.rows and keys.unwritten() == []
    assert records.rows[other.id]["total_completion_tokens"] == 4, "the usage follows the revocation"
    assert make(records).get(key.id) is None, "a restart does not bring it back"


def test_a_narrowing_the_store_refuses_is_in_force_and_written_later() -> None:
    records = Records()
    keys = make(records)
    key, _ = keys.create("alice", ["a-*", "b-*"], None, None, 1000)
    records.full = True
    key, persisted = keys.change(key, {"models": ["a-*"], "tokens_per_day": 10})
    assert persisted is False
    assert not key.allows("b-1") and key.tokens_per_day == 10
    assert keys.unwritten() == ["a change to key alice"] and records.rows[key.id]["models"] == ["a-*", "b-*"]
    records.full = False
    keys.flush()
    assert records.rows[key.id]["models"] == ["a-*"] and records.rows[key.id]["tokens_per_day"] == 10
    assert keys.unwritten() == []
