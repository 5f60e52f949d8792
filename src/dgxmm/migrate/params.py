"""Request parameters an import carries into a deployment's ``request_defaults``,
``request_overrides`` and ``strip_params`` (issue 51 item 4; gateway/bodyparams.py applies them):
llama-swap's ``filters`` and the sampling defaults of Ollama's parameters layer.

llama-swap strips ``stripParams`` and then sets ``setParams``: a name in both is set, so it is an
override here (a name is in one of dgxmm's three at most), and ``model`` is never stripped there
either. Ollama's parameters are defaults a request's own options win over; the sampling ones are
named as llama-server reads them in an OpenAI body, the others (threads, GPU layers, the context:
``num_ctx`` is ``-c``) are the engine's flags, not a request's.
"""

from __future__ import annotations

import json
from typing import Any

from dgxmm.api import requestparams
from dgxmm.migrate.report import Imported
from dgxmm.migrate.swapconfig import ConfigProblem

# Ollama's sampling parameters llama-server reads under the same name in an OpenAI body.
SAMPLING = frozenset(
    {
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "typical_p",
        "repeat_penalty",
        "repeat_last_n",
        "presence_penalty",
        "frequency_penalty",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "seed",
        "stop",
    }
)
RENAMED = {"num_keep": "n_keep"}  # an Ollama parameter llama-server reads by another name


def swap_filters(entry: Imported, filters: Any, fields: dict[str, Any]) -> None:
    """llama-swap's ``filters``: ``stripParams`` (a comma-separated list) as ``strip_params``,
    ``setParams`` (a mapping) as ``request_overrides``; ``setParamsByID`` has no counterpart."""
    if filters is None:
        return
    if not isinstance(filters, dict):
        raise ConfigProblem("filters: must be a mapping")
    setting = filters.get("setParams") or {}
    if not isinstance(setting, dict):
        raise ConfigProblem("filters.setParams: must be a mapping")
    overrides: dict[str, Any] = {}
    for name, value in setting.items():
        if str(name) in requestparams.RESERVED:
            entry.drop(f"filters.setParams: {name}: the gateway's to read, not a parameter")
        elif value is None:
            entry.drop(f"filters.setParams: {name}: null (strip_params removes a parameter)")
        else:
            overrides[str(name)] = value
    text = filters.get("stripParams") or ""
    if not isinstance(text, str):
        raise ConfigProblem("filters.stripParams: must be a comma-separated string")
    listed = [name.strip() for name in text.split(",") if name.strip()]
    strip = [name for name in dict.fromkeys(listed) if name not in overrides and name != "model"]
    try:
        checked(fields, {}, overrides, strip)
    except ValueError as exc:
        raise ConfigProblem(f"filters: {exc}") from None
    if strip:
        entry.carry(f"filters.stripParams: strip_params = {', '.join(strip)}")
    if overrides:
        entry.carry(f"filters.setParams: request_overrides = {', '.join(overrides)} (set whatever the client sent)")
    for key in filters:
        if key not in ("stripParams", "setParams"):
            why = "a request by another name with other parameters: declare it as a deployment of its own"
            entry.drop(f"filters.{key}: {why if key == 'setParamsByID' else 'not a filter of llama-swap v250'}")


def ollama_params(entry: Imported, params: dict[str, Any], fields: dict[str, Any]) -> None:
    """The sampling defaults of Ollama's parameters layer (``num_ctx`` taken already) as
    ``request_defaults``; ``num_predict`` as ``max_tokens`` when it is a positive count.
    ``ValueError`` when they are out of a deployment's bounds."""
    defaults: dict[str, Any] = {}
    for key, value in params.items():
        shown = f"{key} = {json.dumps(value)[:80]}"
        if key in SAMPLING or key in RENAMED:
            defaults[RENAMED.get(key, key)] = value
        elif key == "num_predict" and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            defaults["max_tokens"] = value
        else:
            entry.drop(f"parameters: {shown}: not a request parameter llama-server reads (an engine flag, if any)")
            continue
        entry.carry(f"parameters: {shown} as a request default")
    checked(fields, defaults, {}, [])


def checked(fields: dict[str, Any], defaults: dict[str, Any], overrides: dict[str, Any], strip: list[str]) -> None:
    """Set the three in ``fields`` when they pass a deployment's bounds (``ValueError``, why
    not: the model is not imported)."""
    requestparams.check(defaults, overrides, strip)
    for name, value in (("request_defaults", defaults), ("request_overrides", overrides), ("strip_params", strip)):
        if value:
            fields[name] = value
