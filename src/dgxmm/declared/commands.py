"""``dgxmm check-config`` and ``dgxmm export`` on declared deployments.

Both need the deployments as they are: read from the database when no dgxmm runs on it, else
asked of the running dgxmm (its database is its own while it runs), with the admin token of the
same configuration (``GET /api/config/plan``, ``GET /api/deployments``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from typing import Any, TextIO

from dgxmm.declared.export import fields_of, fields_of_view, to_toml
from dgxmm.declared.modelfiles import check_models
from dgxmm.declared.parse import DeclarationError, Sources, read
from dgxmm.declared.plan import lines_of, plan
from dgxmm.settings import Settings
from dgxmm.store.db import StoreError, read_deployments

ASK_TIMEOUT_S = 10.0


class Unreachable(Exception):
    """Neither the database nor a running dgxmm could say what the deployments are."""


def ask(settings: Settings, path: str) -> Any:
    """``GET {base}/api{path}`` of the dgxmm running with ``settings``, as JSON."""
    server = settings.server
    host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
    token_file = server.admin_token_file or server.data_dir / "admin-token"  # as app.token_path
    try:
        token = token_file.read_text().strip()
        req = urllib.request.Request(
            f"http://{host}:{server.port}{server.base_path}/api{path}", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(req, timeout=ASK_TIMEOUT_S) as resp:
            return json.load(resp)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise Unreachable(f"the database is in use and dgxmm at {host}:{server.port} did not answer: {exc}") from None


def check(settings: Settings, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Validate the declared files (and the model files a change needs) and print what applying
    them would do; 2 when invalid."""
    try:
        declared = read(Sources.of(settings))
    except DeclarationError as exc:
        print(f"config error: {exc}", file=err)
        return 2
    try:
        current = read_deployments(settings.server.data_dir / "dgxmm.db")
    except StoreError:
        try:
            answer = ask(settings, "/config/plan")
        except Unreachable as exc:
            print("config ok", file=out)
            print(f"declared: {len(declared)} (no plan: {exc})", file=out)
            return 0
        if not answer["valid"]:
            print(f"config error: {answer['error']['text']}", file=err)
            return 2
        print("config ok", file=out)
        for line in lines_of(answer["plan"]):
            print(line, file=out)
        return 0
    try:
        todo = plan(declared, current)
        asyncio.run(check_models(todo, declared, settings.runtime.kind))
    except DeclarationError as exc:
        print(f"config error: {exc}", file=err)
        return 2
    print("config ok", file=out)
    for line in todo.lines():
        print(line, file=out)
    return 0


def export(settings: Settings, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Print every deployment (declared or not) as ``[[deployments]]`` tables."""
    try:
        tables = [fields_of(dep) for dep in read_deployments(settings.server.data_dir / "dgxmm.db")]
    except StoreError:
        try:
            tables = [fields_of_view(view) for view in ask(settings, "/deployments")]
        except Unreachable as exc:
            print(f"dgxmm export: {exc}", file=err)
            return 1
    print(f"# {len(tables)} deployments exported by dgxmm export", file=out)
    print(to_toml(tables), file=out, end="")
    return 0
