"""Shared fixtures: settings for a test, the real service on a free port, test-engine commands.

The service runs in the test's own event loop (uvicorn's Server as a task) so tests can reach its
internals (``svc.ctx``) while still talking to it over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from dgxmm import logs  # noqa: E402
from dgxmm.app import create_app  # noqa: E402
from dgxmm.context import Context  # noqa: E402
from dgxmm.front.server import DgxmmServer, build_server, listeners  # noqa: E402
from dgxmm.settings import Settings  # noqa: E402

TEST_ENGINE = TESTS / "engines" / "testengine.py"

# The real-vLLM tests run only through `make test-vllm`, which installs vLLM and names its python.
collect_ignore = [] if os.environ.get("DGXMM_VLLM_PYTHON") else ["vllm"]
# SGLang's parser check runs where a Python that imports SGLang is named (docs/engines.md#sglang).
if not os.environ.get("DGXMM_SGLANG_PYTHON"):
    collect_ignore.append("sglang")

# Skips shared by several modules, each with its fix.
CGROUP_SKIP = "no cgroup v2 that dgxmm may create cgroups under (run as root, as CI does)"
TMPFS_SKIP = "mounting a tmpfs needs root (run as root, as CI does)"

# Skip reasons that cannot carry their fix themselves (pytest.importorskip words its own), by a
# part of their text: what the summary shows instead. Every other skip names its fix in its reason.
SKIP_FIXES = {
    "could not import 'playwright": "no Playwright (make test installs the test extras: pip install -e '.[test]')",
}


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any) -> Iterator[None]:
    """The run's last lines (after -ra's short summary): the skips grouped by reason, each with
    what would run them ("80 skipped: /usr/bin/chromium is missing (apt-get install chromium; ...)")."""
    yield
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reason = next((fix for part, fix in SKIP_FIXES.items() if part in reason), reason)
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.section("skips by reason, with what would run them")
        for reason, count in sorted(reasons.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{count} skipped: {reason}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def sse_events(resp: httpx.Response) -> AsyncIterator[tuple[str, Any]]:
    """The (event name, decoded data) pairs of a server-sent event stream, as they arrive."""
    event = "message"
    async for line in resp.aiter_lines():
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:"):
            yield event, json.loads(line.split(":", 1)[1])


def engine_command(*flags: str) -> list[str]:
    """A ``command`` engine running the test engine with ``flags``."""
    return [sys.executable, str(TEST_ENGINE), "--port", "{port}", "--served-name", "{served_name}", *flags]


def make_settings(tmp_path: Path, **sections: dict[str, Any]) -> Settings:
    """Settings with test-sized timings; ``sections`` override keys section by section."""
    data: dict[str, dict[str, Any]] = {
        "server": {"port": free_port(), "data_dir": tmp_path / "data"},
        "memory": {"source": "declared", "capacity_gib": 100},
        "deployer": {
            "start_timeout_s": 20,
            "health_interval_s": 0.5,
            "start_poll_s": 0.05,
            "stop_grace_s": 5,
            "metrics_interval_s": 0.2,
        },
        # No test asks the real Hugging Face Hub: unless a test gives its local hub (tests/hub),
        # an hf:// model's questions go to a port nothing listens on, and fail at once.
        "models": {"hub_url": "http://127.0.0.1:9"},
        # A test's dgxmm runs inside pytest's process and ends with the test: its engines end
        # with it (tests/integration/test_engines_outlive.py covers the default).
        "runtime": {"engines_outlive_dgxmm": False},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Settings(**data)


async def wait_until(check: Callable[[], Any | Awaitable[Any]], timeout: float = 20.0, interval: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {check}")
        await asyncio.sleep(interval)


@dataclass
class Service:
    settings: Settings
    app: Any
    client: httpx.AsyncClient
    url: str
    server: DgxmmServer
    task: asyncio.Task[None]

    async def shutdown(self) -> None:
        """Stop the service as a SIGTERM would (lifespan shutdown); safe to call twice."""
        await self.client.aclose()
        self.server.should_exit = True
        await asyncio.wait_for(asyncio.shield(self.task), 30)

    @property
    def ctx(self) -> Context:
        ctx: Context = self.app.state.ctx
        return ctx

    def engine_auth(self, deployment_id: str) -> dict[str, str]:
        """The header with the key this run of the engine demands, to call it directly."""
        handle = self.ctx.deployer.get(deployment_id).runtime_handle
        return handle.auth if handle else {}

    async def create(self, **body: Any) -> dict[str, Any]:
        resp = await self.client.post("/api/deployments", json=body)
        assert resp.status_code == 201, resp.text
        return dict(resp.json())

    async def view(self, deployment_id: str) -> dict[str, Any]:
        resp = await self.client.get(f"/api/deployments/{deployment_id}")
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    async def wait_state(self, deployment_id: str, *states: str, timeout: float = 20) -> dict[str, Any]:
        async def reached() -> dict[str, Any] | None:
            view = await self.view(deployment_id)
            return view if view["state"] in states else None

        return dict(await wait_until(reached, timeout))


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    """``dgxmm.cli.main`` configures the root logger as a command should (``logs.configure``: its
    level and one stderr handler). A test that runs a command in-process must not leave that to
    the tests after it: the root at INFO let httpx's request lines, query strings and all, into
    later tests' captured logs, and the handler kept writing to a captured stream long closed."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)
    for handler in root.handlers[:]:
        if isinstance(handler.formatter, logs.TextFormatter | logs.JsonFormatter):
            root.removeHandler(handler)


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Service]]]:
    """Start the real service (as many as a test needs); all are shut down at the end. The
    server is built by the same function as ``dgxmm serve``'s, with the same configuration."""
    running: list[Service] = []

    async def start(settings: Settings | None = None) -> Service:
        settings = settings or make_settings(tmp_path)
        app = create_app(settings)
        server = build_server(settings, app)
        task = asyncio.create_task(server.serve(sockets=listeners(settings)))
        await wait_until(lambda: server.started or task.done(), timeout=20)
        if task.done():
            task.result()
        base = f"http://127.0.0.1:{settings.server.port}{settings.server.base_path}"
        token = app.state.ctx.admin_token
        client = httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        svc = Service(settings, app, client, base, server, task)
        running.append(svc)
        return svc

    yield start
    for svc in reversed(running):
        await svc.shutdown()


KEY = "sk-ondemand-test-key"


def gateway_settings(tmp_path: Path, **sections: dict[str, Any]) -> Settings:
    """Settings with an on-demand key file and 127.0.0.2-127.0.0.9 allowed as callers."""
    key_file = tmp_path / "ondemand.key"
    if not key_file.exists():
        key_file.write_text(KEY + "\n")
    ondemand = {
        "key_file": key_file,
        "allowed_cidrs": ["127.0.0.2/31", "127.0.0.4/30", "127.0.0.8/31"],
        "idle_timeout_min_s": 0.5,
        "idle_timeout_s": 60,
        "key_check_interval_s": 0,
        **sections.pop("ondemand", {}),
    }
    return make_settings(tmp_path, ondemand=ondemand, **sections)


def caller(svc: Service, address: str = "127.0.0.2", key: str | None = KEY, **kw: Any) -> httpx.AsyncClient:
    """An HTTP client calling the gateway from ``address`` (a distinct peer on loopback)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    port = svc.settings.server.port
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}{svc.settings.server.base_path}/ondemand",
        transport=httpx.AsyncHTTPTransport(local_address=address),
        headers=headers,
        timeout=kw.pop("timeout", 30),
        **kw,
    )


async def refused_request(svc: Service, request_id: str) -> dict[str, Any]:
    """An on-demand deployment and one request to it with a wrong key and ``request_id`` as its
    ``x-request-id`` (refused 401, so it leaves lines in dgxmm's log); returns the deployment."""
    view = await svc.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    async with caller(svc, key="wrong") as g:
        refused = await g.post(
            f"/{view['id']}/v1/chat/completions",
            json={"model": "m", "messages": []},
            headers={"x-request-id": request_id},
        )
    assert refused.status_code == 401, refused.text
    return view


async def one_slot_taken(svc: Service) -> tuple[dict[str, Any], Any]:
    """A ready on-demand test-engine model ``m`` that takes one request at once
    (``max_concurrent = 1``), its one slot taken here: the next request waits its turn. The
    deployment's view and the slot (``release()`` it to let the next one in)."""
    view = await svc.create(
        name="m", engine="command", memory_gib=1, mode="on_demand", max_concurrent=1, command=engine_command()
    )
    await svc.client.post(f"/api/deployments/{view['id']}/start")
    await svc.wait_state(view["id"], "ready")
    return view, await svc.ctx.ondemand.acquire(view["id"])
