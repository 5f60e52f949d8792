"""``dgxmm import llama-swap``: each model of a llama-swap config as a declared deployment.

A model's ``cmd`` says the engine: ``llama-server`` a ``llamacpp`` deployment (its ``-m`` the
model, its other flags ``args``, less the ``--port``, ``--host`` and ``--alias`` dgxmm gives),
``vllm serve`` a ``vllm`` one, anything else (``llama-server -hf``, which fetches its own model,
included) a ``command`` deployment with ``${PORT}`` as ``{port}``. Every llama-swap model starts
on demand, so every deployment is ``on_demand``; its ``ttl`` (or ``globalTTL``) becomes the idle
timeout (0, llama-swap's default, never unloaded for idleness: ``idle_timeout_s = 0``), its
``filters`` the request parameters (``migrate.params``). ``memory_gib``, which llama-swap never
needs, is estimated from a GGUF's header (as ``dgxmm estimate``) or else written as a
placeholder, and the file says which.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dgxmm.deploy.estimate import estimate
from dgxmm.deploy.ggufheader import NotAModel
from dgxmm.migrate.params import swap_filters
from dgxmm.migrate.report import GUESS_GIB, Imported, Report, deployment_name
from dgxmm.migrate.swapconfig import (
    MAX_MODELS,
    PORT,
    Budget,
    ConfigProblem,
    Expander,
    load,
    macros_of,
    split_command,
    strip_comments,
)

FILE_NAME = "llama-swap.toml"
# Top-level keys and why each is not carried, or how it is (those handled below are not here).
TOP_NOTES = {
    "healthCheckTimeout": "dgxmm waits for an engine's health by its own start deadline",
    "logLevel": "dgxmm's is [server] log_level",
    "logTimeFormat": "dgxmm's log lines carry their time ([server] log_format)",
    "logToStdout": "engine output goes to <data_dir>/logs/<id>.log",
    "metricsMaxInMemory": "dgxmm keeps [activity] keep records",
    "captureBuffer": "dgxmm does not capture request bodies",
    "store": "dgxmm's activity log is [activity] file",
    "ui": "dgxmm has its own console",
    "performance": "dgxmm samples its engines itself",
    "startPort": "used for nothing: dgxmm gives each engine a free port",
    "sendLoadingState": "dgxmm's cold starts queue the request instead",
    "includeAliasesInList": "dgxmm's /v1/models lists served names",
    "globalTTL": "read as the idle timeout of models with ttl -1",
    "unloadTimeout": "dgxmm stops an engine with its own grace",
    "macros": "expanded into every model",
    "upstream": "dgxmm has no /upstream passthrough",
    "profiles": "no counterpart: give the model an alias instead",
    "selectors": "no counterpart: dgxmm routes by served name and alias",
    "peers": "no counterpart: dgxmm serves this host's engines only",
    "groups": "dropped: dgxmm fits models by measured memory, no groups needed",
    "routing": "dropped (groups, matrix, scheduler): dgxmm fits models by measured memory",
    "hooks": "on_startup.preload read as each model's preload",
    "apiKeys": "never written out: give callers dgxmm caller keys (docs/gateway.md)",
}
# A model's keys that have no counterpart, and why.
MODEL_NOTES = {
    "name": "a display name: dgxmm shows the served name",
    "description": "dgxmm has no description field",
    "unlisted": "dgxmm lists every deployment in /v1/models",
    "metadata": "dgxmm's /v1/models carries no metadata",
    "capabilities": "dgxmm's /v1/models carries no capabilities",
    "timeouts": "dgxmm's upstream timeouts are [ondemand] upstream_*",
    "unloadTimeout": "dgxmm stops an engine with its own grace",
    "sendLoadingState": "dgxmm's cold starts queue the request instead",
    "compat": "no counterpart",
    "cmdStop": "dgxmm stops the process it started (SIGTERM, then SIGKILL)",
}
MAPPED = {
    "cmd",
    "proxy",
    "aliases",
    "useModelName",
    "ttl",
    "env",
    "macros",
    "concurrencyLimit",
    "checkEndpoint",
    "filters",
}
_DROP_WITH_VALUE = {"--port", "--host", "-a", "--alias"}  # llama-server flags dgxmm sets itself
_VLLM_DROP = {"--port", "--host", "--served-model-name"}


def run(path: Path, idle_bounds: tuple[float, float], env: dict[str, str] | None = None) -> Report:
    """Read the config at ``path`` and map every model (blocking: a file and GGUF headers)."""
    config = load(path)
    report = Report(f"llama-swap {path}")
    models = config.get("models")
    if not isinstance(models, dict) or not models:
        raise ConfigProblem(f"{path}: no models")
    if len(models) > MAX_MODELS:
        raise ConfigProblem(f"{path}: more than {MAX_MODELS} models")
    budget = Budget()
    macros = macros_of(config.get("macros"), "macros")
    ttl = config.get("globalTTL", 0)
    preload = _preloaded(config.get("hooks"))
    taken: set[str] = set()
    for model_id, model in models.items():
        entry = Imported(str(model_id))
        report.models.append(entry)
        try:
            if not isinstance(model, dict):
                raise ConfigProblem("a model must be a mapping")
            own = macros_of(model.get("macros"), "macros")
            # Only what is mapped is expanded: the rest is reported by its key alone.
            used = {key: value for key, value in model.items() if key in MAPPED and key != "macros"}
            if isinstance(used.get("cmd"), str):
                used["cmd"] = strip_comments(used["cmd"])
            expander = Expander(str(model_id), macros | own, env, budget)
            expanded = model | expander.expand(used)
            entry.fields = _model(entry, str(model_id), expanded, ttl, idle_bounds, path.parent)
            if expander.env_used:
                entry.carry(f"${{env.*}}: the values of {', '.join(expander.env_used)} now, written into the file")
        except ConfigProblem as exc:
            entry.skipped = str(exc)
            continue
        entry.fields["name"] = deployment_name(str(model_id), taken)
        entry.fields["preload"] = str(model_id) in preload
        if entry.fields["preload"]:
            entry.carry("hooks.on_startup.preload: preload = true")
    for key, value in config.items():
        if key == "models":
            continue
        note = TOP_NOTES.get(key, "not a key of llama-swap v250's format")
        if key == "apiKeys" and isinstance(value, list):
            note = f"{len(value)} keys {note}"
        report.top.append(f"{key}: {note}")
    return report


def _preloaded(hooks: Any) -> set[str]:
    start = hooks.get("on_startup") if isinstance(hooks, dict) else None
    names = start.get("preload") if isinstance(start, dict) else None
    return {str(name) for name in names} if isinstance(names, list) else set()


def _model(
    entry: Imported, model_id: str, model: dict[str, Any], global_ttl: Any, bounds: tuple[float, float], base: Path
) -> dict[str, Any]:
    cmd = model.get("cmd")
    if not isinstance(cmd, str):
        raise ConfigProblem("cmd: required (a string)")
    argv = split_command(cmd)
    fields: dict[str, Any] = {"served_name": model_id, "mode": "on_demand"}
    program = os.path.basename(argv[0])
    hub = any(arg in ("-hf", "--hf-repo") or arg.startswith("--hf-repo=") for arg in argv)
    if program.startswith("llama-server") and not hub:
        _llamacpp(entry, argv, fields, base)
    elif program == "vllm" and argv[1:2] == ["serve"]:
        _vllm(entry, argv, fields)
    else:
        _command(entry, argv, fields, model.get("proxy"))
        if hub:
            entry.carry("cmd: llama-server -hf fetches its own model, as under llama-swap: a command deployment")
    aliases = model.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ConfigProblem("aliases: must be a list of names")
    fields["aliases"] = [a for a in aliases if a != model_id]
    if aliases:
        entry.carry(f"aliases: {', '.join(aliases)}")
    served = model.get("useModelName")
    if isinstance(served, str) and served and served != model_id:
        fields["served_name"] = served
        fields["aliases"] = [model_id] + [a for a in fields["aliases"] if a != served]
        entry.carry(f"useModelName: the served name is {served!r}; {model_id!r} an alias, renamed to it on the way")
    _ttl(entry, model.get("ttl", -1), global_ttl, bounds, fields)
    _env(entry, model.get("env"), fields)
    _concurrency(entry, model.get("concurrencyLimit"), fields)
    _check_endpoint(entry, model.get("checkEndpoint"), fields)
    swap_filters(entry, model.get("filters"), fields)
    for key in model:
        if key in MODEL_NOTES:
            entry.drop(f"{key}: {MODEL_NOTES[key]}")
        elif key not in MAPPED:
            entry.drop(f"{key}: not a model key of llama-swap v250's format")
    return fields


def _llamacpp(entry: Imported, argv: list[str], fields: dict[str, Any], base: Path) -> None:
    args: list[str] = []
    model = ""
    words = iter(argv[1:])
    for word in words:
        flag, eq, inline = word.partition("=")
        if flag in ("-m", "--model"):
            model = inline if eq else next(words, "")
        elif flag in _DROP_WITH_VALUE:
            if not eq:
                next(words, None)
        else:
            args.append(_escaped(word))
    if not model:
        raise ConfigProblem("cmd: llama-server without -m/--model or -hf")
    if not os.path.isabs(model):
        model = str((base / model).resolve())
        entry.carry(f"-m: the relative path read from the config's folder: {model}")
    if argv[0] != "llama-server":
        entry.drop(f"cmd: the program {argv[0]}: dgxmm runs [engines] llamacpp_bin (set it to this one)")
    fields.update(engine="llamacpp", model=model, args=args)
    entry.carry(f"cmd: llama-server, model {model}" + (f", args {' '.join(args)}" if args else ""))
    try:
        found = estimate(Path(model), [a.replace("{{", "{").replace("}}", "}") for a in args])
    except NotAModel as exc:
        fields["memory_gib"], entry.memory = GUESS_GIB, "guessed"
        entry.drop(f"memory_gib: not estimated ({exc}): a placeholder, set it")
        return
    fields["memory_gib"], entry.memory = found.suggested_gib, "estimated"
    entry.carry(f"memory_gib: {found.suggested_gib:g} estimated from the GGUF (context {found.context})")


def _vllm(entry: Imported, argv: list[str], fields: dict[str, Any]) -> None:
    rest = argv[2:]
    if not rest or rest[0].startswith("-"):
        raise ConfigProblem("cmd: vllm serve without a model")
    args: list[str] = []
    words = iter(rest[1:])
    for word in words:
        flag, eq, _ = word.partition("=")
        if flag in _VLLM_DROP:
            if not eq:
                next(words, None)
        else:
            args.append(_escaped(word))
    fields.update(engine="vllm", model=rest[0], args=args, memory_gib=GUESS_GIB)
    entry.memory = "guessed"
    entry.carry(f"cmd: vllm serve, model {rest[0]}" + (f", args {' '.join(args)}" if args else ""))
    entry.drop("memory_gib: vLLM takes what --gpu-memory-utilization gives it: a placeholder, set it")


def _command(entry: Imported, argv: list[str], fields: dict[str, Any], proxy: Any) -> None:
    command = [_escaped(word) for word in argv]
    port = _port_of(proxy)
    if port is not None and not any(PORT in word for word in argv):
        # A fixed port: dgxmm gives the port, so the argument naming it becomes {port}.
        # (the port alone, or as docker's -p HOST:CONTAINER names it)
        command = [("{port}" + word[len(str(port)) :] if _names_port(word, port) else word) for word in command]
        if "{port}" not in command:
            entry.drop(f"proxy: {proxy}: no argument of cmd is its port; make cmd listen on {{port}}")
    fields.update(engine="command", command=command, memory_gib=GUESS_GIB)
    entry.memory = "guessed"
    entry.carry(f"cmd: a command deployment: {' '.join(command)}")
    entry.drop("memory_gib: nothing says what this command holds: a placeholder, set it")
    if isinstance(proxy, str) and proxy:
        host = urlsplit(proxy).hostname
        if host not in ("localhost", "127.0.0.1", "::1", None):
            entry.drop(f"proxy: {proxy}: dgxmm reaches the engine it started on 127.0.0.1")


def _port_of(proxy: Any) -> int | None:
    """The fixed port of a ``proxy`` URL; None when it has none (or it is ``${PORT}``)."""
    try:
        return urlsplit(proxy).port if isinstance(proxy, str) else None
    except ValueError:
        return None


def _names_port(word: str, port: int) -> bool:
    return word == str(port) or word.startswith(f"{port}:")


def _escaped(word: str) -> str:
    """A word of cmd as a dgxmm argument: its braces literal, ``${PORT}`` as ``{port}``."""
    return "{port}".join(part.replace("{", "{{").replace("}", "}}") for part in word.split(PORT))


def _ttl(entry: Imported, ttl: Any, global_ttl: Any, bounds: tuple[float, float], fields: dict[str, Any]) -> None:
    if isinstance(ttl, bool) or not isinstance(ttl, int):
        raise ConfigProblem(f"ttl: {ttl!r} is not a number of seconds")
    seconds = global_ttl if ttl == -1 else ttl
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
        raise ConfigProblem(f"globalTTL: {seconds!r} is not a number of seconds")
    if seconds == 0:
        fields["idle_timeout_s"] = 0.0
        given = "ttl: 0" if ttl == 0 else "globalTTL: 0 (llama-swap's default)"
        entry.carry(f"{given} as idle_timeout_s = 0 (never stopped for idleness; make-room may stop it)")
        return
    low, high = bounds
    fields["idle_timeout_s"] = float(min(max(seconds, low), high))
    if fields["idle_timeout_s"] != seconds:
        entry.carry(f"ttl: {seconds} s as idle_timeout_s = {fields['idle_timeout_s']:g} (dgxmm's bounds)")
    else:
        entry.carry(f"ttl: idle_timeout_s = {seconds:g}")


def _env(entry: Imported, env: Any, fields: dict[str, Any]) -> None:
    if env is None:
        return
    if not isinstance(env, list) or not all(isinstance(item, str) and "=" in item for item in env):
        raise ConfigProblem("env: must be a list of NAME=value strings")
    fields["env"] = dict(item.split("=", 1) for item in env)
    entry.carry(f"env: {', '.join(fields['env'])}")


def _concurrency(entry: Imported, limit: Any, fields: dict[str, Any]) -> None:
    if limit in (None, 0):
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigProblem(f"concurrencyLimit: {limit!r} is not a count")
    fields["max_concurrent"] = limit
    entry.carry(f"concurrencyLimit: max_concurrent = {limit} (requests past it wait here, not 429)")


def _check_endpoint(entry: Imported, path: Any, fields: dict[str, Any]) -> None:
    if path is None:
        return
    if path == "none":
        entry.drop("checkEndpoint: none: dgxmm always waits for a health answer (the engine's default path)")
    elif isinstance(path, str) and path.startswith("/"):
        fields["health_path"] = path
        entry.carry(f"checkEndpoint: health_path = {path}")
    else:
        raise ConfigProblem(f"checkEndpoint: {path!r} is not a path")
