"""``dgxmm export``: every deployment as a ``[[deployments]]`` table ``check-config`` accepts,
so a host configured by hand can move to files. Only what differs from a create's defaults is
written (the name, engine, memory and mode always), values as TOML writes them."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from enum import Enum
from typing import Any

from dgxmm.api.schemas import DeploymentCreate
from dgxmm.declared.parse import FIELDS
from dgxmm.records.deployment import Deployment

ALWAYS = ("name", "engine", "memory_gib", "mode")
_BARE = re.compile(r"[A-Za-z0-9_-]+")


def fields_of(dep: Deployment) -> dict[str, Any]:
    """A deployment's settings as a table holds them."""
    return dep.model_dump(include=set(FIELDS)) | {"mode": dep.effective_mode}


def fields_of_view(view: dict[str, Any]) -> dict[str, Any]:
    """The same from the API's view (``gpu_ids`` there is where it runs; its pins are ``gpu_pins``)."""
    return {key: view[key] for key in FIELDS if key in view} | {"gpu_ids": view.get("gpu_pins")}


def table(fields: dict[str, Any]) -> str:
    lines = ["[[deployments]]"]
    for key in DeploymentCreate.model_fields:
        value = fields.get(key)
        default = DeploymentCreate.model_fields[key].get_default(call_default_factory=True)
        if key == "served_name" and value == fields["name"]:
            continue
        if value is None or (key not in ALWAYS and value == default):
            continue
        lines.append(f"{key} = {value_of(value)}")
    return "\n".join(lines) + "\n"


def to_toml(deployments: Iterable[dict[str, Any]]) -> str:
    return "\n".join(table(fields) for fields in deployments)


def value_of(value: Any) -> str:
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} has no TOML form here")
        return repr(value)
    if isinstance(value, str):
        return string(value)
    if isinstance(value, list):
        return "[" + ", ".join(value_of(item) for item in value) + "]"
    if isinstance(value, dict):
        items = (f"{key if _BARE.fullmatch(key) else string(key)} = {value_of(v)}" for key, v in value.items())
        return "{ " + ", ".join(items) + " }" if value else "{}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but for DEL, which TOML wants escaped."""
    return json.dumps(text).replace("\x7f", "\\u007f")
