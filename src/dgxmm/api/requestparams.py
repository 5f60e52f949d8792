"""The bounds of a deployment's request parameters (``request_defaults``, ``request_overrides``,
``strip_params``), checked where a deployment's settings are (``schemas``), so that the gateway
applies them to every body without a check of its own (gateway/bodyparams.py).

``model`` and ``stream`` are not parameters: the router picks the deployment by the one and the
gateway answers by the other before the body is rewritten. A name is in one of the three at
most (which would win is no question then). A value is any JSON but null, which TOML cannot
write (``dgxmm export``): a parameter the engine is not to get is stripped instead.
"""

from __future__ import annotations

import json
from typing import Any

RESERVED = frozenset({"model", "stream"})
MAX_PARAMS = 64  # names in all three together
MAX_NAME = 256  # characters of a name
MAX_VALUE_BYTES = 64 * 1024  # the values together, as compact JSON


def check(defaults: dict[str, Any], overrides: dict[str, Any], strip: list[str]) -> None:
    """Raise ``ValueError`` (its text begins with the field) when the three are out of bounds."""
    seen: dict[str, str] = {}
    total = 0
    for field, names in (("request_defaults", defaults), ("request_overrides", overrides), ("strip_params", strip)):
        for name in names:
            if name in RESERVED:
                raise ValueError(f"{field}: {name!r} is the gateway's to read, not a parameter")
            if not name or len(name) > MAX_NAME or not name.isprintable():
                raise ValueError(f"{field}: a name must be 1-{MAX_NAME} printable characters")
            if name in seen:
                raise ValueError(f"{field}: {name!r} is in {seen[name]} already")
            seen[name] = field
        if isinstance(names, dict):
            for name, value in names.items():
                if _has_null(value):
                    raise ValueError(f"{field}: {name}: null has no TOML form; strip_params removes a parameter")
                try:
                    total += len(json.dumps(value, separators=(",", ":"), allow_nan=False))
                except ValueError:
                    raise ValueError(f"{field}: {name}: not a finite number") from None
    if len(seen) > MAX_PARAMS:
        raise ValueError(f"strip_params: at most {MAX_PARAMS} parameters in all")
    if total > MAX_VALUE_BYTES:
        raise ValueError(f"request_overrides: the values are longer than {MAX_VALUE_BYTES} bytes together")


def _has_null(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(_has_null(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_null(v) for v in value)
    return False
