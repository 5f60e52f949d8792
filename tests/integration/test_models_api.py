"""``/api/models`` against the local hub (tests/hub): a pull answers 202 and reports its
progress as ``event: model`` until it is ready; pulling it again is 200 and fetches nothing;
bad input is 422 naming the field; a model a deployment uses is 409 ``model_in_use``; the
host's ``disk`` shows the models directory."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import engine_command, make_settings, sse_events, wait_until
from dgxmm.cli import pull
from dgxmm_process import Dgxmm, wait_for
from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import FakeHub

pytestmark = pytest.mark.timeout(60)
WEIGHTS = bytes(range(256)) * 400
CONFIG = b'{"model_type": "llama"}'


async def test_pull_list_read_and_delete_through_the_api(serve: Any, hub: FakeHub, tmp_path: Path) -> None:
    hub.add("org/tiny", {"model.gguf": WEIGHTS, "config.json": CONFIG})
    svc = await serve(make_settings(tmp_path, models={**hub.settings, "reserve_gib": 0}))
    seen: list[dict[str, Any]] = []

    subscribed = asyncio.Event()

    async def follow() -> None:
        async with svc.client.stream("GET", "/api/events") as resp:
            subscribed.set()  # (the endpoint subscribes before it answers)
            async for event, data in sse_events(resp):
                if event == "model":
                    seen.append(data)

    feed = asyncio.create_task(follow())
    await asyncio.wait_for(subscribed.wait(), 30)
    answer = await svc.client.post("/api/models", json={"repo": "org/tiny"})
    assert answer.status_code == 202, answer.text
    record = answer.json()
    assert record["status"] == "downloading" and record["bytes_total"] == len(WEIGHTS) + len(CONFIG)
    await wait_until(lambda: any(e["status"] == "ready" for e in seen))
    feed.cancel()
    assert seen[0]["status"] == "downloading"
    got = (await svc.client.get(f"/api/models/{record['id']}")).json()
    assert got["status"] == "ready" and got["bytes_done"] == got["bytes_total"]
    assert (
        hashlib.sha256((Path(got["path"]) / "model.gguf").read_bytes()).hexdigest()
        == hashlib.sha256(WEIGHTS).hexdigest()
    )
    assert [m["id"] for m in (await svc.client.get("/api/models")).json()] == [record["id"]]
    fetched = len(hub.gets("model.gguf"))
    again = await svc.client.post("/api/models", json={"repo": "org/tiny"})
    assert again.status_code == 200 and again.json()["status"] == "ready"
    assert len(hub.gets("model.gguf")) == fetched

    disk = (await svc.client.get("/api/host")).json()["disk"]
    assert disk["dir"] == str(tmp_path / "data" / "models") and disk["free_gib"] > 0 and disk["models"] == 1
    assert disk["held_gib"] == round((len(WEIGHTS) + len(CONFIG)) / 1024**3, 3)

    dep = await svc.create(
        name="a", engine="command", memory_gib=1, model=f"{got['path']}/model.gguf", command=engine_command()
    )
    refused = await svc.client.delete(f"/api/models/{record['id']}")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_in_use", refused.text
    assert "a" in refused.json()["error"]["message"]
    await svc.client.post(f"/api/deployments/{dep['id']}/stop")
    assert (await svc.client.delete(f"/api/deployments/{dep['id']}")).status_code == 200
    removed = await svc.client.delete(f"/api/models/{record['id']}")
    assert removed.status_code == 200, removed.text
    assert not (Path(got["path"]) / "model.gguf").exists()
    assert (await svc.client.get(f"/api/models/{record['id']}")).status_code == 404


async def test_bad_input_is_422_naming_the_field(serve: Any, hub: FakeHub, tmp_path: Path) -> None:
    hub.add("org/tiny", {"model.gguf": WEIGHTS})
    svc = await serve(make_settings(tmp_path, models={**hub.settings, "reserve_gib": 0}))
    for body, field in (
        ({"repo": "../etc"}, "repo"),
        ({"repo": "org/tiny", "revision": "../x"}, "revision"),
        ({"repo": "org/tiny", "include": ["*.safetensors"]}, "include"),
        ({"repo": "org/tiny", "extra": 1}, "extra"),
    ):
        answer = await svc.client.post("/api/models", json=body)
        assert answer.status_code == 422, (body, answer.text)
        assert answer.json()["error"]["field"] == field, answer.text
    missing = await svc.client.post("/api/models", json={"repo": "org/missing"})
    assert missing.status_code == 202 and missing.json()["status"] == "failed"
    assert "404" in missing.json()["error"]


def test_dgxmm_killed_mid_download_resumes_with_a_range_request(hub: FakeHub, tmp_path: Path) -> None:
    """SIGKILL in the middle of a file: the next start resumes the pull from the bytes on disk
    (huggingface_hub writes in pieces of 10 MiB, so the file is 24 MiB and the hub stops at 12)."""
    chunk = 10 * 1024 * 1024
    big = hashlib.sha256(b"seed").digest() * (24 * 1024 * 1024 // 32)
    hub.add("org/big", {"model.gguf": big}).stall_after["model.gguf"] = 12 * 1024 * 1024
    dgxmm = Dgxmm(tmp_path, models={**hub.settings, "reserve_gib": 0})
    dgxmm.start()
    try:
        record = dgxmm.call("POST", "/models", json={"repo": "org/big"}).json()
        partial = tmp_path / "data" / "models" / "models--org--big" / "blobs"
        wait_for(lambda: any(p.stat().st_size >= chunk for p in partial.glob("*.incomplete")), 30, "10 MiB on disk")
        dgxmm.kill()
        hub.repos["org/big"].stall_after.clear()
        dgxmm.start()
        wait_for(lambda: dgxmm.call("GET", f"/models/{record['id']}").json()["status"] == "ready", 60, "ready")
        assert hub.gets("model.gguf")[-1].range == f"bytes={chunk}-"
        path = Path(dgxmm.call("GET", f"/models/{record['id']}").json()["path"]) / "model.gguf"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == hashlib.sha256(big).hexdigest()
    finally:
        dgxmm.stop()


async def test_dgxmm_pull_asks_the_running_dgxmm_and_prints_where_the_model_is(
    serve: Any, hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.add("org/tiny", {"model.gguf": WEIGHTS, "config.json": CONFIG})
    svc = await serve(make_settings(tmp_path, models={**hub.settings, "reserve_gib": 0}))
    assert await asyncio.to_thread(pull, svc.settings, "org/tiny", "main", ["*.gguf"], 0.1) == 0
    [record] = (await svc.client.get("/api/models")).json()
    assert capsys.readouterr().out.strip().endswith(f"org/tiny: ready in {record['path']}")
    assert [f["path"] for f in record["files"]] == ["model.gguf"]
    assert await asyncio.to_thread(pull, svc.settings, "org/missing", "main", [], 0.1) == 1
    assert "not found" in capsys.readouterr().err


async def test_a_repositorys_files_before_a_pull_for_the_admin_only(serve: Any, hub: FakeHub, tmp_path: Path) -> None:
    """``GET /api/models/files``: the files and sizes as the hub lists them, filtered by the
    include globs the pull would apply; the hub's refusals keep its status (404, 401 with what to
    set) in the error envelope; a model's record names the deployments that use it. A viewer
    token is 403 before the hub is asked (dgxmm asks with the operator's hub token: issue 47
    item 7), and still reads the models pulled."""
    hub.add("org/tiny", {"model.gguf": WEIGHTS, "config.json": CONFIG})
    hub.add("org/private", {"model.gguf": WEIGHTS}, token="hf_x", private=True)
    svc = await serve(make_settings(tmp_path, models={**hub.settings, "reserve_gib": 0}))
    listed = await svc.client.get("/api/models/files", params={"repo": "org/tiny"})
    assert listed.status_code == 200, listed.text
    assert [(f["path"], f["size"]) for f in listed.json()["files"]] == [
        ("config.json", len(CONFIG)),
        ("model.gguf", len(WEIGHTS)),
    ]
    ggufs = await svc.client.get("/api/models/files", params={"repo": "org/tiny", "include": ["*.gguf", "x*"]})
    assert ggufs.json()["matched"] == 1 and ggufs.json()["bytes_matched"] == len(WEIGHTS)
    made = await svc.client.post("/api/tokens", json={"name": "dashboard", "role": "viewer"})
    asked = len(hub.seen)
    async with httpx.AsyncClient(
        base_url=svc.url, headers={"Authorization": f"Bearer {made.json()['token']}"}, timeout=30
    ) as viewer:
        for params in ({"repo": "org/private"}, {"repo": "../etc"}, {}):
            refused = await viewer.get("/api/models/files", params=params)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "forbidden"
            assert "may not make dgxmm ask the hub" in refused.json()["error"]["message"]
    assert len(hub.seen) == asked
    for params, status, code in (
        ({"repo": "org/missing"}, 404, "repo_not_found"),
        ({"repo": "org/tiny", "revision": "v9"}, 404, "revision_not_found"),
        ({"repo": "org/private"}, 401, "repo_not_found"),
        ({"repo": "../etc"}, 422, "invalid_input"),
        ({}, 422, "invalid_input"),
    ):
        answer = await svc.client.get("/api/models/files", params=params)
        assert answer.status_code == status and answer.json()["error"]["code"] == code, (params, answer.text)
    private = await svc.client.get("/api/models/files", params={"repo": "org/private"})
    assert "hub_token_file" in private.json()["error"]["message"]
    assert (await svc.client.get("/api/models/files", params={"repo": "../etc"})).json()["error"]["field"] == "repo"

    record = (await svc.client.post("/api/models", json={"repo": "org/tiny", "include": ["*.gguf"]})).json()
    assert record["used_by"] == []
    await svc.create(
        name="chat",
        engine="command",
        memory_gib=1,
        mode="on_demand",  # (no engine started: only its model matters here)
        model="hf://org/tiny/model.gguf",
        command=engine_command(),
    )
    listed_record = {m["id"]: m for m in (await svc.client.get("/api/models")).json()}[record["id"]]
    assert listed_record["used_by"] == ["chat"]
    async with httpx.AsyncClient(
        base_url=svc.url, headers={"Authorization": f"Bearer {made.json()['token']}"}, timeout=30
    ) as viewer:
        assert record["id"] in [m["id"] for m in (await viewer.get("/api/models")).json()]
        assert (await viewer.get(f"/api/models/{record['id']}")).json()["used_by"] == ["chat"]
