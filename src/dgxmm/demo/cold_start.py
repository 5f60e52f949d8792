"""The demo's steps: check the running dgxmm, write the declared demo model, wait for it, call it.

Everything it needs comes from the same config file ``dgxmm serve`` uses (address, admin token,
on-demand key, llama-server path, and the deployment ``demo`` its declared files hold:
examples/deployments.d/demo.toml for ``make run``), so ``make run`` and ``make demo`` agree
without anything to copy. The demo writes the model where the declaration points (a tiny llama
with random weights) when it is missing; dgxmm, which looks at a declared model that is missing
at each look at its files, then creates the deployment, and the demo waits for it over the admin
API. It talks to dgxmm only over HTTP, as a user would: the admin API to find (and stop) the
deployment, and curl through the model router (``/v1``, the model picked by name) for the
request, printed before it runs so it can be pasted again, with the ``OPENAI_BASE_URL`` to give
other tools. ``--write-model`` writes the model only (``make run`` does, before it starts dgxmm,
so that the declaration is valid from the first start).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgxmm.declared.parse import Declaration, DeclarationError, Sources, read
from dgxmm.settings import ConfigError, Settings, load_settings

NAME = "demo"
PROMPT = "Hello! Who are you?"
MAX_TOKENS = 24
APPLY_WAIT_S = 30.0  # dgxmm looks at its declared files (and a missing model) every deployments_poll_s


class DemoError(Exception):
    """A step that cannot go on; the message says what to do."""


@dataclass
class Demo:
    settings: Settings
    config: Path | None

    # --- the running service ------------------------------------------------------------------

    @property
    def root(self) -> str:
        server = self.settings.server
        host = "127.0.0.1" if server.host in ("0.0.0.0", "::", "") else server.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{server.port}"

    @property
    def base(self) -> str:
        return self.root + self.settings.server.base_path

    def openai_base_url(self, deployment_id: str) -> str:
        """Where OpenAI clients call the model: the model router, or (turned off) the deployment's
        own gateway route."""
        router = self.settings.router
        return self.root + router.path if router.enabled else f"{self.base}/ondemand/{deployment_id}/v1"

    def token(self) -> str:
        path = self.settings.server.admin_token_file or self.settings.server.data_dir / "admin-token"
        try:
            return path.read_text().strip()
        except OSError:
            raise DemoError(f"no admin token in {path}: start dgxmm first ({self._run_hint()})") from None

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.base + "/api" + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token()}", "content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise DemoError(f"{method} {path}: HTTP {exc.code}: {exc.read().decode(errors='replace')}") from None
        except urllib.error.URLError as exc:
            raise DemoError(f"dgxmm does not answer on {self.base} ({exc.reason}): {self._run_hint()}") from None

    def _run_hint(self) -> str:
        config = f" --config {self.config}" if self.config else ""
        return f"run `make run` (or `dgxmm serve{config}`) in another terminal"

    # --- what the demo needs --------------------------------------------------------------------

    def check_engine(self) -> str:
        binary = self.settings.engines.llamacpp_bin
        found = shutil.which(binary)
        if found is None:
            raise DemoError(
                f"llama-server not found at {binary!r} ([engines] llamacpp_bin): "
                "`make llama-server` builds it and links it there"
            )
        return found

    def key(self) -> tuple[Path, str]:
        o = self.settings.ondemand
        if o.key_file is None:
            raise DemoError("[ondemand] key_file is not set: the gateway refuses every request without a key")
        try:
            key = o.key_file.read_text().strip()
        except OSError:
            raise DemoError(f"no on-demand key in {o.key_file}: dgxmm creates it on its first start") from None
        if not key:
            raise DemoError(f"{o.key_file} is empty: the gateway refuses every request")
        loopback = ipaddress.ip_address("127.0.0.1")
        allowed = o.allowed_cidrs != "auto" and any(
            loopback in ipaddress.ip_network(cidr, strict=False) for cidr in o.allowed_cidrs
        )
        if not allowed:
            raise DemoError(
                f"[ondemand] allowed_cidrs = {o.allowed_cidrs!r} does not admit 127.0.0.1, where the "
                'demo calls from: add "127.0.0.1/32"'
            )
        return o.key_file, key

    def declaration(self) -> Declaration:
        """The deployment ``demo`` as the config's declared files hold it."""
        try:
            declared = read(Sources.of(self.settings))
        except DeclarationError as exc:
            raise DemoError(f"the declared deployments cannot be read: {exc}") from None
        found = next((decl for decl in declared if decl.name == NAME), None)
        if found is None:
            raise DemoError(
                f"no deployment {NAME!r} is declared: examples/deployments.d/demo.toml declares it "
                '(examples/dgxmm.toml\'s [server] deployments_dir = "examples/deployments.d")'
            )
        if found.fields["engine"] != "llamacpp" or found.fields["model"].startswith("hf://"):
            raise DemoError(f"{found.file} declares {NAME!r} with no llama.cpp model file for the demo to write")
        return found

    def model(self, decl: Declaration) -> tuple[Path, bool]:
        """The declared model file, written when it is missing; and whether it was written now."""
        from dgxmm.demo.tiny_gguf import write_tiny_gguf

        path = Path(decl.fields["model"])
        if path.exists():
            return path, False
        write_tiny_gguf(path)
        return path, True

    # --- the deployment -------------------------------------------------------------------------

    def deployment(self, decl: Declaration) -> dict[str, Any]:
        """The declared deployment ``demo`` as dgxmm applied it, stopped so the request below is
        a cold start."""
        existing = self.find()
        if existing is not None and existing.get("managed_by") != "config":
            # Made through the API by an earlier demo: its name is the file's now.
            say(f"removing the deployment {NAME} an earlier demo made through the API: {decl.file} declares it now")
            self.api("DELETE", f"/deployments/{existing['id']}")
            existing = None
        if existing is None:
            say(f"waiting for dgxmm to create the deployment {NAME} that {decl.file} declares…")
            existing = self.wait_declared()
            say(
                f"dgxmm created the declared on-demand deployment {NAME} (id {existing['id']}): stopped until its first request"
            )
            return existing
        say(f"the declared deployment {NAME} (id {existing['id']}, {existing['state']})")
        if existing["state"] not in ("stopped", "failed"):
            say("stopping it first, so that this run shows a cold start")
            existing = self.api("POST", f"/deployments/{existing['id']}/stop")
        return dict(existing)

    def find(self) -> dict[str, Any] | None:
        return next((dict(d) for d in self.api("GET", "/deployments") if d["name"] == NAME), None)

    def wait_declared(self) -> dict[str, Any]:
        deadline = time.monotonic() + APPLY_WAIT_S
        while True:
            found = self.find()
            if found is not None and found.get("managed_by") == "config":
                return found
            if time.monotonic() > deadline:
                error = (self.api("GET", "/host").get("config") or {}).get("error")
                why = f": {error['text']}" if error else ""
                raise DemoError(f"dgxmm did not create {NAME} within {APPLY_WAIT_S:g} s{why}")
            time.sleep(0.25)

    # --- the request ----------------------------------------------------------------------------

    def curl(self, deployment_id: str, key_file: Path) -> tuple[str, list[str]]:
        """The command to show (the key read from its file) and the one to run, which reads its
        Authorization header from stdin (curl -K -): a key in argv is visible to every local user."""
        url = f"{self.openai_base_url(deployment_id)}/chat/completions"
        body = json.dumps(
            {"model": NAME, "messages": [{"role": "user", "content": PROMPT}], "stream": True, "max_tokens": MAX_TOKENS}
        )
        shown = (
            f'curl -sN {url} \\\n  -H "Authorization: Bearer $(cat {shlex.quote(str(key_file))})" '
            f"-H 'content-type: application/json' \\\n  -d {shlex.quote(body)}"
        )
        argv = ["curl", "-sN", url, "-K", "-", "-H", "content-type: application/json", "-d", body]
        return shown, argv


@dataclass
class Stream:
    first_token_s: float | None = None
    total_s: float = 0.0
    done: bool = False
    text: str = ""
    raw: str = ""


def stream(argv: list[str], stdin: str, echo: bool) -> Stream:
    """Run curl (``stdin`` is written to it), echo its SSE lines as they come, and time the first
    content token."""
    result = Stream()
    started = time.monotonic()
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        for line in proc.stdout:
            result.raw += line
            if echo:
                print(line, end="", flush=True)
            payload = line.strip().removeprefix("data:").strip()
            if not line.startswith("data:") or not payload:
                continue
            if payload == "[DONE]":
                result.done = True
                continue
            try:
                choices = json.loads(payload).get("choices") or [{}]
            except json.JSONDecodeError:
                continue
            content = (choices[0].get("delta") or {}).get("content")
            if content:
                result.text += content
                if result.first_token_s is None:
                    result.first_token_s = time.monotonic() - started
    result.total_s = time.monotonic() - started
    return result


def say(text: str) -> None:
    print(f"==> {text}", flush=True)


def run(demo: Demo) -> None:
    if shutil.which("curl") is None:
        raise DemoError("curl is needed (apt-get install curl)")
    host = demo.api("GET", "/host")
    say(f"dgxmm {host['version']} answers on {demo.base}")
    binary = demo.check_engine()
    say(f"llama-server: {binary}")
    key_file, key = demo.key()
    decl = demo.declaration()
    model, written = demo.model(decl)
    say(f"model: {model} ({model.stat().st_size / 1e6:.1f} MB{', written now' if written else ''})")
    say("  a tiny llama model with RANDOM weights, written by the demo: it answers with junk text.")
    say("  It is here to show a real engine's cold start, not a model's quality.")
    view = demo.deployment(decl)
    say("every model on this dgxmm answers on one OpenAI base URL, picked by its name; for your tools:")
    print(
        f"\n  export OPENAI_BASE_URL={demo.openai_base_url(view['id'])}\n"
        f"  export OPENAI_API_KEY=$(cat {shlex.quote(str(key_file))})\n",
        flush=True,
    )
    shown, argv = demo.curl(view["id"], key_file)
    header = f'header = "Authorization: Bearer {key}"\n'  # curl's config syntax, for -K -
    say(f"the first request for the model {NAME!r} starts its engine; the answer streams back:")
    print(f"\n{shown}\n", flush=True)
    cold = stream(argv, header, echo=True)
    if cold.first_token_s is None or not cold.done:
        after = demo.api("GET", f"/deployments/{view['id']}")
        reason = after.get("state_reason") or ""
        raise DemoError(
            f"no streamed answer (deployment {after['state']}{': ' + reason if reason else ''}); "
            f"see the log of `make run` and GET {demo.base}/api/deployments/{view['id']}/logs"
        )
    print()
    say(
        f"cold start: first token after {cold.first_token_s:.2f} s (dgxmm started llama-server, which loaded "
        f"the model and answered), whole answer after {cold.total_s:.2f} s"
    )
    warm = stream(argv, header, echo=False)
    if warm.first_token_s is not None:
        say(f"the same request again, now that the engine runs: first token after {warm.first_token_s:.2f} s")
    idle_s = view.get("idle_timeout_s") or demo.settings.ondemand.idle_timeout_s
    idle = f"{idle_s / 60:g} min" if idle_s % 60 == 0 else f"{idle_s:g} s"
    say(
        f"{NAME} is stopped again after {idle} without requests (its idle_timeout_s); "
        f"watch it in the web UI at {demo.base}/ (admin token in "
        f"{demo.settings.server.admin_token_file or demo.settings.server.data_dir / 'admin-token'})"
    )


def write_model(demo: Demo) -> None:
    """``make run``'s first step: the declaration is valid from dgxmm's first start. Without a
    declared demo (a config of one's own) there is nothing to write, and dgxmm says the rest."""
    try:
        decl = demo.declaration()
    except DemoError as exc:
        print(f"demo model not written: {exc}", flush=True)
        return
    model, written = demo.model(decl)
    if written:
        say(f"wrote the demo model {model} ({decl.file} declares it)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m dgxmm.demo",
        description=("A real on-demand cold start of llama.cpp through the gateway of a running dgxmm."),
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=os.environ.get("DGXMM_CONFIG"),
        help="the TOML config the running dgxmm uses (default: $DGXMM_CONFIG)",
    )
    parser.add_argument(
        "--write-model",
        action="store_true",
        help="only write the declared demo model when it is missing (make run does, before dgxmm starts)",
    )
    args = parser.parse_args(argv)
    try:
        demo = Demo(load_settings(args.config), args.config)
        if args.write_model:
            write_model(demo)
        else:
            run(demo)
    except ConfigError as exc:
        sys.exit(str(exc))
    except DemoError as exc:
        sys.exit(f"demo: {exc}")
