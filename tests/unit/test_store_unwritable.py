"""A database that cannot be written (store/db.py): what happened to an engine is kept and written
once it can be; a change a caller asks for is refused; the failure is logged once and the
recovery once. SQLite's own ``query_only`` makes every write fail as a read-only file system
does ("attempt to write a readonly database"); tests/integration/test_full_disk.py fills a real
disk."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dgxmm.errors import StoreUnavailable
from dgxmm.records.deployment import Deployment, State
from dgxmm.store import db
from dgxmm.store.db import Store


def dep(name: str, state: State = State.STOPPED) -> Deployment:
    return Deployment(id=name, name=name, served_name=name, engine="command", command=["x"], memory_gib=1, state=state)


def read_only(store: Store, on: bool) -> None:
    store._conn.execute(f"PRAGMA query_only={int(on)}")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "dgxmm.db")


def reopened(store: Store) -> Store:
    """What a restart would read."""
    store.close()
    return Store(store.path)


def test_a_kept_row_is_written_once_the_database_can_be_written(store: Store) -> None:
    store.put(dep("a"), keep=False)
    read_only(store, True)
    assert store.put(dep("a", State.STOPPING), keep=True) is False
    assert store.put(dep("a", State.FAILED), keep=True) is False  # the newest of a row wins
    assert not store.writable and "readonly" in (store.problem or "")
    assert store.flush() is False
    read_only(store, False)
    assert store.flush() is True and store.writable
    assert [d.state for d in reopened(store).load_deployments()] == [State.FAILED]


def test_a_refused_change_is_not_kept(store: Store) -> None:
    read_only(store, True)
    with pytest.raises(StoreUnavailable, match="cannot be written"):
        store.put(dep("a"), keep=False)
    read_only(store, False)
    assert store.flush() is True
    assert reopened(store).load_deployments() == []


def test_a_refused_delete_keeps_the_row_and_what_was_kept_is_written_with_the_next_write(store: Store) -> None:
    store.put(dep("a"), keep=False)
    read_only(store, True)
    store.put(dep("a", State.FAILED), keep=True)
    with pytest.raises(StoreUnavailable):
        store.delete("a")
    read_only(store, False)
    store.put(dep("b"), keep=False)  # a write that goes through takes what was kept with it
    assert store.writable
    assert {d.id: d.state for d in reopened(store).load_deployments()} == {"a": State.FAILED, "b": State.STOPPED}


def test_a_check_with_nothing_kept_writes_to_the_disk(store: Store) -> None:
    """An empty transaction commits on a full disk: the check must write, or a database that
    still cannot be written would read as writable (and the failure be logged again and again)."""
    read_only(store, True)
    with pytest.raises(StoreUnavailable):
        store.put(dep("a"), keep=False)
    assert store.flush() is False and not store.writable
    read_only(store, False)
    assert store.flush() is True


def test_event_rows_are_kept_in_order_within_a_bound(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db, "KEPT_LOG_ROWS", 3)
    store.add_event(0.0, "a", None, "before")
    read_only(store, True)
    for i in range(5):
        store.add_event(float(i + 1), "a", None, f"e{i}")
    read_only(store, False)
    store.add_event(9.0, "a", None, "after")
    assert [row["text"] for row in store.list_events(10)] == ["before", "e2", "e3", "e4", "after"]


def test_the_failure_and_the_recovery_are_logged_once_each(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dgxmm.store.db")
    read_only(store, True)
    for i in range(5):
        store.put(dep("a", State.FAILED), keep=True)
        store.add_event(float(i), "a", None, "e")
        store.flush()
    read_only(store, False)
    store.flush()
    store.flush()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "cannot be written: attempt to write a readonly database" in lines[0]
    assert lines[1].endswith("can be written again: wrote the 6 changes kept")
