"""The on-demand key file (dgxmm.gateway.keys).

Spec (Gateway, check 3 and "Key rotation"): without a readable key every request fails closed
(logged once); the file is checked at most once per interval and re-read when its inode, mtime or
size changed; a missing or empty file fails closed again; after a rotation the previous key is
recognised (as PREVIOUS, a plain 401) for the grace period.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest

from dgxmm.gateway.keys import KeyFile, Verdict, create_if_missing, fingerprint

INTERVAL = 1.0
GRACE = 300.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def key_path(tmp_path: Path) -> Path:
    return tmp_path / "ondemand.key"


def make(path: Path | None, clock: Clock) -> KeyFile:
    return KeyFile(path, check_interval_s=INTERVAL, previous_grace_s=GRACE, clock=clock)


def errors(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "dgxmm.gateway.keys" and r.levelno >= logging.ERROR]


def bump_mtime(path: Path, seconds: int = 10) -> None:
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 1_000_000_000))


def rotate(path: Path, new_key: str, clock: Clock) -> None:
    """Replace the file's content and let the check interval pass."""
    path.write_text(new_key)
    bump_mtime(path)
    clock.advance(INTERVAL)


# --- fail closed --------------------------------------------------------------------------------


def test_missing_file_fails_closed(key_path, clock):
    assert make(key_path, clock).current() is None


def test_no_path_fails_closed(clock):
    assert make(None, clock).current() is None


def test_empty_file_fails_closed(key_path, clock):
    key_path.write_text("")
    assert make(key_path, clock).current() is None


def test_whitespace_only_file_fails_closed(key_path, clock):
    key_path.write_text("  \n\t \n")
    assert make(key_path, clock).current() is None


@pytest.mark.parametrize("content", [None, "", " \n\t\n"], ids=["missing", "empty", "whitespace"])
def test_not_configured_is_logged_once_however_often_checked(key_path, clock, caplog, content):
    if content is not None:
        key_path.write_text(content)
    keys = make(key_path, clock)
    with caplog.at_level(logging.INFO, logger="dgxmm.gateway.keys"):
        for _ in range(5):
            assert keys.current() is None
            clock.advance(INTERVAL)
    assert len(errors(caplog)) == 1


def test_no_path_is_logged_once_however_often_checked(clock, caplog):
    keys = make(None, clock)
    with caplog.at_level(logging.INFO, logger="dgxmm.gateway.keys"):
        for _ in range(5):
            assert keys.current() is None
            clock.advance(INTERVAL)
    assert len(errors(caplog)) == 1


def test_check_without_key_is_bad(key_path, clock):
    keys = make(key_path, clock)
    assert keys.check("") is Verdict.BAD
    assert keys.check("anything") is Verdict.BAD


# --- reading ------------------------------------------------------------------------------------


def test_key_is_read_with_surrounding_whitespace_stripped(key_path, clock):
    key_path.write_text("  \n sk-secret-1 \n\n")
    assert make(key_path, clock).current() == "sk-secret-1"


def test_check_accepts_the_stripped_key(key_path, clock):
    key_path.write_text("sk-secret-1\n")
    keys = make(key_path, clock)
    assert keys.check("sk-secret-1") is Verdict.OK
    assert keys.check("sk-secret-1\n") is Verdict.BAD


def test_file_is_statted_at_most_once_per_interval(key_path, clock):
    key_path.write_text("old-key")
    keys = make(key_path, clock)
    assert keys.current() == "old-key"
    key_path.write_text("new-key")
    bump_mtime(key_path)
    clock.advance(INTERVAL * 0.9)
    assert keys.current() == "old-key"
    clock.advance(INTERVAL * 0.1)
    assert keys.current() == "new-key"


def test_file_is_not_statted_within_interval(key_path, clock, monkeypatch):
    key_path.write_text("the-key")
    keys = make(key_path, clock)
    keys.current()
    calls = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda *a, **kw: calls.append(a) or real_stat(*a, **kw))
    for _ in range(10):
        keys.current()
        clock.advance(INTERVAL / 20)
    assert calls == []
    clock.advance(INTERVAL)
    keys.current()
    assert len(calls) == 1


def test_same_size_content_change_with_new_mtime_is_picked_up(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    assert keys.current() == "key-AAAA"
    key_path.write_text("key-BBBB")
    bump_mtime(key_path)
    clock.advance(INTERVAL)
    assert keys.current() == "key-BBBB"


def test_unchanged_signature_is_not_reread(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    assert keys.current() == "key-AAAA"
    st = os.stat(key_path)
    key_path.write_text("key-BBBB")  # same size, mtime put back: inode, mtime, size unchanged
    os.utime(key_path, ns=(st.st_atime_ns, st.st_mtime_ns))
    clock.advance(INTERVAL)
    assert keys.current() == "key-AAAA"


def test_replaced_file_is_picked_up(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    assert keys.current() == "key-AAAA"
    st = os.stat(key_path)
    tmp = key_path.with_name("ondemand.key.tmp")
    tmp.write_text("key-BBBB")
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime, only the inode differs
    os.replace(tmp, key_path)
    assert os.stat(key_path).st_ino != st.st_ino
    clock.advance(INTERVAL)
    assert keys.current() == "key-BBBB"


def test_disappearing_file_fails_closed_then_comes_back(key_path, clock, caplog):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    with caplog.at_level(logging.INFO, logger="dgxmm.gateway.keys"):
        assert keys.current() == "key-AAAA"
        key_path.unlink()
        clock.advance(INTERVAL)
        assert keys.current() is None
        clock.advance(INTERVAL)
        assert keys.current() is None
        key_path.write_text("key-AAAA")
        clock.advance(INTERVAL)
        assert keys.current() == "key-AAAA"
    assert len(errors(caplog)) == 1


def test_emptied_file_fails_closed(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    assert keys.current() == "key-AAAA"
    key_path.write_text("")
    clock.advance(INTERVAL)
    assert keys.current() is None


def test_not_configured_is_logged_again_after_a_key_was_loaded_and_lost(key_path, clock, caplog):
    keys = make(key_path, clock)
    with caplog.at_level(logging.INFO, logger="dgxmm.gateway.keys"):
        assert keys.current() is None
        key_path.write_text("key-AAAA")
        clock.advance(INTERVAL)
        assert keys.current() == "key-AAAA"
        key_path.unlink()
        clock.advance(INTERVAL)
        assert keys.current() is None
        clock.advance(INTERVAL)
        assert keys.current() is None
    assert len(errors(caplog)) == 2


# --- rotation -----------------------------------------------------------------------------------


def test_check_current_key_is_ok(key_path, clock):
    key_path.write_text("key-AAAA")
    assert make(key_path, clock).check("key-AAAA") is Verdict.OK


@pytest.mark.parametrize("given", ["", "key-AAA", "key-AAAAA", "KEY-AAAA", "key-BBBB", "ключ"])
def test_check_wrong_key_is_bad(key_path, clock, given):
    key_path.write_text("key-AAAA")
    assert make(key_path, clock).check(given) is Verdict.BAD


def test_after_rotation_new_key_is_ok(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    keys.current()
    rotate(key_path, "key-BBBB", clock)
    assert keys.check("key-BBBB") is Verdict.OK


def test_after_rotation_old_key_is_previous_within_grace(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    keys.current()
    rotate(key_path, "key-BBBB", clock)
    assert keys.check("key-BBBB") is Verdict.OK  # the rotation is seen now
    assert keys.check("key-AAAA") is Verdict.PREVIOUS
    clock.advance(GRACE - 1)
    assert keys.check("key-AAAA") is Verdict.PREVIOUS


def test_after_grace_old_key_is_bad(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    keys.current()
    rotate(key_path, "key-BBBB", clock)
    assert keys.check("key-BBBB") is Verdict.OK
    clock.advance(GRACE)
    assert keys.check("key-AAAA") is Verdict.BAD
    assert keys.check("key-BBBB") is Verdict.OK


def test_after_rotation_wrong_key_is_bad(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    keys.current()
    rotate(key_path, "key-BBBB", clock)
    assert keys.check("key-CCCC") is Verdict.BAD


def test_only_the_last_previous_key_is_recognised(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    keys.current()
    rotate(key_path, "key-BBBB", clock)
    keys.current()
    rotate(key_path, "key-CCCC", clock)
    assert keys.check("key-CCCC") is Verdict.OK
    assert keys.check("key-BBBB") is Verdict.PREVIOUS
    assert keys.check("key-AAAA") is Verdict.BAD


def test_first_load_has_no_previous_key(key_path, clock):
    keys = make(key_path, clock)
    assert keys.current() is None
    rotate(key_path, "key-AAAA", clock)
    assert keys.check("key-AAAA") is Verdict.OK
    assert keys.check("") is Verdict.BAD


# --- listeners ----------------------------------------------------------------------------------


def test_on_rotate_listeners_get_the_new_key(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    seen_a: list[str | None] = []
    seen_b: list[str | None] = []
    keys.on_rotate(seen_a.append)
    keys.on_rotate(seen_b.append)
    keys.current()
    rotate(key_path, "key-BBBB", clock)
    keys.current()
    assert seen_a == ["key-AAAA", "key-BBBB"]
    assert seen_b == ["key-AAAA", "key-BBBB"]


def test_on_rotate_listeners_get_none_when_key_goes_away(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    seen: list[str | None] = []
    keys.on_rotate(seen.append)
    keys.current()
    key_path.unlink()
    clock.advance(INTERVAL)
    keys.current()
    assert seen == ["key-AAAA", None]


def test_on_rotate_not_called_when_key_unchanged(key_path, clock):
    key_path.write_text("key-AAAA")
    keys = make(key_path, clock)
    seen: list[str | None] = []
    keys.on_rotate(seen.append)
    keys.current()
    key_path.write_text("key-AAAA\n")  # new size and mtime, same key
    bump_mtime(key_path)
    clock.advance(INTERVAL)
    keys.current()
    clock.advance(INTERVAL)
    keys.current()
    assert seen == ["key-AAAA"]


def test_on_rotate_not_called_while_missing_stays_missing(key_path, clock):
    keys = make(key_path, clock)
    seen: list[str | None] = []
    keys.on_rotate(seen.append)
    for _ in range(3):
        keys.current()
        clock.advance(INTERVAL)
    assert seen == []


# --- fingerprint --------------------------------------------------------------------------------


def test_fingerprint_is_first_12_hex_digits_of_sha256():
    key = "sk-ondemand-0123456789"
    assert fingerprint(key) == hashlib.sha256(key.encode()).hexdigest()[:12]
    assert len(fingerprint(key)) == 12
    assert all(c in "0123456789abcdef" for c in fingerprint(key))


def test_fingerprint_known_value():
    assert fingerprint("abc") == "ba7816bf8f01"


def test_fingerprint_differs_between_keys():
    assert fingerprint("key-AAAA") != fingerprint("key-BBBB")


def test_first_start_creates_a_random_private_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "sub" / "ondemand.key"
    with caplog.at_level(logging.WARNING, logger="dgxmm.gateway.keys"):
        assert create_if_missing(path) is True
    assert f"created an on-demand key in {path}" in caplog.text
    key = path.read_text().strip()
    assert len(key) >= 32 and os.stat(path).st_mode & 0o777 == 0o600
    other = tmp_path / "other.key"
    create_if_missing(other)
    assert other.read_text() != path.read_text()  # random, not a fixed default
    assert create_if_missing(path) is False and path.read_text().strip() == key


def test_an_existing_key_file_is_never_replaced_not_even_an_empty_one(tmp_path: Path) -> None:
    path = tmp_path / "ondemand.key"
    path.write_text("")
    assert create_if_missing(path) is False and path.read_text() == ""
    assert create_if_missing(None) is False


def test_a_key_file_that_cannot_be_created_leaves_the_gateway_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A key provisioned elsewhere on a read-only mount must not stop dgxmm from starting."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with caplog.at_level(logging.ERROR, logger="dgxmm.gateway.keys"):
        assert create_if_missing(blocker / "ondemand.key") is False
    assert f"cannot create the on-demand key file {blocker / 'ondemand.key'}" in caplog.text
