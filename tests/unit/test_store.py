"""Store: numbered migrations, the on-demand upgrade of an old database, add_missing_columns."""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
from pathlib import Path

import pytest

from dgxmm.records.deployment import Deployment, Mode, State
from dgxmm.settings import INSTANCE_ID_PATTERN
from dgxmm.store.db import Store, StoreError


def _old_database(path: Path) -> None:
    """A database as dgxmm left it before on-demand mode (schema migration 1 only)."""
    store = Store(path, upto=1)
    with store.transaction() as conn:
        for i in range(3):
            conn.execute(
                "INSERT INTO deployments (id, name, served_name, engine, memory_gib, state, "
                "created_at, updated_at) VALUES (?, ?, ?, 'command', 2, 'ready', 0, 0)",
                (f"d{i}", f"n{i}", f"s{i}"),
            )
    store.close()


def read(path: Path, sql: str) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql).fetchall()


def test_upgrade_sets_every_existing_row_always_on(tmp_path: Path) -> None:
    path = tmp_path / "dgxmm.db"
    _old_database(path)
    columns = {row[1] for row in read(path, "PRAGMA table_info(deployments)")}
    assert "mode" not in columns and "pending_mode" not in columns

    store = Store(path)
    assert store.applied_migrations() == {1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51}
    deps = store.load_deployments()
    assert [d.mode for d in deps] == [Mode.ALWAYS_ON] * 3
    assert [(d.managed_by, d.declared_in) for d in deps] == [("api", None)] * 3  # migration 46
    assert [d.model_path for d in deps] == [None] * 3  # migration 48
    assert [d.capabilities for d in deps] == [[]] * 3  # migration 51
    assert all(d.idle_timeout_s is None and d.pending_mode is None for d in deps)
    store.close()  # (dgxmm holds its database alone while it runs)
    assert read(path, "SELECT mode FROM deployments") == [("always_on",)] * 3


def test_the_instance_id_is_drawn_once_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "dgxmm.db"
    Store(path, upto=40).close()  # a database from before instance ids
    store = Store(path)
    first = store.instance_id()
    assert re.fullmatch(INSTANCE_ID_PATTERN, first) and re.search(r"-[0-9a-f]{8}$", first)
    store.close()
    store = Store(path)
    assert store.instance_id() == first and store.applied_migrations() == {
        1,
        40,
        41,
        42,
        43,
        44,
        45,
        46,
        47,
        48,
        49,
        50,
        51,
    }
    assert Store(tmp_path / "other.db").instance_id() != first


def test_a_configured_instance_id_wins(tmp_path: Path) -> None:
    from dgxmm.assembly.core import instance_id
    from dgxmm.settings import Settings

    store = Store(tmp_path / "dgxmm.db")
    assert instance_id(Settings(), store) == store.instance_id()
    assert instance_id(Settings(server={"instance_id": "spark-02"}), store) == "spark-02"


def _store_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "dgxmm.store.db"]
    caplog.clear()
    return lines


def test_schema_changes_are_logged_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A new database is one "created" line, not one line per migration and added column; an
    upgrade is one line saying what it changed; an up-to-date database logs nothing."""
    caplog.set_level(logging.INFO, logger="dgxmm.store.db")
    fresh = tmp_path / "fresh.db"
    Store(fresh).close()
    assert _store_lines(caplog) == [f"created database {fresh} (schema migration 51)"]
    Store(fresh).close()
    assert _store_lines(caplog) == []

    old = tmp_path / "old.db"
    _old_database(old)
    caplog.clear()
    Store(old).close()
    [line] = _store_lines(caplog)
    assert line.startswith(
        f"upgraded database {old}: applied migration 40 (deployments: on-demand mode); "
        "applied migration 41 (host: instance id); applied migration 42 (memory peaks); "
        "applied migration 43 (deployments: devices (gpu_ids, placed_on)); "
        "applied migration 44 (caller keys, viewer tokens); "
        "applied migration 45 (models pulled from a hub); "
        "applied migration 46 (deployments: ownership (managed_by, declared_in)); "
        "applied migration 47 (deployments: max_concurrent); "
        "applied migration 48 (deployments: model_path of hub models); "
        "applied migration 49 (deployments: request parameters); "
        "applied migration 50 (deployments: sleep_level); "
        "applied migration 51 (deployments: capabilities); "
        "added missing columns deployments.pending_mode, "
    )


def test_a_declared_deployment_keeps_its_owner_and_file(tmp_path: Path) -> None:
    store = Store(tmp_path / "dgxmm.db")
    dep = Deployment(
        id="x",
        name="x",
        served_name="x",
        engine="command",
        memory_gib=1,
        managed_by="config",
        declared_in="/etc/d.toml",
    )
    store.put(dep, keep=False)
    loaded = store.load_deployments()[0]
    assert (loaded.managed_by, loaded.declared_in) == ("config", "/etc/d.toml")


def test_max_concurrent_is_kept(tmp_path: Path) -> None:
    """Migration 47: a deployment's max_concurrent round-trips, null (no limit) too."""
    path = tmp_path / "dgxmm.db"
    store = Store(path)
    limited = Deployment(id="x", name="x", served_name="x", engine="command", memory_gib=1, max_concurrent=2)
    store.put(limited, keep=False)
    store.put(
        limited.model_copy(update={"id": "y", "name": "y", "served_name": "y", "max_concurrent": None}), keep=False
    )
    store.close()
    loaded = {d.id: d.max_concurrent for d in Store(path).load_deployments()}
    assert loaded == {"x": 2, "y": None}


def test_null_mode_reads_as_always_on(tmp_path: Path) -> None:
    store = Store(tmp_path / "dgxmm.db")
    dep = Deployment(id="x", name="x", served_name="x", engine="command", memory_gib=1, mode=None)
    store.put(dep, keep=False)
    loaded = store.load_deployments()[0]
    assert loaded.mode is None and loaded.effective_mode is Mode.ALWAYS_ON


def test_add_missing_columns_fills_a_partial_schema(tmp_path: Path) -> None:
    path = tmp_path / "dgxmm.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE deployments DROP COLUMN pending_mode")
    conn.commit()
    conn.close()
    store = Store(path)
    dep = Deployment(
        id="x",
        name="x",
        served_name="x",
        engine="command",
        memory_gib=1,
        pending_mode=Mode.ALWAYS_ON,
        state=State.STARTING,
    )
    store.put(dep, keep=False)
    assert store.load_deployments()[0].pending_mode is Mode.ALWAYS_ON


def test_newer_database_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "dgxmm.db"
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_migrations VALUES (999, 'from the future', 0)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer than this dgxmm knows"):
        Store(path)


def test_transaction_rolls_back_whole(tmp_path: Path) -> None:
    store = Store(tmp_path / "dgxmm.db")
    with pytest.raises(RuntimeError), store.transaction() as conn:
        conn.execute("INSERT INTO events (time, actor, deployment_id, text) VALUES (1, 'a', NULL, 't')")
        raise RuntimeError("boom")
    assert store.list_events(10) == [] and store.writable


def test_events_and_audit_round_trip(tmp_path: Path) -> None:
    store = Store(tmp_path / "dgxmm.db")
    store.add_event(1.0, "ondemand", "d1", "Started for a request")
    store.add_audit(
        {
            "time": 2.0,
            "user": None,
            "actor": "ondemand",
            "action": "ondemand_start",
            "deployment_id": "d1",
            "old": None,
            "new": {"state": "ready"},
            "text": "t",
        }
    )
    assert store.list_events(10) == [
        {"time": 1.0, "actor": "ondemand", "deployment_id": "d1", "text": "Started for a request"}
    ]
    row = store.list_audit(10)[0]
    assert row["user"] is None and row["new"] == {"state": "ready"} and row["action"] == "ondemand_start"


def test_no_other_connection_shares_the_database_while_dgxmm_holds_it(tmp_path: Path) -> None:
    """Exclusive locking mode, set before WAL: no ``-shm`` file (a mapped one on a full or
    read-only file system is a SIGBUS), and another connection cannot write under dgxmm."""
    path = tmp_path / "dgxmm.db"
    store = Store(path)
    store.add_event(1.0, "a", None, "t")
    assert not path.with_name("dgxmm.db-shm").exists()
    with (
        contextlib.closing(sqlite3.connect(path, timeout=0)) as other,
        pytest.raises(sqlite3.OperationalError, match="locked"),
    ):
        other.execute("INSERT INTO events (time, actor, text) VALUES (2, 'b', 'u')")
    store.close()
    assert read(path, "SELECT text FROM events") == [("t",)]
