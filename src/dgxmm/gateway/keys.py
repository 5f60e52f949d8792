"""The on-demand key file: read when it changes, fail closed when it goes, rotate without restart.

The file is looked at (``stat``) at most once per ``key_check_interval_s`` and re-read when its
inode, mtime or size changed. After a rotation the previous key is still recognised for
``previous_key_grace_s``, so that LiteLLM, which keeps sending it until it reloads its entries,
gets a plain 401 instead of being counted (and rate-limited) as an attacker.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from collections.abc import Callable
from enum import Enum
from pathlib import Path

log = logging.getLogger(__name__)


class Verdict(Enum):
    OK = "ok"
    PREVIOUS = "previous"  # the key before the last rotation, within its grace
    BAD = "bad"
    EXPIRED = "expired"  # a caller key past its expires_at (callerkeys.py)


def fingerprint(key: str) -> str:
    """First 12 hex digits of the key's SHA-256: safe to show and to store in LiteLLM."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def create_if_missing(path: Path | None) -> bool:
    """On a first start, write a random key to ``path`` (mode 0600) so the gateway of a fresh
    install works without a manual step; returns whether it did. A file that exists is never
    touched, not even an empty one: an emptied key file is an operator's way to fail closed.
    A place dgxmm cannot write to (a read-only mount for a key provisioned elsewhere) is logged
    and leaves the gateway failing closed until the file appears, as without this step."""
    if path is None:
        return False
    if path.exists():
        return False
    try:
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        if path.exists():  # created by someone else meanwhile: theirs stands
            return False
        log.error("cannot create the on-demand key file %s: %s", path, exc.strerror or exc)
        return False
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_urlsafe(32) + "\n")
    log.warning("created an on-demand key in %s", path)
    return True


class KeyFile:
    def __init__(
        self,
        path: Path | None,
        check_interval_s: float,
        previous_grace_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        self._interval = check_interval_s
        self._grace = previous_grace_s
        self._clock = clock
        self._checked_at = -float("inf")
        self._stat: tuple[int, int, int] | None = None
        self._key: str | None = None
        self._previous: str | None = None
        self._previous_until = 0.0
        self._warned = False
        self._listeners: list[Callable[[str | None], None]] = []

    def on_rotate(self, listener: Callable[[str | None], None]) -> None:
        """Called with the new key (None when it went away) after every change."""
        self._listeners.append(listener)

    def current(self) -> str | None:
        """The key now, or None when no readable, non-empty key file exists."""
        now = self._clock()
        if now - self._checked_at >= self._interval:
            self._checked_at = now
            self._reload(now)
        return self._key

    def check(self, given: str) -> Verdict:
        key = self.current()
        if key is not None and hmac.compare_digest(given.encode(), key.encode()):
            return Verdict.OK
        previous = self._previous
        if (
            previous is not None
            and self._clock() < self._previous_until
            and hmac.compare_digest(given.encode(), previous.encode())
        ):
            return Verdict.PREVIOUS
        return Verdict.BAD

    def _reload(self, now: float) -> None:
        if self._path is None:
            self._set(None, now, "no ondemand.key_file is configured")
            return
        try:
            st = os.stat(self._path)
        except OSError as exc:
            self._stat = None
            self._set(None, now, f"cannot read {self._path}: {exc.strerror}")
            return
        signature = (st.st_ino, st.st_mtime_ns, st.st_size)
        if signature == self._stat:
            return
        try:
            key = self._path.read_text().strip()
        except OSError as exc:
            self._set(None, now, f"cannot read {self._path}: {exc.strerror}")
            return
        self._stat = signature
        self._set(key or None, now, f"{self._path} is empty")

    def _set(self, key: str | None, now: float, why_missing: str) -> None:
        if key is None and not self._warned:
            self._warned = True
            log.error("on-demand gateway not configured: %s; every request gets 503", why_missing)
        if key == self._key:
            return
        if key is not None:
            self._warned = False
            log.info(
                "on-demand key %s (fingerprint %s)", "loaded" if self._key is None else "rotated", fingerprint(key)
            )
        if self._key is not None:
            self._previous, self._previous_until = self._key, now + self._grace
        self._key = key
        for listener in self._listeners:
            listener(key)
