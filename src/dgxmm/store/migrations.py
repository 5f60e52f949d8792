"""Numbered schema migrations and the canonical column list ``add_missing_columns`` enforces.

Numbers are never reused. Migration 40 is the spec's "deployments: on-demand mode"; the numbers in
between are free for future steps that must land before it in older branches.
"""

from __future__ import annotations

import re
import secrets
import socket
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Migration:
    number: int
    name: str
    apply: Callable[[sqlite3.Connection], None]


def _base_schema(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE IF NOT EXISTS deployments (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            served_name TEXT NOT NULL,
            engine TEXT NOT NULL,
            model TEXT NOT NULL DEFAULT '',
            image TEXT,
            args TEXT NOT NULL DEFAULT '[]',
            command TEXT,
            env TEXT NOT NULL DEFAULT '{}',
            memory_gib REAL NOT NULL,
            role TEXT NOT NULL DEFAULT 'model',
            state TEXT NOT NULL DEFAULT 'stopped',
            state_reason TEXT NOT NULL DEFAULT '',
            runtime_handle TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )"""
    )
    conn.execute(
        """CREATE TABLE IF NOT EXISTS events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            time REAL NOT NULL,
            actor TEXT NOT NULL,
            deployment_id TEXT,
            text TEXT NOT NULL
        )"""
    )
    conn.execute(
        """CREATE TABLE IF NOT EXISTS audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            time REAL NOT NULL,
            user TEXT,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            deployment_id TEXT,
            old TEXT,
            new TEXT,
            text TEXT NOT NULL DEFAULT ''
        )"""
    )


def _ondemand_mode(conn: sqlite3.Connection) -> None:
    """Existing deployments keep their behaviour: every row is always_on after this step."""
    present = _columns(conn, "deployments")
    if "mode" not in present:
        conn.execute("ALTER TABLE deployments ADD COLUMN mode TEXT")
    if "idle_timeout_s" not in present:
        conn.execute("ALTER TABLE deployments ADD COLUMN idle_timeout_s REAL")
    conn.execute("UPDATE deployments SET mode = 'always_on'")


def _devices(conn: sqlite3.Connection) -> None:
    """A deployment's pins and where its engine was placed (issue 35). ``gpus`` keeps its column:
    its old values read as 1 (all GPUs, for a container) and 0 (none), which is what they meant."""
    present = _columns(conn, "deployments")
    for name in ("gpu_ids", "placed_on"):
        if name not in present:
            conn.execute(f"ALTER TABLE deployments ADD COLUMN {name} TEXT")


def _ownership(conn: sqlite3.Connection) -> None:
    """Who owns a deployment's settings (issue 39): every existing row was made through the API."""
    present = _columns(conn, "deployments")
    if "managed_by" not in present:
        conn.execute("ALTER TABLE deployments ADD COLUMN managed_by TEXT NOT NULL DEFAULT 'api'")
    if "declared_in" not in present:
        conn.execute("ALTER TABLE deployments ADD COLUMN declared_in TEXT")


def _max_concurrent(conn: sqlite3.Connection) -> None:
    """A deployment's limit of requests in flight through dgxmm (issue 37 item 2): NULL, no limit,
    for every existing row."""
    if "max_concurrent" not in _columns(conn, "deployments"):
        conn.execute("ALTER TABLE deployments ADD COLUMN max_concurrent INTEGER")


def new_instance_id() -> str:
    """A readable, unique default: this machine's short host name and 8 random hex digits."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0]).strip(".-_")[:40]
    suffix = secrets.token_hex(4)
    return f"{host}-{suffix}" if host else f"dgxmm-{suffix}"


def _host_identity(conn: sqlite3.Connection) -> None:
    """The instance id is drawn once, here, and never changes with the database: every LiteLLM
    entry this dgxmm writes is marked with it, so it must survive restarts and upgrades."""
    conn.execute("CREATE TABLE IF NOT EXISTS host (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT OR IGNORE INTO host (key, value) VALUES ('instance_id', ?)", (new_instance_id(),))


def _memory_peaks(conn: sqlite3.Connection) -> None:
    """The highest memory each deployment's engine was measured at, per configuration: what a
    ``memory_gib`` suggestion starts from (deploy/measured.py)."""
    conn.execute(
        """CREATE TABLE IF NOT EXISTS memory_peaks (
            deployment_id TEXT NOT NULL,
            config TEXT NOT NULL,
            peak_bytes INTEGER NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (deployment_id, config)
        )"""
    )


def _caller_keys(conn: sqlite3.Connection) -> None:
    """Caller keys (issue 37, gateway/callerkeys.py): a SHA-256 digest of each secret, never the
    secret, with the key's limits and its usage today and in total; and the admin API's
    read-only tokens (api/tokens.py), digests too."""
    conn.execute(
        """CREATE TABLE IF NOT EXISTS admin_tokens (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            role TEXT NOT NULL,
            prefix TEXT NOT NULL,
            digest TEXT NOT NULL UNIQUE,
            created_at REAL NOT NULL
        )"""
    )
    conn.execute(
        """CREATE TABLE IF NOT EXISTS caller_keys (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL UNIQUE,
            prefix TEXT NOT NULL,
            digest TEXT NOT NULL UNIQUE,
            models TEXT,
            expires_at REAL,
            max_concurrent INTEGER,
            tokens_per_day INTEGER,
            created_at REAL NOT NULL,
            day TEXT NOT NULL DEFAULT '',
            today_requests INTEGER NOT NULL DEFAULT 0,
            today_prompt_tokens INTEGER NOT NULL DEFAULT 0,
            today_completion_tokens INTEGER NOT NULL DEFAULT 0,
            total_requests INTEGER NOT NULL DEFAULT 0,
            total_prompt_tokens INTEGER NOT NULL DEFAULT 0,
            total_completion_tokens INTEGER NOT NULL DEFAULT 0,
            last_used_at REAL
        )"""
    )


def _models(conn: sqlite3.Connection) -> None:
    """Models pulled from a hub (modelstore/): what was asked, what the hub listed, the status."""
    conn.execute(
        """CREATE TABLE IF NOT EXISTS models (
            id TEXT PRIMARY KEY,
            repo TEXT NOT NULL,
            revision TEXT NOT NULL,
            include TEXT NOT NULL DEFAULT '[]',
            commit_hash TEXT,
            status TEXT NOT NULL,
            files TEXT NOT NULL DEFAULT '[]',
            path TEXT,
            error TEXT,
            bytes_done INTEGER NOT NULL DEFAULT 0,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )"""
    )


def _model_path(conn: sqlite3.Connection) -> None:
    """The local path of a model a hub names (issue 38): none is known for existing rows, which
    all name local paths."""
    if "model_path" not in _columns(conn, "deployments"):
        conn.execute("ALTER TABLE deployments ADD COLUMN model_path TEXT")


def _request_params(conn: sqlite3.Connection) -> None:
    """A deployment's request parameters (issue 51 item 4): none for every existing row."""
    present = _columns(conn, "deployments")
    for name, empty in (("request_defaults", "{}"), ("request_overrides", "{}"), ("strip_params", "[]")):
        if name not in present:
            conn.execute(f"ALTER TABLE deployments ADD COLUMN {name} TEXT NOT NULL DEFAULT '{empty}'")


def _sleep_level(conn: sqlite3.Connection) -> None:
    """A deployment's sleep level (issue 52 item 2): none (the host's default) for existing rows."""
    if "sleep_level" not in _columns(conn, "deployments"):
        conn.execute("ALTER TABLE deployments ADD COLUMN sleep_level TEXT")


def _capabilities(conn: sqlite3.Connection) -> None:
    """What a model can do, said by its deployment (issue 49 item 3): nothing for existing rows
    (their files say it)."""
    if "capabilities" not in _columns(conn, "deployments"):
        conn.execute("ALTER TABLE deployments ADD COLUMN capabilities TEXT NOT NULL DEFAULT '[]'")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "base schema: deployments, events, audit", _base_schema),
    Migration(40, "deployments: on-demand mode", _ondemand_mode),
    Migration(41, "host: instance id", _host_identity),
    Migration(42, "memory peaks", _memory_peaks),
    Migration(43, "deployments: devices (gpu_ids, placed_on)", _devices),
    Migration(44, "caller keys, viewer tokens", _caller_keys),
    Migration(45, "models pulled from a hub", _models),
    Migration(46, "deployments: ownership (managed_by, declared_in)", _ownership),
    Migration(47, "deployments: max_concurrent", _max_concurrent),
    Migration(48, "deployments: model_path of hub models", _model_path),
    Migration(49, "deployments: request parameters", _request_params),
    Migration(50, "deployments: sleep_level", _sleep_level),
    Migration(51, "deployments: capabilities", _capabilities),
)

# Columns every table must have, with the definition used to add one an older database lacks.
COLUMNS: dict[str, dict[str, str]] = {
    "deployments": {
        "mode": "TEXT",
        "idle_timeout_s": "REAL",
        "pending_mode": "TEXT",
        "sleep_mode": "INTEGER NOT NULL DEFAULT 0",
        "sleep_level": "TEXT",
        "health_path": "TEXT",
        "metrics_path": "TEXT",
        "state_changed_at": "REAL NOT NULL DEFAULT 0",
        "gpus": "INTEGER",
        "volumes": "TEXT NOT NULL DEFAULT '[]'",
        "shm_size": "TEXT",
        "memory_limit": "TEXT",
        "upstream_max_connections": "INTEGER",
        "aliases": "TEXT NOT NULL DEFAULT '[]'",
        "preload": "INTEGER NOT NULL DEFAULT 0",
        "gpu_ids": "TEXT",
        "placed_on": "TEXT",
        "managed_by": "TEXT NOT NULL DEFAULT 'api'",
        "declared_in": "TEXT",
        "max_concurrent": "INTEGER",
        "model_path": "TEXT",
        "request_defaults": "TEXT NOT NULL DEFAULT '{}'",
        "request_overrides": "TEXT NOT NULL DEFAULT '{}'",
        "strip_params": "TEXT NOT NULL DEFAULT '[]'",
        "capabilities": "TEXT NOT NULL DEFAULT '[]'",
    },
    "events": {},
    "audit": {},
    "memory_peaks": {},
    "models": {},
    "caller_keys": {
        "today_errors": "INTEGER NOT NULL DEFAULT 0",
        "total_errors": "INTEGER NOT NULL DEFAULT 0",
        "keep_alive": "INTEGER NOT NULL DEFAULT 1",
        "progress": "TEXT NOT NULL DEFAULT 'off'",  # issue 59: a wait's lines as reasoning
        "priority": "INTEGER NOT NULL DEFAULT 0",
    },
    "admin_tokens": {},
}


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def add_missing_columns(conn: sqlite3.Connection) -> list[str]:
    """Add each canonical column a table lacks; returns ``table.column`` for every one added."""
    added = []
    for table, columns in COLUMNS.items():
        present = _columns(conn, table)
        for name, definition in columns.items():
            if name not in present:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {definition}")
                added.append(f"{table}.{name}")
    return added
