"""SQLite store in the data directory: deployments, events and audit rows.

Calls are synchronous on purpose: they take well under a millisecond on a local file, and the
deployer must be able to write a state change without an ``await`` between deciding and writing
(its stop precheck relies on that). One connection, owned by this object.

A disk that fills up or turns read-only must not leave an engine running behind a record that
says otherwise, nor stop dgxmm from stopping one. So a write that fails is kept: what happened to
an engine (``put``) and the event and audit rows are held in memory and written with the next
write that succeeds (``retry`` tries every few seconds); a change a caller asks for (``put``
without ``keep``, ``delete``) is refused with ``StoreUnavailable`` instead. The failure is logged
once, and once more when the database can be written again.

The connection holds the database in exclusive locking mode, set before WAL: SQLite then keeps
the WAL index in its own memory, not in a ``-shm`` file mapped into the process, whose pages a
full or read-only file system turns into a SIGBUS (a crash). Only one dgxmm uses a data
directory (``datadir.DataDirLock``), so no other connection needs that file; the database can
be read by others once dgxmm has stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from dgxmm.datadir import make_private_dir, open_private
from dgxmm.errors import StoreUnavailable
from dgxmm.records.deployment import Deployment
from dgxmm.store.migrations import MIGRATIONS, Migration, add_missing_columns
from dgxmm.store.rows import CALLER_KEY_COLUMNS, CALLER_USAGE, DEPLOYMENT_COLUMNS, deployment_of, dump, load, row_of

log = logging.getLogger(__name__)

STORE_RETRY_S = 2.0  # how often what could not be written is tried again
KEPT_LOG_ROWS = 10_000  # event and audit rows held while the database cannot be written
_PEAK = "INSERT OR REPLACE INTO memory_peaks (deployment_id, config, peak_bytes, updated_at) VALUES (?, ?, ?, ?)"
_EVENT = "INSERT INTO events (time, actor, deployment_id, text) VALUES (?, ?, ?, ?)"
_AUDIT = (
    "INSERT INTO audit (time, user, actor, action, deployment_id, old, new, text) "
    "VALUES (:time, :user, :actor, :action, :deployment_id, :old, :new, :text)"
)
_PROBE = "INSERT OR REPLACE INTO host (key, value) VALUES ('last_write', ?)"  # a write that touches the disk


class StoreError(Exception):
    """The database cannot be used (for example it is newer than this dgxmm)."""


class Store:
    def __init__(self, path: Path, *, upto: int | None = None) -> None:
        """Open (creating) the database and bring it to the newest schema, or to ``upto`` only:
        tests build the database an older dgxmm left behind that way."""
        make_private_dir(path.parent)
        for name in (path.name, path.name + "-wal", path.name + "-shm"):  # SQLite copies the mode
            if name == path.name or (path.parent / name).exists():
                os.close(open_private(path.parent / name, os.O_RDWR))
        self.path = path
        # The connection refuses any thread but its opener's: the one-thread rule (onethread.py).
        self._conn = sqlite3.connect(path, isolation_level=None)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA locking_mode=EXCLUSIVE")  # before WAL: no -shm file (see above)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self.problem: str | None = None  # why the database cannot be written, while it cannot
        self._kept_rows: dict[str, Deployment] = {}  # deployment rows not yet written
        self._kept_log: deque[tuple[str, Any]] = deque()  # event and audit inserts not yet written
        self._lost_log = 0  # of those, dropped past KEPT_LOG_ROWS
        self.migrate(upto)

    def close(self) -> None:
        self._conn.close()

    @property
    def writable(self) -> bool:
        """False from a failed write until the next one that succeeds."""
        return self.problem is None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; rolled back whole if anything inside raises. A database that
        cannot be written (SQLite's operational errors: full, read-only, I/O error, locked)
        raises ``StoreUnavailable``."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                if self._conn.in_transaction:
                    with suppress(sqlite3.Error):
                        self._conn.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            raise self._failed(exc) from exc

    def _failed(self, exc: sqlite3.OperationalError) -> StoreUnavailable:
        problem = f"the database {self.path} cannot be written: {exc}"
        if self.problem is None:
            log.error(
                "%s; dgxmm keeps what it could not write in memory and writes it once it can, "
                "and refuses changes through the admin API (503) until then",
                problem,
            )
        self.problem = problem
        return StoreUnavailable(problem)

    # --- writes that wait for the disk --------------------------------------------------------

    def put(self, dep: Deployment, *, keep: bool) -> bool:
        """Write the deployment's row (with everything kept). When the database cannot be
        written: with ``keep`` (what happened to an engine, true whatever the disk does) the row
        is kept for a later write and False returned; without (a change a caller asked for),
        ``StoreUnavailable`` is raised and nothing is kept."""
        if keep:
            self._kept_rows[dep.id] = dep
            return self.flush()
        self._write_kept(dep)
        return True

    def delete(self, deployment_id: str) -> None:
        """Delete the deployment's row; ``StoreUnavailable`` if the database cannot be written."""
        with self.transaction() as conn:
            self._write_kept_in(conn)
            conn.execute("DELETE FROM deployments WHERE id = ?", (deployment_id,))
            conn.execute("DELETE FROM memory_peaks WHERE deployment_id = ?", (deployment_id,))
        self._written()

    def flush(self) -> bool:
        """Write what is kept; True when nothing is left (the database can be written). With
        nothing kept, a small write of its own tells whether the disk has room again."""
        if self.problem is None and not self._kept_rows and not self._kept_log:
            return True
        try:
            self._write_kept(None)
        except StoreUnavailable:
            return False
        return True

    async def retry(self, interval_s: float) -> None:
        """Forever: every ``interval_s``, write what is kept (nothing happens while all is written)."""
        while True:
            await asyncio.sleep(interval_s)
            self.flush()

    def _write_kept(self, dep: Deployment | None) -> None:
        with self.transaction() as conn:
            self._write_kept_in(conn)
            if dep is not None:
                self._save(conn, dep)
            elif self.problem is not None:
                conn.execute(_PROBE, (str(time.time()),))
        self._written()

    def _write_kept_in(self, conn: sqlite3.Connection) -> None:
        for kept in self._kept_rows.values():
            self._save(conn, kept)
        for sql, args in self._kept_log:
            conn.execute(sql, args)

    def _written(self) -> None:
        """A write went through: what was kept is on disk now."""
        kept = len(self._kept_rows) + len(self._kept_log)
        self._kept_rows.clear()
        self._kept_log.clear()
        if self.problem is not None:
            lost = f"; {self._lost_log} event rows were dropped meanwhile" if self._lost_log else ""
            log.warning("the database %s can be written again: wrote the %d changes kept%s", self.path, kept, lost)
            self.problem, self._lost_log = None, 0

    def _log_row(self, sql: str, args: Any) -> None:
        self._kept_log.append((sql, args))
        if not self.flush() and len(self._kept_log) > KEPT_LOG_ROWS:
            self._kept_log.popleft()  # the newest are kept
            self._lost_log += 1

    # --- schema -------------------------------------------------------------------------------

    def migrate(self, upto: int | None = None) -> list[int]:
        """Apply every migration not yet recorded, each in its own transaction, then fill columns."""
        with self.transaction() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(number INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
        done = self.applied_migrations()
        newest_known = max((m.number for m in MIGRATIONS), default=0)
        if done and max(done) > newest_known:
            raise StoreError(
                f"database {self.path} is at schema migration {max(done)}, newer than this dgxmm "
                f"knows ({newest_known}): upgrade dgxmm or use another data directory"
            )
        applied = []
        for migration in sorted(MIGRATIONS, key=lambda m: m.number):
            if migration.number in done or (upto is not None and migration.number > upto):
                continue
            with self.transaction() as conn:
                migration.apply(conn)
                conn.execute(
                    "INSERT INTO schema_migrations (number, name, applied_at) VALUES (?, ?, ?)",
                    (migration.number, migration.name, time.time()),
                )
            applied.append(migration)
        added: list[str] = []
        if upto is None:
            with self.transaction() as conn:
                added = add_missing_columns(conn)
        self._log_schema_change(fresh=not done, applied=applied, added=added)
        return [migration.number for migration in applied]

    def _log_schema_change(self, *, fresh: bool, applied: list[Migration], added: list[str]) -> None:
        """One line for what happened to the schema, none when nothing did. A new database is
        built by running every migration and filling the columns the base schema lacks: that is
        one event for an operator ("created"), not a list of steps."""
        if fresh and applied:
            log.info("created database %s (schema migration %d)", self.path, applied[-1].number)
            return
        parts = [f"applied migration {m.number} ({m.name})" for m in applied]
        if added:
            parts.append("added missing columns " + ", ".join(added))
        if parts:
            log.info("upgraded database %s: %s", self.path, "; ".join(parts))

    def applied_migrations(self) -> set[int]:
        return {row[0] for row in self._conn.execute("SELECT number FROM schema_migrations")}

    # --- host ---------------------------------------------------------------------------------

    def instance_id(self) -> str:
        """This dgxmm's generated instance id (migration 41 draws it once)."""
        row = self._conn.execute("SELECT value FROM host WHERE key = 'instance_id'").fetchone()
        if row is None:
            raise StoreError(f"database {self.path} has no instance id: migration 41 did not run")
        return str(row[0])

    # --- deployments --------------------------------------------------------------------------

    def load_deployments(self) -> list[Deployment]:
        rows = self._conn.execute("SELECT * FROM deployments ORDER BY created_at, id").fetchall()
        return [deployment_of(row) for row in rows]

    @staticmethod
    def _save(conn: sqlite3.Connection, dep: Deployment) -> None:
        """Insert or replace the whole row, inside the caller's transaction."""
        values = row_of(dep)
        names = ", ".join(DEPLOYMENT_COLUMNS)
        marks = ", ".join("?" for _ in DEPLOYMENT_COLUMNS)
        conn.execute(f"INSERT OR REPLACE INTO deployments ({names}) VALUES ({marks})", values)

    # --- measured memory ----------------------------------------------------------------------

    def memory_peaks(self) -> dict[tuple[str, str], int]:
        """(deployment id, configuration) -> the highest memory its engine was measured at."""
        rows = self._conn.execute("SELECT deployment_id, config, peak_bytes FROM memory_peaks").fetchall()
        return {(row[0], row[1]): int(row[2]) for row in rows}

    def put_memory_peak(self, deployment_id: str, config: str, peak_bytes: int) -> None:
        """Keep a new peak (written later when the database cannot be written now)."""
        self._log_row(_PEAK, (deployment_id, config, peak_bytes, time.time()))

    # --- caller keys (gateway/callerkeys.py owns them; here they are kept) ------------------

    def load_caller_keys(self) -> list[dict[str, Any]]:
        rows = self._conn.execute("SELECT * FROM caller_keys ORDER BY created_at, id").fetchall()
        return [{**dict(row), "models": load(row["models"])} for row in rows]

    def put_caller_key(self, row: dict[str, Any]) -> None:
        """Insert or replace a key's whole row; ``StoreUnavailable`` if the database cannot be
        written (the admin API's change is refused, nothing half done)."""
        names = ", ".join(CALLER_KEY_COLUMNS)
        marks = ", ".join(f":{name}" for name in CALLER_KEY_COLUMNS)
        with self.transaction() as conn:
            conn.execute(
                f"INSERT OR REPLACE INTO caller_keys ({names}) VALUES ({marks})",
                {**row, "models": dump(row["models"])},
            )

    def delete_caller_key(self, key_id: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM caller_keys WHERE id = ?", (key_id,))

    def put_caller_usage(self, rows: list[dict[str, Any]]) -> None:
        """Write the keys' usage counters (one transaction for all); ``StoreUnavailable`` when
        the database cannot be written: the caller keeps them for the next try."""
        with self.transaction() as conn:
            conn.executemany(CALLER_USAGE, rows)

    def load_admin_tokens(self) -> list[dict[str, Any]]:
        return [dict(row) for row in self._conn.execute("SELECT * FROM admin_tokens ORDER BY created_at, id")]

    def put_admin_token(self, row: dict[str, Any]) -> None:
        with self.transaction() as conn:
            conn.execute(
                "INSERT INTO admin_tokens (id, name, role, prefix, digest, created_at) "
                "VALUES (:id, :name, :role, :prefix, :digest, :created_at)",
                row,
            )

    def delete_admin_token(self, token_id: str) -> None:
        with self.transaction() as conn:
            conn.execute("DELETE FROM admin_tokens WHERE id = ?", (token_id,))

    # --- events and audit ---------------------------------------------------------------------

    def add_event(self, when: float, actor: str, deployment_id: str | None, text: str) -> None:
        """Write an event row (kept for later when the database cannot be written)."""
        self._log_row(_EVENT, (when, actor, deployment_id, text))

    def add_audit(self, row: dict[str, Any]) -> None:
        """Write an audit row (kept for later when the database cannot be written)."""
        self._log_row(_AUDIT, {**row, "old": dump(row.get("old")), "new": dump(row.get("new"))})

    def list_events(self, limit: int, deployment_id: str | None = None) -> list[dict[str, Any]]:
        where, args = ("WHERE deployment_id = ?", (deployment_id,)) if deployment_id else ("", ())
        rows = self._conn.execute(
            f"SELECT time, actor, deployment_id, text FROM events {where} ORDER BY seq DESC LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [dict(row) for row in reversed(rows)]

    def list_audit(self, limit: int, deployment_id: str | None = None) -> list[dict[str, Any]]:
        where, args = ("WHERE deployment_id = ?", (deployment_id,)) if deployment_id else ("", ())
        rows = self._conn.execute(
            "SELECT time, user, actor, action, deployment_id, old, new, text FROM audit "
            f"{where} ORDER BY seq DESC LIMIT ?",
            (*args, limit),
        ).fetchall()
        return [{**dict(row), "old": load(row["old"]), "new": load(row["new"])} for row in rows]


def read_deployments(path: Path) -> list[Deployment]:
    """The deployments of a database, read-only and without migrating it (``dgxmm check-config``
    and ``dgxmm export``); none when there is no database yet. ``StoreError`` when it cannot be
    read: a running dgxmm holds its database alone (``locking_mode=EXCLUSIVE``)."""
    if not path.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.2)) as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute("SELECT * FROM deployments ORDER BY created_at, id").fetchall()
            return [deployment_of(row) for row in rows]
    except (sqlite3.Error, KeyError) as exc:
        raise StoreError(f"cannot read {path}: {exc}") from None
