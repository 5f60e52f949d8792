"""Ollama's ``/api/pull`` of an ``hf.co`` name through dgxmm's model store (issue 49 item 6),
against the local hub (tests/hub): with the admin token, the GGUF of the asked quantisation (any
case; Q4_K_M when none is asked) is pulled with Ollama's progress lines; without it, 403 and the
hub is not asked; any other name is 501 saying where dgxmm pulls models."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, gateway_settings
from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import FakeHub

pytestmark = pytest.mark.timeout(60)

Q4 = hashlib.sha256(b"q4").digest() * 2048  # 64 KiB each
Q8 = hashlib.sha256(b"q8").digest() * 4096


def root(svc: Any, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )


async def served(serve: Any, hub: FakeHub, tmp_path: Path) -> Any:
    hub.add("org/tiny-GGUF", {"tiny-Q4_K_M.gguf": Q4, "tiny-Q8_0.gguf": Q8, "README.md": b"# tiny"})
    return await serve(gateway_settings(tmp_path, models={**hub.settings, "reserve_gib": 0}))


def lines_of(resp: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in resp.text.splitlines()]


async def test_a_pull_with_the_admin_token_fetches_the_quant_with_ollamas_progress(
    serve: Any, hub: FakeHub, tmp_path: Path
) -> None:
    svc = await served(serve, hub, tmp_path)
    async with root(svc, svc.ctx.admin_token) as r:
        pulled = await r.post("/api/pull", json={"model": "hf.co/org/tiny-GGUF:q8_0"})
        assert pulled.status_code == 200 and pulled.headers["content-type"] == "application/x-ndjson"
        lines = lines_of(pulled)
        assert lines[0] == {"status": "pulling manifest"}
        assert [line["status"] for line in lines[-3:]] == ["verifying sha256 digest", "writing manifest", "success"]
        done = lines[-4]
        assert done["total"] == done["completed"] == len(Q8) and done["digest"].startswith("sha256:")
        [record] = svc.ctx.models.all()
        assert [f.path for f in record.files] == ["tiny-Q8_0.gguf"]
        assert (Path(str(record.path)) / "tiny-Q8_0.gguf").read_bytes() == Q8

        # No quantisation named: Q4_K_M, Ollama's default; not streamed: the last line alone.
        quiet = await r.post("/api/pull", json={"model": "hf.co/org/tiny-GGUF", "stream": False})
        assert (quiet.status_code, quiet.json()) == (200, {"status": "success"})
        assert sorted(f.path for rec in svc.ctx.models.all() for f in rec.files) == [
            "tiny-Q4_K_M.gguf",
            "tiny-Q8_0.gguf",
        ]
        missing = await r.post("/api/pull", json={"model": "hf.co/org/tiny-GGUF:Q2_K"})
        assert missing.status_code == 404 and "matches none" in missing.json()["error"]


async def test_a_pull_without_the_admin_token_or_of_another_name_is_refused(
    serve: Any, hub: FakeHub, tmp_path: Path
) -> None:
    svc = await served(serve, hub, tmp_path)
    async with root(svc, KEY) as r:
        refused = await r.post("/api/pull", json={"model": "hf.co/org/tiny-GGUF:Q8_0"})
        assert refused.status_code == 403 and "admin token" in refused.json()["error"]
        library = await r.post("/api/pull", json={"model": "llama3.2"})
        assert library.status_code == 501 and "/api/models" in library.json()["error"]
        bad = await r.post("/api/pull", content=b"{oops", headers={"content-type": "application/json"})
        assert bad.status_code == 400
    assert hub.gets("tiny") == [] and svc.ctx.models.all() == []
