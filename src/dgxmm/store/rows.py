"""How the store's records are kept as rows: the columns of a deployment and of a caller key,
the values kept as JSON text, and a deployment to its row and back (the row's integers made the
record's booleans again). The one place that knows the tables' shape, apart from the migrations
that build them (``migrations``)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from dgxmm.records.deployment import Deployment

_JSON_COLUMNS = (
    "sleep_level",  # 1, 2 or "kv": JSON keeps the number a number
    "args",
    "command",
    "env",
    "runtime_handle",
    "volumes",
    "memory_limit",
    "aliases",
    "gpu_ids",
    "placed_on",
    "request_defaults",
    "request_overrides",
    "strip_params",
    "capabilities",
)
DEPLOYMENT_COLUMNS = (
    "id",
    "name",
    "served_name",
    "engine",
    "model",
    "image",
    "args",
    "command",
    "env",
    "memory_gib",
    "role",
    "mode",
    "idle_timeout_s",
    "pending_mode",
    "sleep_mode",
    "sleep_level",
    "health_path",
    "metrics_path",
    "state",
    "state_reason",
    "runtime_handle",
    "created_at",
    "updated_at",
    "state_changed_at",
    "gpus",
    "volumes",
    "shm_size",
    "memory_limit",
    "upstream_max_connections",
    "aliases",
    "preload",
    "gpu_ids",
    "placed_on",
    "managed_by",
    "declared_in",
    "max_concurrent",
    "model_path",
    "request_defaults",
    "request_overrides",
    "strip_params",
    "capabilities",
)
_CALLER_USAGE_COLUMNS = (
    "day",
    "today_requests",
    "today_prompt_tokens",
    "today_completion_tokens",
    "today_errors",
    "total_requests",
    "total_prompt_tokens",
    "total_completion_tokens",
    "total_errors",
    "last_used_at",
)
CALLER_KEY_COLUMNS = (
    "id",
    "name",
    "prefix",
    "digest",
    "models",
    "expires_at",
    "max_concurrent",
    "tokens_per_day",
    "keep_alive",
    "progress",
    "priority",
    "created_at",
    *_CALLER_USAGE_COLUMNS,
)
CALLER_USAGE = (
    "UPDATE caller_keys SET " + ", ".join(f"{name} = :{name}" for name in _CALLER_USAGE_COLUMNS) + " WHERE id = :id"
)


def dump(value: Any) -> str | None:
    """A JSON column's text (None stays NULL)."""
    return None if value is None else json.dumps(value)


def load(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def row_of(dep: Deployment) -> tuple[Any, ...]:
    """The values of ``DEPLOYMENT_COLUMNS`` for ``dep``, in that order."""
    data = dep.model_dump(mode="json")
    data["sleep_mode"] = int(dep.sleep_mode)
    data["preload"] = int(dep.preload)
    return tuple(dump(data[name]) if name in _JSON_COLUMNS else data[name] for name in DEPLOYMENT_COLUMNS)


def deployment_of(row: sqlite3.Row) -> Deployment:
    data = {name: row[name] for name in row.keys() if name in DEPLOYMENT_COLUMNS}
    for name in _JSON_COLUMNS:
        data[name] = load(data[name])
    data["sleep_mode"] = bool(data["sleep_mode"])
    data["preload"] = bool(data["preload"])
    data["gpus"] = None if data["gpus"] is None else int(data["gpus"])  # (1 and 0: "all GPUs" or none, before)
    return Deployment.model_validate(data)
