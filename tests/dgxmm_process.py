"""dgxmm as users run it, ``dgxmm serve`` in a process of its own, which a test may SIGKILL and
start again on the same data directory (crash and restart tests, both runtimes).

Plain synchronous calls (httpx, subprocess): the process is outside the test's event loop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from conftest import KEY, free_port

ENGINE_MARKER = b"DGXMM_DEPLOYMENT_ID="


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(str(value))


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s")
        time.sleep(0.05)
    return result


def engine_pids(deployment_id: str) -> list[int]:
    """Processes on this host that belong to the deployment's engine (the process runtime marks
    each with DGXMM_DEPLOYMENT_ID; children inherit it)."""
    marker = ENGINE_MARKER + deployment_id.encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            stat = (environ.parent / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] != "Z" and marker in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except (OSError, IndexError):
            continue
    return pids


class Dgxmm:
    """One data directory and config; ``start`` runs ``dgxmm serve`` on them, ``kill`` SIGKILLs it."""

    def __init__(self, tmp_path: Path, **sections: dict[str, Any]) -> None:
        self.dir = tmp_path
        self.port = free_port()
        (tmp_path / "ondemand.key").write_text(KEY + "\n")
        self.sections: dict[str, dict[str, Any]] = {
            "server": {"port": self.port, "data_dir": str(tmp_path / "data"), "log_level": "info"},
            "memory": {"source": "declared", "capacity_gib": 10},
            "deployer": {"start_timeout_s": 120, "start_poll_s": 0.1, "health_interval_s": 1, "stop_grace_s": 30},
            "ondemand": {
                "key_file": str(tmp_path / "ondemand.key"),
                "allowed_cidrs": ["127.0.0.2/32"],
                "idle_timeout_min_s": 0.2,
            },
            # Engines die with dgxmm unless a test says otherwise (the crash tests of that mode;
            # tests/integration/test_engines_outlive.py covers the default).
            "runtime": {"engines_outlive_dgxmm": False},
        }
        self.configure(**sections)
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.api = f"http://127.0.0.1:{self.port}/dgxmm/api"
        self.gateway = f"http://127.0.0.1:{self.port}/dgxmm/ondemand"
        self.token = ""

    def configure(self, **sections: dict[str, Any]) -> None:
        """Change config keys for the next start."""
        for name, values in sections.items():
            self.sections.setdefault(name, {}).update(values)
        text = "".join(
            f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in values.items())
            for name, values in self.sections.items()
        )
        (self.dir / "dgxmm.toml").write_text(text)

    def start(self) -> None:
        self.runs += 1
        log = (self.dir / f"serve-{self.runs}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dgxmm.cli", "serve", "--config", str(self.dir / "dgxmm.toml")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ},
        )
        wait_for(self._up, 60, f"dgxmm serve answering (log: {self.dir}/serve-{self.runs}.log)")
        self.token = (self.dir / "data" / "admin-token").read_text().strip()

    def _up(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, (self.dir / f"serve-{self.runs}.log").read_text()
        try:
            return httpx.get(self.api + "/openapi.json", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> None:
        """SIGKILL: no lifespan shutdown, no cleanup of any kind."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # --- the admin API --------------------------------------------------------------------------

    def call(self, method: str, path: str, timeout: float = 30, **kw: Any) -> httpx.Response:
        return httpx.request(
            method, self.api + path, headers={"Authorization": f"Bearer {self.token}"}, timeout=timeout, **kw
        )

    def create(self, **body: Any) -> dict[str, Any]:
        resp = self.call("POST", "/deployments", json=body)
        assert resp.status_code == 201, resp.text
        return dict(resp.json())

    def view(self, deployment_id: str) -> dict[str, Any]:
        resp = self.call("GET", f"/deployments/{deployment_id}")
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def wait_state(self, deployment_id: str, *states: str, timeout: float = 60) -> dict[str, Any]:
        return dict(
            wait_for(
                lambda: (v := self.view(deployment_id))["state"] in states and v,
                timeout,
                f"{deployment_id} in {states}",
            )
        )

    def held_gib(self) -> float:
        return float(self.call("GET", "/host").json()["memory"]["held_gib"])

    def in_background(self, method: str, url: str, **kw: Any) -> threading.Thread:
        """A call that may never be answered (dgxmm is about to be killed), sent from a thread."""

        def run() -> None:
            try:
                httpx.request(method, url, timeout=120, **kw)
            except httpx.HTTPError:
                pass

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def request_model(self, deployment_id: str) -> threading.Thread:
        """A chat completion through the gateway from 127.0.0.2, in the background."""
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

        def run() -> None:
            transport = httpx.HTTPTransport(local_address="127.0.0.2")
            try:
                with httpx.Client(transport=transport, timeout=120) as client:
                    client.post(
                        f"{self.gateway}/{deployment_id}/v1/chat/completions",
                        json=body,
                        headers={"Authorization": f"Bearer {KEY}"},
                    )
            except httpx.HTTPError:
                pass

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread
