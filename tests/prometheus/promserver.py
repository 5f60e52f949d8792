"""A real Prometheus (Debian's ``prometheus``) for the tests: its own config, data directory and
port, started as a child process and stopped at the end; queried through its HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "prometheus"


def binary(name: str) -> str:
    """The path of ``prometheus`` or ``promtool``, or skip: the package is not installed here."""
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (apt-get install prometheus; .ci/run installs it)")
    return found


class PromServer:
    def __init__(self, workdir: Path, target: str, token_file: Path, interval: str = "1s") -> None:
        """Scrape ``target`` (host:port) as the example config scrapes dgxmm, with the admin
        token, every ``interval``, evaluating the example rules as often."""
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": interval, "evaluation_interval": interval}
        config["rule_files"] = [str(EXAMPLES / rules) for rules in config["rule_files"]]
        job = config["scrape_configs"][0]
        job["static_configs"] = [{"targets": [target]}]
        job["authorization"] = {"credentials_file": str(token_file)}
        # Every rule of the example files, counted from them: what the test expects loaded.
        self.rules = sum(
            len(group["rules"])
            for rules in config["rule_files"]
            for group in yaml.safe_load(Path(rules).read_text())["groups"]
        )
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> PromServer:
        with self.log.open("wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                binary("prometheus"),
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
                stdout=out,
                stderr=out,
            )
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient() as client:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(self.url + "/-/ready", timeout=2)).status_code == 200:
                        return self
                if self.proc.returncode is not None or time.monotonic() > deadline:
                    raise AssertionError(f"prometheus did not start: {self.log.read_text()[-2000:]}")
                await asyncio.sleep(0.2)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    async def api(self, path: str, **params: str) -> Any:
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as client:
            resp = await client.get("/api/v1/" + path, params=params)
        body = resp.json()
        assert resp.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query; the result vector (raises on a PromQL error)."""
        data = await self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return list(data["result"])

    async def query_range(self, expr: str, start: float, end: float, step: str = "1s") -> list[dict[str, Any]]:
        """A range query, as Grafana's time series panels make them; the result matrix."""
        data = await self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step)
        assert data["resultType"] == "matrix", (expr, data)
        return list(data["result"])

    async def value(self, expr: str) -> float | None:
        """The single sample of ``expr``, or None while there is none."""
        result = await self.query(expr)
        assert len(result) <= 1, (expr, result)
        return float(result[0]["value"][1]) if result else None
