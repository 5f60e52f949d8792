"""SIGTERM during traffic, on a real ``dgxmm serve``: every waiting request is answered 503 at
once, nothing starts, streams in flight finish within the grace, engines are stopped and recorded
``stopped`` (never ``failed``); a second signal ends the grace at once."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from conftest import engine_command
from served import Served, until

WORDS = " ".join(f"w{i}" for i in range(20))
EVENTS = 23  # the role, 20 words, the finish reason, [DONE]


class Stream(threading.Thread):
    """One streaming chat completion through the gateway, read to its end (or its cut)."""

    def __init__(self, served: Served, deployment_id: str) -> None:
        super().__init__(daemon=True)
        self.served, self.deployment_id = served, deployment_id
        self.first = threading.Event()
        self.events: list[str] = []
        self.error: str | None = None
        self.done_at: float | None = None

    def run(self) -> None:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        try:
            with (
                self.served.gateway() as g,
                g.stream("POST", f"/{self.deployment_id}/v1/chat/completions", json=body) as resp,
            ):
                assert resp.status_code == 200, resp.read()
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.first.set()
        except (httpx.HTTPError, AssertionError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.done_at = time.monotonic()
            self.first.set()


def deploy(served: Served, admin: httpx.Client, name: str, delay: float) -> dict[str, Any]:
    resp = admin.post(
        "/deployments",
        json={
            "name": name,
            "engine": "command",
            "memory_gib": 1,
            "mode": "on_demand",
            "idle_timeout_s": 3600,
            "command": engine_command("--chunk-delay", str(delay), "--reply", WORDS),
        },
    )
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def rows(served: Served, sql: str) -> list[sqlite3.Row]:
    conn = sqlite3.connect(served.data_dir / "dgxmm.db")
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def busy_pair_and_a_queued_request(served: Served, delay: float) -> tuple[list[Stream], dict[str, Any], Any]:
    """Two models streaming (capacity 2 GiB, so both are busy and neither can make room) and a
    third one's request waiting in the memory queue."""
    with served.admin() as admin:
        a, b, c = (deploy(served, admin, name, delay) for name in "abc")
        streams = [Stream(served, a["id"]), Stream(served, b["id"])]
        for stream in streams:
            stream.start()
            assert stream.first.wait(60) and stream.error is None, stream.error
        queued: dict[str, Any] = {}

        def wait_for_c() -> None:
            with served.gateway() as g:
                resp = g.post(f"/{c['id']}/v1/chat/completions", json={"model": "m", "messages": []})
            queued.update(status=resp.status_code, body=resp.json(), at=time.monotonic())

        waiter = threading.Thread(target=wait_for_c, daemon=True)
        waiter.start()
        until(lambda: admin.get(f"/deployments/{c['id']}").json()["ondemand"]["phase"] == "queued")
    return streams, {"a": a, "b": b, "c": c, "queued": queued}, waiter


def test_sigterm_answers_waiters_lets_streams_finish_and_records_engines_stopped(tmp_path: Path) -> None:
    served = Served(tmp_path, {"DGXMM_MEMORY__CAPACITY_GIB": "2", "DGXMM_SERVER__SHUTDOWN_GRACE_S": "60"}).start()
    try:
        streams, deps, waiter = busy_pair_and_a_queued_request(served, delay=0.15)
        served.signal(signal.SIGTERM)
        waiter.join(30)
        queued = deps["queued"]
        assert queued["status"] == 503 and queued["body"]["error"]["code"] == "shutting_down"
        for stream in streams:
            stream.join(60)
            assert stream.error is None and stream.events[-1] == "[DONE]" and len(stream.events) == EVENTS
            assert queued["at"] < stream.done_at  # answered at once, not after the streams
        assert served.wait(60) in (0, -signal.SIGTERM)
    finally:
        served.stop()
    states = {row["name"]: (row["state"], row["state_reason"]) for row in rows(served, "SELECT * FROM deployments")}
    assert states == {"a": ("stopped", "dgxmm stopped"), "b": ("stopped", "dgxmm stopped"), "c": ("stopped", "")}
    texts = [(row["deployment_id"], row["text"]) for row in rows(served, "SELECT * FROM events")]
    assert not [t for t in texts if "Failed" in t[1]]
    assert not [t for t in texts if t[0] == deps["c"]["id"] and t[1] in ("Starting", "Started for a request")]
    assert not (served.data_dir / "logs" / f"{deps['c']['id']}.log").exists()  # its engine never ran
    assert (deps["a"]["id"], "Stopped: dgxmm stopped") in texts


def test_a_second_sigterm_skips_the_grace_and_still_records_engines_stopped(tmp_path: Path) -> None:
    served = Served(tmp_path, {"DGXMM_MEMORY__CAPACITY_GIB": "2", "DGXMM_SERVER__SHUTDOWN_GRACE_S": "600"}).start()
    try:
        streams, deps, waiter = busy_pair_and_a_queued_request(served, delay=30)  # streams of 10 minutes
        served.signal(signal.SIGTERM)
        waiter.join(30)
        assert deps["queued"]["status"] == 503
        until(lambda: "requests finish (up to 600 s" in served.log())
        served.signal(signal.SIGTERM)
        assert served.wait(120) in (0, -signal.SIGTERM)  # long before the streams or the grace end
        for stream in streams:
            stream.join(30)
            assert stream.events[-1] != "[DONE]"  # cut
    finally:
        served.stop()
    states = {row["name"]: (row["state"], row["state_reason"]) for row in rows(served, "SELECT * FROM deployments")}
    assert states == {"a": ("stopped", "dgxmm stopped"), "b": ("stopped", "dgxmm stopped"), "c": ("stopped", "")}
    assert not [r for r in rows(served, "SELECT text FROM events") if "Failed" in r["text"]]
    assert "second SIGTERM: not waiting for requests in flight" in served.log()


def test_a_shutdown_ends_the_consoles_open_streams_cleanly(tmp_path: Path) -> None:
    """A page left open (the event stream, the activity feed, an engine's log) at a SIGTERM, and
    a client of llama.cpp's model status stream (``/models/sse``, through the gateway): each
    stream ends as a finished one does (its chunked body completed, so the browser just
    reconnects), and uvicorn has no incomplete answer to log."""
    served = Served(tmp_path).start()
    try:
        with served.admin() as admin:
            dep = admin.post(
                "/deployments", json={"name": "m", "engine": "command", "memory_gib": 1, "command": engine_command()}
            ).json()
        models_sse = f"http://127.0.0.1:{served.port}/models/sse"  # the root's, with the gateway's key
        paths = ["/events", "/activity/stream", f"/deployments/{dep['id']}/logs/follow", models_sse]
        opened = [threading.Event() for _ in paths]
        outcomes: dict[str, str] = {}

        def read(path: str, first: threading.Event) -> None:
            try:
                client = served.gateway(timeout=60) if path == models_sse else served.admin(timeout=60)
                with client, client.stream("GET", path) as resp:
                    first.set()
                    assert resp.status_code == 200, resp.read()
                    for _ in resp.iter_lines():
                        pass
                outcomes[path] = "ended"
            except (httpx.HTTPError, AssertionError) as exc:
                outcomes[path] = f"{type(exc).__name__}: {exc}"
            finally:
                first.set()

        readers = [threading.Thread(target=read, args=pair, daemon=True) for pair in zip(paths, opened, strict=True)]
        for reader in readers:
            reader.start()
        assert all(first.wait(30) for first in opened)
        served.signal(signal.SIGTERM)
        for reader in readers:
            reader.join(30)
        assert outcomes == dict.fromkeys(paths, "ended")
        assert served.wait(60) in (0, -signal.SIGTERM)
    finally:
        served.stop()
    assert "ASGI callable returned without completing response" not in served.log()
