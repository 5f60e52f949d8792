"""The gateway's callers: the on-demand key file and the caller keys, one owner for both.

A request's credentials are checked here, whichever kind they are: the key file (``keys.KeyFile``,
every model, no limits: LiteLLM's entries and the existing deployments use it) first, then the
caller keys an operator made in the admin API, each with its models, expiry, requests in flight
and tokens per UTC day. The gateway asks ``check`` for a caller, ``allows`` for its models and
``admit`` before a slot is taken, enters each admitted request in ``open`` (``inflight``), and
tells ``done`` what each answer cost; nothing else keeps a key's state.

A revocation or a change is in force from the moment it is asked for, and ends the key's
requests in flight it no longer allows, whether or not the store can be written: a full disk must
not keep a revoked key working. What could not be written is written first by the next
``flush`` that can (every few seconds); until then a restart would bring the old key back, the
one thing a disk that takes no write cannot prevent (``unwritten`` says what, shutdown logs it).

Only a SHA-256 digest of a secret is kept (secrets are 32 random bytes: a salt adds nothing to a
digest of that much entropy), in memory and in the store. A given secret is hashed whether or not
a key has it, and looked up by its digest, which says nothing of any stored secret; the match is
confirmed with ``hmac.compare_digest``. Usage is counted in memory and written to the store at
most once per ``flush`` (a background task, every few seconds, and at shutdown): a request never
waits for the disk.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from dgxmm.gateway.refused import Refused
from dgxmm.errors import StoreUnavailable
from dgxmm.gateway.inflight import OpenRequests
from dgxmm.gateway.keyrecord import KEY_FILE, KEY_FILE_NAME, CallerKey, key_from_row, row_of, usage_row_of, usage_view
from dgxmm.gateway.keys import KeyFile, Verdict
from dgxmm.settings import Progress

log = logging.getLogger(__name__)

SECRET_PREFIX = "dgxmm-"
PREFIX_CHARS = len(SECRET_PREFIX) + 6  # the part of a secret its record shows, to recognise it
CONCURRENCY_RETRY_S = 1


def digest_of(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def seconds_to_next_day(wall: float) -> int:
    """Whole seconds (at least 1) until the next UTC midnight: a spent quota's ``Retry-After``."""
    now = dt.datetime.fromtimestamp(wall, dt.UTC)
    midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
    return max(1, int((midnight - now).total_seconds() + 0.999))


def glob_problem(glob: str) -> str | None:
    """Why ``glob`` is no model glob (None when it is one): a name or ``fnmatch`` pattern of
    printable characters without spaces, every ``[`` closed."""
    if not glob:
        return "a glob is empty"
    if len(glob) > 200:
        return "a glob is longer than 200 characters"
    if any(not c.isprintable() or c.isspace() for c in glob):
        return f"{glob!r} has a space or an unprintable character"
    if re.search(r"\[[^\]]*$", glob):
        return f"{glob!r} has a '[' without its ']'"
    return None


class KeyRecords(Protocol):
    """Where caller keys are kept (the SQLite store, ``store.db.Store``)."""

    def load_caller_keys(self) -> list[dict[str, Any]]: ...

    def put_caller_key(self, row: dict[str, Any]) -> None: ...

    def delete_caller_key(self, key_id: str) -> None: ...

    def put_caller_usage(self, rows: list[dict[str, Any]]) -> None: ...


class NoRecords:
    """Nowhere: a gateway without a store (tests) has the key file only."""

    def load_caller_keys(self) -> list[dict[str, Any]]:
        return []

    def put_caller_key(self, row: dict[str, Any]) -> None:
        pass

    def delete_caller_key(self, key_id: str) -> None:
        pass

    def put_caller_usage(self, rows: list[dict[str, Any]]) -> None:
        pass


class CallerKeys:
    def __init__(
        self, key_file: KeyFile, records: KeyRecords | None = None, wall: Callable[[], float] = time.time
    ) -> None:
        self.key_file = key_file
        self._records: KeyRecords = records if records is not None else NoRecords()
        self._wall = wall
        self._by_id: dict[str, CallerKey] = {}
        self._by_digest: dict[bytes, CallerKey] = {}
        self._dirty: set[str] = set()  # keys whose usage changed since the last flush
        # The keys whose revocation (those no longer in ``_by_id``) or last change is in force
        # but not on disk yet, by id, oldest first.
        self._unwritten: dict[str, CallerKey] = {}
        self.open = OpenRequests(wall)  # the requests in flight of each key, to end them
        # The key file's usage, counted since this start (``KEY_FILE`` itself is shared and counts nothing).
        self._file_caller = CallerKey(id=KEY_FILE_NAME, name=KEY_FILE_NAME, prefix="", digest=b"")
        for row in self._records.load_caller_keys():
            self._add(key_from_row(row))

    # --- the gateway's checks -----------------------------------------------------------------

    def check(self, given: str) -> CallerKey | Verdict:
        """The caller ``given`` (a secret) names: the key file's ``KEY_FILE``, a caller key, or
        the verdict on a refused one (``PREVIOUS``: the key file's before a rotation, in its
        grace; ``EXPIRED``; ``BAD``)."""
        verdict = self.key_file.check(given)
        if verdict is Verdict.OK:
            return KEY_FILE
        digest = digest_of(given)
        key = self._by_digest.get(digest, KEY_FILE)
        if not hmac.compare_digest(key.digest, digest):  # KEY_FILE's empty digest never matches
            return verdict
        if key.expires_at is not None and self._wall() >= key.expires_at:
            return Verdict.EXPIRED
        return key

    def admit(self, key: CallerKey, reserve: int = 0) -> None:
        """Take one of ``key``'s requests in flight holding ``reserve`` tokens of its day, or
        refuse (429) when it has as many as it may, or its day's tokens are spent or held: a
        request is admitted while the day's count plus what requests in flight hold is below
        the quota, so that together they pass it by at most one request's ``reserve``. The
        caller ``release``s what was taken."""
        counters = key.counters
        if not key.limited:
            counters.in_flight += 1
            return
        quota = key.tokens_per_day
        if quota is not None:
            wall = self._wall()
            counters.usage.roll(wall)
            used = counters.usage.today.tokens
            if used >= quota:
                raise Refused(
                    429,
                    "quota_exceeded",
                    f"the key {key.name} used its {quota} tokens of the day (UTC)",
                    retry_after=seconds_to_next_day(wall),
                )
            if used + counters.reserved >= quota:
                raise Refused(
                    429,
                    "quota_exceeded",
                    f"the key {key.name}'s requests in flight hold the rest of its {quota} tokens of the day",
                    retry_after=CONCURRENCY_RETRY_S,
                )
        if key.max_concurrent is not None and counters.in_flight >= key.max_concurrent:
            raise Refused(
                429,
                "concurrency_limit",
                f"the key {key.name} has {counters.in_flight} requests in flight, its most",
                retry_after=CONCURRENCY_RETRY_S,
            )
        counters.in_flight += 1
        counters.reserved += reserve

    @staticmethod
    def release(key: CallerKey, reserve: int = 0) -> None:
        """A request ``admit`` took ended: its place and what it held are free (``done`` counts
        what it cost)."""
        key.counters.in_flight -= 1
        key.counters.reserved -= reserve

    def done(self, key: CallerKey, prompt: int | None, completion: int | None, failed: bool = False) -> None:
        """A request with ``key`` ended; its answer cost the tokens its usage reported (none
        when it reported none), counted as the activity log counts them; ``failed``: it ended
        with an error answer. The key file's is counted apart, in memory (``KEY_FILE`` is shared
        by every gateway: it counts nothing)."""
        wall = self._wall()
        counters = self._file_caller.counters if key is KEY_FILE else key.counters
        counters.usage.add(wall, prompt or 0, completion or 0, failed)
        counters.last_used_at = wall
        if key is not KEY_FILE:
            self._dirty.add(key.id)

    # --- the admin API's -----------------------------------------------------------------------

    def all(self) -> list[CallerKey]:
        return sorted(self._by_id.values(), key=lambda k: (k.created_at, k.id))

    def get(self, key_id: str) -> CallerKey | None:
        return self._by_id.get(key_id)

    def current(self, key: CallerKey) -> CallerKey:
        """``key``'s record as it is now: a change made a new one (the key file's, and a revoked
        key's, is the one given)."""
        return self._by_id.get(key.id, key)

    def usage(self) -> list[dict[str, Any]]:
        """Each key's usage, the key file's first (its counts are in memory, from dgxmm's start;
        a caller key's today and total are kept across restarts, its last hour is not)."""
        wall = self._wall()
        return [{"id": key.id, "name": key.name, **usage_view(key, wall)} for key in (self._file_caller, *self.all())]

    def by_name(self, name: str) -> CallerKey | None:
        return next((k for k in self._by_id.values() if k.name == name), None)

    def create(
        self,
        name: str,
        models: list[str] | None,
        expires_at: float | None,
        max_concurrent: int | None,
        tokens_per_day: int | None,
        *,
        keep_alive: bool = True,
        progress: Progress = "off",
        priority: int = 0,
    ) -> tuple[CallerKey, str]:
        """A new key and its secret (given out this once: only its digest is kept)."""
        secret = new_secret()
        key = CallerKey(
            id="key-" + secrets.token_hex(6),
            name=name,
            prefix=secret[:PREFIX_CHARS],
            digest=digest_of(secret),
            models=None if models is None else tuple(models),
            expires_at=expires_at,
            max_concurrent=max_concurrent,
            tokens_per_day=tokens_per_day,
            keep_alive=keep_alive,
            progress=progress,
            priority=priority,
            created_at=self._wall(),
        )
        self._records.put_caller_key(row_of(key))
        self._add(key)
        return key, secret

    def change(self, key: CallerKey, changes: dict[str, Any]) -> tuple[CallerKey, bool]:
        """New limits or models (``changes``: the fields given, checked already): a new record in
        the old one's place (its counters shared), in force at once whether or not the store can
        be written (a narrowing must not wait for the disk), and the key's requests in flight
        with a model it no longer allows are ended. Returns the new record and whether the
        change is on disk; if not, ``flush`` writes it once it can."""
        settings: dict[str, Any] = {
            name: changes[name]
            for name in ("expires_at", "max_concurrent", "tokens_per_day", "keep_alive", "progress", "priority")
            if name in changes
        }
        if "models" in changes:
            settings["models"] = None if changes["models"] is None else tuple(changes["models"])
        key = replace(key, **settings)
        self._add(key)
        if "models" in changes:
            self.open.end(
                key,
                Refused(403, "model_not_allowed", f"the key {key.name} may no longer use this model"),
                key.allows_any,
            )
        if "expires_at" in changes:
            self.open.arm(key)
        self._unwritten[key.id] = key
        return key, self._write_unwritten()

    def revoke(self, key: CallerKey) -> bool:
        """The key is gone, from this moment whatever the disk does: the next request with it
        is 401, and its requests in flight end (401 ``key_revoked``). Returns whether the
        revocation is on disk; if not, ``flush`` writes it first thing once it can (until then a
        restart would bring the key back: ``unwritten`` names it, and shutdown logs it)."""
        self._by_id.pop(key.id, None)
        self._by_digest.pop(key.digest, None)
        self._dirty.discard(key.id)
        self.open.end(key, Refused(401, "key_revoked", f"the key {key.name} was revoked"))
        self._unwritten[key.id] = key
        return self._write_unwritten()

    def end_requests(self, key: CallerKey) -> int:
        """End the key's requests in flight (503 ``request_ended``): how many were ended."""
        return self.open.end(key, Refused(503, "request_ended", "an administrator ended the key's requests"))

    def unwritten(self) -> list[str]:
        """The revocations and changes in force that are not on disk yet, in words."""
        return [
            f"a change to key {key.name}" if key_id in self._by_id else f"the revocation of key {key.name}"
            for key_id, key in self._unwritten.items()
        ]

    def _write_unwritten(self) -> bool:
        """Write the revocations and changes not on disk yet (a key's row as it is now: its
        last change included); True when none is left."""
        try:
            for key_id, key in list(self._unwritten.items()):
                if key_id in self._by_id:
                    self._records.put_caller_key(row_of(key))
                else:
                    self._records.delete_caller_key(key_id)
                del self._unwritten[key_id]
        except StoreUnavailable:
            return False
        return True

    def flush(self) -> None:
        """Write the revocations and changes not on disk yet, first, then the usage that changed
        since the last flush; ``StoreUnavailable`` when the database cannot be written (what was
        not written is kept for the next flush)."""
        late = self.unwritten()
        if not self._write_unwritten():
            raise StoreUnavailable("the caller keys' revocations and changes could not be written")
        if late:
            log.warning("wrote %s, kept in memory while the database could not be written", "; ".join(late))
        if not self._dirty:
            return
        rows = [usage_row_of(self._by_id[i]) for i in self._dirty if i in self._by_id]
        self._records.put_caller_usage(rows)
        self._dirty.clear()

    def _add(self, key: CallerKey) -> None:
        self._by_id[key.id] = key
        self._by_digest[key.digest] = key
