"""``dgxmm serve`` as a child process, as users run it: for tests that need a signal, a second
instance, the process's own RSS or its own file descriptor limit."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from conftest import KEY, free_port

DGXMM = [sys.executable, "-m", "dgxmm.cli", "serve"]


class Served:
    def __init__(
        self,
        tmp_path: Path,
        env: dict[str, str] | None = None,
        *,
        name: str = "dgxmm",
        open_files: int | None = None,
        data_dir: Path | None = None,
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.data_dir = data_dir or tmp_path / "data"
        self.log_path = tmp_path / f"{name}.log"
        key = tmp_path / "ondemand.key"
        if not key.exists():
            key.write_text(KEY + "\n")
            key.chmod(0o600)
        self.env = {
            **os.environ,
            "DGXMM_SERVER__PORT": str(self.port),
            "DGXMM_SERVER__DATA_DIR": str(self.data_dir),
            "DGXMM_MEMORY__CAPACITY_GIB": "10",
            "DGXMM_ONDEMAND__KEY_FILE": str(key),
            "DGXMM_ONDEMAND__KEY_CHECK_INTERVAL_S": "0",
            "DGXMM_ONDEMAND__ALLOWED_CIDRS": '["127.0.0.2/31"]',
            "DGXMM_ONDEMAND__IDLE_TIMEOUT_MIN_S": "1",
            "DGXMM_DEPLOYER__HEALTH_INTERVAL_S": "0.5",
            "DGXMM_DEPLOYER__START_POLL_S": "0.05",
            "DGXMM_DEPLOYER__STOP_GRACE_S": "5",
            "DGXMM_RUNTIME__ENGINES_OUTLIVE_DGXMM": "false",  # a test's engines end with its dgxmm
            **(env or {}),
        }
        self.open_files = open_files
        self.proc: subprocess.Popen[bytes] | None = None
        self.base = f"http://127.0.0.1:{self.port}/dgxmm"

    def start(self, wait: bool = True) -> Served:
        limit = self.open_files

        def child() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(DGXMM, env=self.env, stdout=log, stderr=log, preexec_fn=child)  # noqa: PLW1509 - only setrlimit, before exec
        if wait:
            self.wait_up()
        return self

    def wait_up(self, timeout: float = 120) -> None:
        """Wait for the admin API to answer. The deadline only bounds a hang: a start takes about
        2 s of CPU, which a machine shared with busy loops (make test-loaded) stretches tenfold."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.base + "/api/openapi.json", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.proc is not None and self.proc.poll() is None, self.log()
            assert time.monotonic() < deadline, "dgxmm did not come up\n" + self.log()
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def token(self) -> str:
        return (self.data_dir / "admin-token").read_text().strip()

    def admin(self, **kw: Any) -> httpx.Client:
        return httpx.Client(
            base_url=self.base + "/api",
            headers={"Authorization": f"Bearer {self.token()}"},
            timeout=kw.pop("timeout", 30),
            **kw,
        )

    def gateway(self, address: str = "127.0.0.2", **kw: Any) -> httpx.Client:
        return httpx.Client(
            base_url=self.base + "/ondemand",
            headers={"Authorization": f"Bearer {KEY}"},
            transport=httpx.HTTPTransport(local_address=address),
            timeout=kw.pop("timeout", 60),
            **kw,
        )

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def open_sockets(self) -> int:
        """The dgxmm process's open sockets (its listening socket, clients, engines, probes)."""
        count = 0
        for fd in os.listdir(f"/proc/{self.pid}/fd"):
            try:
                count += os.readlink(f"/proc/{self.pid}/fd/{fd}").startswith("socket:")
            except OSError:
                pass
        return count

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def until(check: Callable[[], Any], timeout: float = 30, interval: float = 0.05) -> Any:
    """Poll ``check`` (synchronously) until it is truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"condition not met within {timeout} s: {check}"
        time.sleep(interval)
