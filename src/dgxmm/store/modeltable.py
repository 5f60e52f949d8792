"""The ``models`` table (migration 45): one row per model the model store pulled or is pulling.
Rows are plain dicts (``modelstore.record.ModelRecord.row``): the store knows no layer above it."""

from __future__ import annotations

from typing import Any

from dgxmm.store.db import Store

_COLUMNS = (
    "id",
    "repo",
    "revision",
    "include",
    "commit_hash",
    "status",
    "files",
    "path",
    "error",
    "bytes_done",
    "created_at",
    "updated_at",
)
_PUT = f"INSERT OR REPLACE INTO models ({', '.join(_COLUMNS)}) VALUES ({', '.join(':' + name for name in _COLUMNS)})"


def put_model(store: Store, row: dict[str, Any]) -> None:
    """Write the row; ``StoreUnavailable`` when the database cannot be written."""
    with store.transaction() as conn:
        conn.execute(_PUT, {name: row[name] for name in _COLUMNS})


def delete_model(store: Store, model_id: str) -> None:
    with store.transaction() as conn:
        conn.execute("DELETE FROM models WHERE id = ?", (model_id,))


def load_models(store: Store) -> list[dict[str, Any]]:
    with store.transaction() as conn:
        rows = conn.execute("SELECT * FROM models ORDER BY created_at, id").fetchall()
    return [dict(row) for row in rows]
