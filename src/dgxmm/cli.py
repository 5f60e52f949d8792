"""The ``dgxmm`` command: ``serve`` runs the service, ``check-config`` validates a config file
and prints what its declared deployments would change, ``export`` prints every deployment as
``[[deployments]]`` tables, ``litellm purge`` retires the LiteLLM entries of a host that is gone
(docs/fleet.md), ``pull`` asks the running dgxmm to pull a model from the hub (docs/models.md),
``import`` writes declared deployments for the models of llama-swap or Ollama (docs/migrating.md).

Configuration and database problems, a data directory another dgxmm holds and a port in use end
start-up with exit code 2 and one line naming what is wrong, before anything listens or any
engine starts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from dgxmm import __version__
from dgxmm.datadir import DataDirBusy, DataDirLock
from dgxmm.deploy.budget import MemoryBudget
from dgxmm.front.limits import raise_open_files_limit
from dgxmm.settings import ConfigError, Settings, load_settings
from dgxmm.store.db import Store, StoreError
from dgxmm.errors import StoreUnavailable
from dgxmm import logs

log = logging.getLogger("dgxmm")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dgxmm", description="Manage LLM engine deployments on one GPU host.")
    parser.add_argument("--version", action="version", version=f"dgxmm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (
        ("serve", "run the service"),
        ("check-config", "validate the configuration and print what its declared deployments would change"),
        ("export", "print every deployment as [[deployments]] TOML that check-config accepts"),
    ):
        _config_option(sub.add_parser(name, help=text, description=text))
    text = "stop the running dgxmm of this configuration's data directory and wait until it has exited"
    stop = sub.add_parser("stop", help=text, description=text)
    _config_option(stop)
    stop.add_argument(
        "--stop-engines",
        action="store_true",
        help="stop its engines too (by default those that outlive dgxmm go on, for the next start to adopt)",
    )
    stop.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait (default: both graces plus 30)", metavar="S"
    )
    litellm = sub.add_parser("litellm", help="LiteLLM entries of a fleet", description="LiteLLM entries of a fleet")
    action = litellm.add_subparsers(dest="action", required=True, metavar="ACTION")
    text = "delete the LiteLLM entries of a dgxmm instance that is gone (uses [litellm] url and master_key_file)"
    purge = action.add_parser("purge", help=text, description=text)
    _config_option(purge)
    which = purge.add_mutually_exclusive_group(required=True)
    which.add_argument("--instance", metavar="ID", help="the instance id whose entries to delete")
    which.add_argument(
        "--legacy",
        action="store_true",
        help="entries an older dgxmm wrote without an instance id that no live host adopted",
    )
    purge.add_argument("--dry-run", action="store_true", help="list the entries, delete nothing")
    text = "what llama.cpp's server will hold for a GGUF model: the memory_gib to declare"
    est = sub.add_parser("estimate", help=text, description=text)
    est.add_argument("model", type=Path, metavar="MODEL.gguf")
    est.add_argument("--ctx", type=_context, help="the context size (default: from ARGS, else the model's own)")
    est.add_argument("--json", action="store_true", help="print the estimate as JSON")
    est.add_argument(
        "args",
        nargs=argparse.REMAINDER,
        metavar="-- ARGS",
        help="llama-server arguments as the deployment gives them (-c, -ctk, -ctv, -fa)",
    )
    text = "pull a model from the hub into the running dgxmm's model store, showing its progress"
    pull = sub.add_parser("pull", help=text, description=text)
    _config_option(pull)
    pull.add_argument("repo", metavar="ORG/REPO")
    pull.add_argument("--revision", default="main", help="a branch, tag or commit (default: main)")
    pull.add_argument(
        "--include", action="append", default=[], metavar="GLOB", help="only the paths this glob matches (repeatable)"
    )
    text = "write declared deployments for the models of llama-swap or Ollama (docs/migrating.md)"
    imp = sub.add_parser("import", help=text, description=text)
    source = imp.add_subparsers(dest="source", required=True, metavar="SOURCE")
    text = "every model of a llama-swap config file"
    swap = source.add_parser("llama-swap", help=text, description=text)
    swap.add_argument("file", type=Path, metavar="CONFIG.yaml")
    text = "every GGUF model tag of an Ollama store, served in place"
    oll = source.add_parser("ollama", help=text, description=text)
    oll.add_argument(
        "--models", type=Path, metavar="DIR", help="Ollama's models (default: $OLLAMA_MODELS, else ~/.ollama/models)"
    )
    for cmd in (swap, oll):
        _config_option(cmd)
        cmd.add_argument("--out", type=Path, metavar="DIR", help="where to write (default: [server] deployments_dir)")
        cmd.add_argument("--dry-run", action="store_true", help="print what would be imported, write nothing")
    return parser


def _context(text: str) -> int:
    """``--ctx``: a context llama-server can have (deploy/estimate.py's bound, as the API's)."""
    from dgxmm.deploy.estimate import MAX_CONTEXT

    if not text.isdigit() or not 1 <= int(text) <= MAX_CONTEXT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a context size from 1 to {MAX_CONTEXT}")
    return int(text)


def _config_option(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--config", type=Path, default=os.environ.get("DGXMM_CONFIG"), help="TOML config file (default: $DGXMM_CONFIG)"
    )


def _settings(path: Path | None) -> Settings:
    try:
        return load_settings(path)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        raise SystemExit(2) from None


def serve(settings: Settings) -> None:
    """Start-up in the order that keeps a second instance harmless: the data directory's lock
    before the database, the port and any engine; each failure is one line and exit code 2."""
    from dgxmm.app import create_app
    from dgxmm.front.server import CannotListen, build_server, listeners

    try:
        MemoryBudget(settings.memory).check_source()
    except Exception as exc:  # noqa: BLE001 - any failure of the source is a config problem
        _exit(f"config error: memory.source: cannot read {settings.memory.source}: {exc}")
    server = settings.server
    try:
        lock = DataDirLock.acquire(server.data_dir)
    except DataDirBusy as exc:
        _exit(str(exc))
    except OSError as exc:
        _exit(f"data directory error: {server.data_dir}: {exc.strerror or exc}")
    try:
        sockets = listeners(settings)
    except CannotListen as exc:
        _exit(str(exc))
    try:
        store = Store(server.data_dir / "dgxmm.db")
    except (StoreError, StoreUnavailable, OSError) as exc:
        _exit(f"database error: {exc}")
    files = raise_open_files_limit()
    app = create_app(settings, store, lock)
    root = f"http://{server.host}:{server.port}{server.base_path}"
    log.info("admin API on %s/api (OpenAPI: %s/api/openapi.json)", root, root)
    log.info("web UI on %s/", root)
    log.info("on-demand gateway on %s/ondemand/{id}/v1", root)
    if settings.ollama.listen is not None:
        log.info("Ollama's API alone on http://%s/api", settings.ollama.listen)
    limits = app.limits
    log.info(
        "at most %d client connections (open files limit %d), %d kept for the admin API",
        limits.max_connections,
        files,
        limits.admin_reserve,
    )
    build_server(settings, app).run(sockets=sockets)


def _exit(line: str) -> NoReturn:
    print(line, file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "estimate":
        raise SystemExit(estimate(args.model, args.ctx, [a for a in args.args if a != "--"], args.json))
    settings = _settings(args.config)
    logs.configure(settings.server.log_level, settings.server.log_format)
    if args.command in ("check-config", "export"):
        from dgxmm.declared import commands

        raise SystemExit((commands.check if args.command == "check-config" else commands.export)(settings))
    if args.command == "litellm":
        raise SystemExit(purge(settings, args.instance, args.legacy, args.dry_run))
    if args.command == "import":
        raise SystemExit(import_models(settings, args))
    if args.command == "pull":
        raise SystemExit(pull(settings, args.repo, args.revision, args.include))
    if args.command == "stop":
        raise SystemExit(stop(settings, args.stop_engines, args.timeout))
    serve(settings)


def stop(settings: Settings, stop_engines: bool, timeout_s: float | None) -> int:
    """``dgxmm stop``: SIGTERM the holder of the data directory and wait until it has exited."""
    from dgxmm.stoprequest import NotRunning, request_stop

    if timeout_s is None:  # its requests' grace, then its engines' (when they are stopped), and a margin
        timeout_s = settings.server.shutdown_grace_s + settings.deployer.stop_grace_s + 30
    data_dir = settings.server.data_dir
    try:
        pid = request_stop(data_dir, stop_engines=stop_engines, timeout_s=timeout_s)
    except NotRunning as exc:
        print(f"dgxmm stop: not running ({exc})")
        return 0
    except TimeoutError as exc:
        print(f"dgxmm stop: {exc}", file=sys.stderr)
        return 1
    except PermissionError:
        _exit(f"dgxmm stop: not allowed to signal the dgxmm that holds {data_dir} (another user's)")
    outlive = settings.runtime.kind == "docker" or settings.runtime.engines_outlive_dgxmm
    engines = "its engines left running for the next start" if outlive and not stop_engines else "its engines stopped"
    print(f"dgxmm stop: PID {pid} exited, {engines}")
    return 0


def estimate(model: Path, ctx: int | None, server_args: list[str], as_json: bool) -> int:
    """``dgxmm estimate``: what llama-server will hold (deploy/estimate.py), or why not."""
    from dgxmm.deploy.ggufheader import NotAModel
    from dgxmm.deploy.estimate import estimate as run_estimate

    try:
        found = run_estimate(model, server_args, ctx)
    except NotAModel as exc:
        _exit(f"dgxmm estimate: {exc}")
    if as_json:
        print(json.dumps(found.as_dict()))
        return 0
    facts = found.as_dict()
    print(
        f"{model}: about {facts['total_gib']:.2f} GiB with llama-server (context {found.context}, "
        f"KV cache {found.cache_k}/{found.cache_v})"
    )
    print(f"  weights   {facts['weights_gib']:8.3f} GiB")
    print(f"  KV cache  {facts['kv_cache_gib']:8.3f} GiB")
    print(f"  overhead  {facts['overhead_gib']:8.3f} GiB")
    print(f"declare memory_gib = {found.suggested_gib:g}")
    return 0


def import_models(settings: Settings, args: argparse.Namespace) -> int:
    """``dgxmm import``: read the source, print the report, write its declared file (or not)."""
    from dgxmm.migrate import llamaswap, ollama
    from dgxmm.migrate.report import keep_valid, write
    from dgxmm.migrate.swapconfig import ConfigProblem

    out = args.out or settings.server.deployments_dir
    if out is None and not args.dry_run:
        _exit("dgxmm import: give --out DIR or set [server] deployments_dir")
    bounds = (settings.ondemand.idle_timeout_min_s, settings.ondemand.idle_timeout_max_s)
    if args.source == "llama-swap":
        try:
            report = llamaswap.run(args.file, bounds)
        except ConfigProblem as exc:
            _exit(f"dgxmm import: {exc}")
        name = llamaswap.FILE_NAME
    else:
        report, name = ollama.run(args.models or ollama.default_dir()), ollama.FILE_NAME
    keep_valid(report, name)
    report.print(print)

    def say(line: str) -> None:
        print(line, file=sys.stderr if line.startswith("error:") else sys.stdout)

    return write(report, out or Path("."), name, args.dry_run, say)


def pull(settings: Settings, repo: str, revision: str, include: list[str], poll_s: float = 1.0) -> int:
    """``dgxmm pull``: ``POST /api/models`` to the dgxmm this config runs, then its progress each
    second until the model is ready (0, the path printed) or not (1, the reason)."""
    import time
    import urllib.error
    import urllib.request

    from dgxmm.assembly.core import token_path

    server = settings.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    api = f"http://{host}:{server.port}{server.base_path}/api/models"
    try:
        token = token_path(settings).read_text().strip()
    except OSError as exc:
        _exit(f"dgxmm pull: cannot read the admin token {token_path(settings)}: {exc.strerror}")

    def call(method: str, url: str, body: dict[str, object] | None = None) -> dict[str, object]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                found: dict[str, object] = json.loads(answer.read())
                return found
        except urllib.error.HTTPError as exc:
            _exit(f"dgxmm pull: {json.loads(exc.read()).get('error', {}).get('message', exc.reason)}")
        except OSError as exc:
            _exit(f"dgxmm pull: cannot reach dgxmm at {api}: {exc}")

    record = call("POST", api, {"repo": repo, "revision": revision, "include": include})
    while record["status"] == "downloading":
        done, total = int(str(record["bytes_done"])), int(str(record["bytes_total"])) or 1
        print(
            f"\r{repo}: {done / 1024**3:.2f} of {total / 1024**3:.2f} GiB ({100 * done // total}%)", end="", flush=True
        )
        time.sleep(poll_s)
        record = call("GET", f"{api}/{record['id']}")
    print()
    if record["status"] != "ready":
        print(f"{repo}: {record['status']}: {record['error']}", file=sys.stderr)
        return 1
    print(f"{repo}: ready in {record['path']}")
    return 0


def purge(settings: Settings, instance: str | None, legacy: bool, dry_run: bool) -> int:
    from dgxmm.litellm.purge import purge as run_purge

    lite = settings.litellm
    if not lite.url or lite.master_key_file is None:
        print("config error: litellm: url and master_key_file are needed to purge", file=sys.stderr)
        return 2

    def say(line: str) -> None:
        print(line, file=sys.stderr if line.startswith("error:") else sys.stdout)

    return 0 if asyncio.run(run_purge(lite, instance, legacy, dry_run, say)) else 1


if __name__ == "__main__":
    main()
