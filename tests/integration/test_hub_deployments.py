"""Deployments by name (issue 38 item 3) against the local hub (tests/hub), on a served dgxmm with
the test engine as a ``command`` engine whose answer is its ``{model}``: planned while the file
downloads, its reason the progress, then stopped, and its first request starts an engine given
the local file; the hub asked before a create; a failed pull failed, a start pulling again; the
model protected from deletion while a deployment uses it, also while it downloads."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import KEY, TMPFS_SKIP, Service, caller, engine_command, gateway_settings, sse_events, wait_until
from huggingface_hub import constants

from dgxmm.demo.tiny_gguf import write_tiny_gguf
from dgxmm.deploy.pagecache import cached_bytes
from dgxmm_process import Dgxmm, wait_for
from hub.fixture import hub_fixture  # noqa: F401 (the fixture "hub")
from hub.server import FakeHub
from unit import test_pagecache
from integration import test_full_disk
from integration.test_full_disk import Filler

pytestmark = pytest.mark.timeout(60)
on_disk = test_pagecache.on_disk  # the fixture: a directory on a disk (on tmpfs the pages are the file)
small_disk = test_full_disk.small_disk  # the fixture: a 16 MiB tmpfs (as root)
CHUNK = 4096
WEIGHTS = hashlib.sha256(b"weights").digest() * (256 * 1024 // 32)  # 256 KiB, an LFS file
MODEL = "hf://org/tiny/model.gguf"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "where is your model?"}]}


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub writes in pieces of this size (10 MB by default): small ones, so a stall
    in the middle of the file leaves its first pieces on disk and reports progress."""
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)


async def served(serve: Any, hub: FakeHub, tmp_path: Path, **sections: Any) -> Service:
    models = {**hub.settings, "reserve_gib": 0, "stall_timeout_s": 30, **sections.pop("models", {})}
    return await serve(gateway_settings(tmp_path, models=models, **sections))


async def listed_with_progress(listed: Any) -> dict[str, Any] | None:
    status = await listed()
    return status if status.get("progress", 0) > 0 else None


def answering_its_model(name: str = "tiny", **body: Any) -> dict[str, Any]:
    """A deployment of the test engine that answers with the model path it was given."""
    return {"name": name, "engine": "command", "memory_gib": 1, "command": engine_command("--reply", "{model}"), **body}


async def test_planned_while_it_downloads_then_stopped_and_its_first_request_starts_an_engine_on_the_local_file(
    serve: Any, hub: FakeHub, tmp_path: Path
) -> None:
    repo = hub.add("org/tiny", {"model.gguf": WEIGHTS, "config.json": b"{}"})
    repo.stall_after["model.gguf"] = 10 * CHUNK
    svc = await served(serve, hub, tmp_path)
    seen: list[dict[str, Any]] = []

    subscribed = asyncio.Event()

    async def follow() -> None:
        async with svc.client.stream("GET", "/api/events") as resp:
            subscribed.set()  # (the endpoint subscribes before it answers)
            async for event, data in sse_events(resp):
                if event == "deployment":
                    seen.append(data)

    feed = asyncio.create_task(follow())
    await asyncio.wait_for(subscribed.wait(), 30)
    made = await svc.create(**answering_its_model(model=MODEL, mode="on_demand"))
    assert made["state"] == "planned" and made["model_path"] is None
    downloading = await wait_until(
        lambda: next((v for v in seen if v["state_reason"].startswith("downloading ")), None), 10
    )
    assert downloading["state"] == "planned" and downloading["status"]["code"] == "planned"
    assert f" of {len(WEIGHTS) / 1024**2:.1f} MiB" in downloading["state_reason"]
    # The model list says so, in llama.cpp's shape (issue 50): downloading, and how far.
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
    ) as router:

        async def listed() -> dict[str, Any]:
            [entry] = (await router.get("/models")).json()["data"]
            return dict(entry["status"])

        assert (await listed())["value"] == "downloading"
        status = await wait_until(lambda: listed_with_progress(listed))  # (the store counts bytes each tick)
    assert status["value"] == "downloading" and 0 < status["progress"] < 1, status
    async with caller(svc) as gateway:
        request = asyncio.create_task(gateway.post(f"/{made['id']}/v1/chat/completions", json=CHAT))
        await wait_until(lambda: svc.ctx.ondemand.status(made["id"])["queued"] == 1)
        assert (await svc.view(made["id"]))["state"] == "planned"  # it waits; nothing starts
        repo.stall_after.clear()
        hub.released.set()  # the rest of the file comes (resumed with a range request)
        answer = await request
    assert answer.status_code == 200, answer.text
    view = await svc.view(made["id"])
    local = tmp_path / "data" / "models" / "models--org--tiny" / "snapshots" / repo.commit / "model.gguf"
    assert view["model"] == MODEL and view["model_path"] == str(local)
    assert answer.json()["choices"][0]["message"]["content"] == str(local)  # what the engine was given
    assert local.read_bytes() == WEIGHTS and str(local) in view["command_line"]
    assert hub.gets("model.gguf")[-1].range is not None
    [row] = (await svc.client.get(f"/api/activity?deployment={made['id']}")).json()
    assert row["cold_start"] and row["cached_fraction"] is not None  # counted on the local file
    states = [v["state"] for v in seen if v["id"] == made["id"]]
    assert states.index("planned") < states.index("stopped") < states.index("starting") < states.index("ready")
    feed.cancel()


async def test_an_always_on_deployment_by_name_starts_once_its_file_is_here(
    serve: Any, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add("org/tiny", {"model.gguf": WEIGHTS})
    svc = await served(serve, hub, tmp_path)
    made = await svc.create(**answering_its_model(model=MODEL))
    assert made["state"] == "planned"
    ready = await svc.wait_state(made["id"], "ready")
    assert ready["model_path"].endswith("/model.gguf") and Path(ready["model_path"]).read_bytes() == WEIGHTS
    async with httpx.AsyncClient(timeout=30) as client:
        url = ready["base_url"] + "/v1/chat/completions"
        answer = await client.post(url, json=CHAT, headers=svc.engine_auth(made["id"]))
    assert answer.json()["choices"][0]["message"]["content"] == ready["model_path"]


async def test_the_hub_is_asked_before_a_create_and_what_it_does_not_have_is_422_naming_model(
    serve: Any, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add("org/tiny", {"model.gguf": WEIGHTS})
    svc = await served(serve, hub, tmp_path)
    for model, says in (
        ("hf://org/missing/model.gguf", "repository org/missing not found on the hub (404)"),
        ("hf://org/tiny@nope/model.gguf", "revision 'nope' not found in org/tiny (404)"),
        ("hf://org/tiny/absent.gguf", "org/tiny@main has no file absent.gguf"),
        ("hf://org", "is not hf://ORG/REPO[@REVISION][/PATH]"),
        ("hf://org/tiny/../x.gguf", "would leave the snapshot"),
    ):
        answer = await svc.client.post("/api/deployments", json=answering_its_model(model=model))
        assert answer.status_code == 422, (model, answer.text)
        error = answer.json()["error"]
        assert error["field"] == "model" and error["message"].startswith("model: ") and says in error["message"], error
    big = await svc.client.post(
        "/api/deployments", json={"name": "big", "engine": "llamacpp", "model": MODEL, "memory_gib": 0.0001}
    )
    assert big.status_code == 422 and big.json()["error"]["field"] == "memory_gib", big.text
    assert big.json()["error"]["message"] == (
        f"memory_gib: the model file {MODEL} is 0.00 GiB, more than memory_gib 0.0001 GiB: the engine could never fit"
    )
    assert (await svc.client.get("/api/deployments")).json() == []
    assert hub.gets("model.gguf") == []  # nothing was downloaded for them
    pulled = (await svc.client.post("/api/models", json={"repo": "org/tiny", "include": ["model.gguf"]})).json()
    await wait_until(lambda: svc.ctx.models.get(pulled["id"]).path and svc.ctx.models.readiness_of(MODEL).path)
    local = svc.ctx.models.readiness_of(MODEL).path
    no_gguf = await svc.client.post(
        "/api/deployments", json={"name": "x", "engine": "llamacpp", "model": MODEL, "memory_gib": 1}
    )
    assert no_gguf.status_code == 422, no_gguf.text  # pulled already: its file is checked as a local one
    assert no_gguf.json()["error"]["message"] == (
        f"model: {local}: not a GGUF file (it does not begin with the GGUF magic)"
    )


async def test_a_hub_that_does_not_answer_lets_the_create_go_on_and_its_pull_fails_it(
    serve: Any, hub: FakeHub, tmp_path: Path
) -> None:
    hub.add("org/tiny", {"model.gguf": WEIGHTS})
    svc = await served(serve, hub, tmp_path)
    hub.close()
    made = await svc.create(**answering_its_model(model=MODEL, mode="on_demand"))
    failed = await svc.wait_state(made["id"], "failed")
    assert failed["state_reason"].startswith(f"cannot reach the hub at {hub.url}")


async def test_a_failed_pull_fails_it_with_the_downloads_error_and_a_start_pulls_again(
    serve: Any, hub: FakeHub, tmp_path: Path
) -> None:
    repo = hub.add("org/tiny", {"model.gguf": WEIGHTS})
    repo.corrupt.add("model.gguf")
    svc = await served(serve, hub, tmp_path)
    made = await svc.create(**answering_its_model(model=MODEL, mode="on_demand"))
    failed = await svc.wait_state(made["id"], "failed")
    assert (
        failed["state_reason"].startswith("model.gguf: SHA-256 ") and "the file was not kept" in failed["state_reason"]
    )
    assert failed["model_path"] is None
    async with caller(svc) as gateway:  # within the backoff a request is refused at once, with the reason
        refused = await gateway.post(f"/{made['id']}/v1/chat/completions", json=CHAT)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "start_failed", refused.text
    repo.corrupt.clear()
    started = await svc.client.post(f"/api/deployments/{made['id']}/start")
    assert started.status_code == 200 and started.json()["state"] == "planned", started.text
    stopped = await svc.wait_state(made["id"], "stopped")
    assert Path(stopped["model_path"]).read_bytes() == WEIGHTS


async def test_a_model_a_deployment_uses_is_not_deleted_while_it_downloads_nor_after(
    serve: Any, hub: FakeHub, tmp_path: Path
) -> None:
    repo = hub.add("org/tiny", {"model.gguf": WEIGHTS})
    repo.stall_after["model.gguf"] = 10 * CHUNK
    svc = await served(serve, hub, tmp_path)
    made = await svc.create(**answering_its_model(model=MODEL, mode="on_demand"))
    [record] = await wait_until(lambda: svc.ctx.models.all() or None)
    for _ in range(2):  # downloading, then ready
        refused = await svc.client.delete(f"/api/models/{record.id}")
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "model_in_use", refused.text
        assert "tiny" in refused.json()["error"]["message"]
        repo.stall_after.clear()
        hub.released.set()
        await svc.wait_state(made["id"], "stopped")
    assert (await svc.client.delete(f"/api/deployments/{made['id']}")).status_code == 200
    assert (await svc.client.delete(f"/api/models/{record.id}")).status_code == 200


async def test_a_download_leaves_the_page_cache_with_page_cache_release(
    serve: Any, hub: FakeHub, tmp_path: Path, on_disk: Path
) -> None:
    """Issue 40 item 2, served: the model store's pulls go through the policy's release."""
    hub.add("org/tiny", {"model.gguf": WEIGHTS})
    svc = await served(serve, hub, tmp_path, models={"dir": on_disk / "models"}, memory={"page_cache": "release"})
    made = await svc.create(**answering_its_model(model=MODEL, mode="on_demand"))
    stopped = await svc.wait_state(made["id"], "stopped")
    assert cached_bytes([Path(stopped["model_path"])]) == (0, len(WEIGHTS))


def test_dgxmm_killed_while_a_deployment_downloads_resumes_the_pull_and_the_deployment_at_its_next_start(
    hub: FakeHub, tmp_path: Path
) -> None:
    """SIGKILL in the middle of the file (huggingface_hub writes pieces of 10 MiB: the file is
    24 MiB and the hub stops at 12): the next start resumes with a range request, and the
    deployment, planned all along, becomes stopped on the whole file."""
    piece = 10 * 1024 * 1024
    big = hashlib.sha256(b"seed").digest() * (24 * 1024 * 1024 // 32)
    hub.add("org/big", {"model.gguf": big}).stall_after["model.gguf"] = 12 * 1024 * 1024
    dgxmm = Dgxmm(tmp_path, models={**hub.settings, "reserve_gib": 0})
    dgxmm.start()
    try:
        made = dgxmm.create(**answering_its_model(model="hf://org/big/model.gguf", mode="on_demand"))
        blobs = tmp_path / "data" / "models" / "models--org--big" / "blobs"
        wait_for(lambda: any(p.stat().st_size >= piece for p in blobs.glob("*.incomplete")), 30, "10 MiB on disk")
        assert dgxmm.view(made["id"])["state"] == "planned"
        dgxmm.kill()
        hub.repos["org/big"].stall_after.clear()
        dgxmm.start()
        stopped = dgxmm.wait_state(made["id"], "stopped")
        assert hub.gets("model.gguf")[-1].range == f"bytes={piece}-"
        assert hashlib.sha256(Path(stopped["model_path"]).read_bytes()).digest() == hashlib.sha256(big).digest()
    finally:
        dgxmm.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason=TMPFS_SKIP)
async def test_a_disk_that_fills_during_a_download_fails_it_keeps_the_part_and_dgxmm_serves_on(
    serve: Any, hub: FakeHub, tmp_path: Path, small_disk: Path
) -> None:
    """The models directory on a 16 MiB tmpfs, filled to its last byte in the middle of an 8 MiB
    file: the deployment is failed with the write's error, the part received is kept, dgxmm
    answers; once there is room a start resumes the pull where it stopped."""
    data = hashlib.sha256(b"disk").digest() * (8 * 1024 * 1024 // 32)
    repo = hub.add("org/tiny", {"model.gguf": data})
    repo.stall_after["model.gguf"] = 2 * 1024 * 1024
    svc = await served(serve, hub, tmp_path, models={"dir": small_disk / "models"})
    made = await svc.create(**answering_its_model(model=MODEL, mode="on_demand"))
    blobs = small_disk / "models" / "models--org--tiny" / "blobs"
    await wait_until(lambda: any(p.stat().st_size >= 1024 * 1024 for p in blobs.glob("*.incomplete")))
    disk = Filler(small_disk)
    disk.fill()
    repo.stall_after.clear()
    hub.released.set()
    failed = await svc.wait_state(made["id"], "failed")
    assert "No space left on device (the part downloaded is kept)" in failed["state_reason"], failed
    [part] = blobs.glob("*.incomplete")
    kept = part.stat().st_size
    assert kept >= 1024 * 1024
    assert (await svc.client.get("/api/host")).status_code == 200  # dgxmm serves on
    disk.free()
    assert (await svc.client.post(f"/api/deployments/{made['id']}/start")).json()["state"] == "planned"
    stopped = await svc.wait_state(made["id"], "stopped")
    assert hub.gets("model.gguf")[-1].range == f"bytes={kept}-"
    assert Path(stopped["model_path"]).read_bytes() == data


async def test_a_deployment_declared_in_a_file_with_a_hub_model_is_planned_then_stopped(
    serve: Any, hub: FakeHub, tmp_path: Path
) -> None:
    repo = hub.add("org/tiny", {"model.gguf": WEIGHTS})
    repo.stall_after["model.gguf"] = 10 * CHUNK
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    command = json.dumps(engine_command("--reply", "{model}"))
    (folder / "hub.toml").write_text(
        f'[[deployments]]\nname = "tiny"\nengine = "command"\ncommand = {command}\nmemory_gib = 1\n'
        f'mode = "on_demand"\nmodel = "{MODEL}"\n'
    )
    svc = await served(serve, hub, tmp_path, server={"deployments_dir": folder, "deployments_poll_s": 0.1})
    [declared] = (await svc.client.get("/api/deployments")).json()
    assert declared["managed_by"] == "config" and declared["state"] == "planned"
    repo.stall_after.clear()
    hub.released.set()
    stopped = await svc.wait_state(declared["id"], "stopped")
    assert stopped["model_path"].endswith("/model.gguf")
    assert (await svc.client.get("/api/host")).json()["config"]["error"] is None  # nothing to change in the file


async def test_an_edit_to_a_hub_model_fetches_it_and_a_pulled_name_can_be_estimated(
    serve: Any, hub: FakeHub, tmp_path: Path
) -> None:
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    hub.add("org/tiny", {"model.gguf": WEIGHTS, "tiny.gguf": gguf})
    svc = await served(serve, hub, tmp_path)
    made = await svc.create(**answering_its_model(model="/models/local.gguf", mode="on_demand"))
    missing = await svc.client.patch(f"/api/deployments/{made['id']}", json={"model": "hf://org/tiny/nope.gguf"})
    assert missing.status_code == 422 and missing.json()["error"]["field"] == "model", missing.text
    changed = await svc.client.patch(f"/api/deployments/{made['id']}", json={"model": MODEL})
    assert changed.status_code == 200 and changed.json()["state"] == "planned", changed.text
    assert (await svc.wait_state(made["id"], "stopped"))["model_path"].endswith("/model.gguf")
    early = await svc.client.post("/api/estimate", json={"model": "hf://org/tiny/tiny.gguf"})
    assert early.status_code == 422 and "not pulled yet" in early.json()["error"]["message"], early.text
    await svc.client.post("/api/models", json={"repo": "org/tiny", "include": ["tiny.gguf"]})
    await wait_until(lambda: svc.ctx.models.readiness_of("hf://org/tiny/tiny.gguf").path)
    estimate = await svc.client.post("/api/estimate", json={"model": "hf://org/tiny/tiny.gguf", "ctx": 512})
    assert estimate.status_code == 200 and estimate.json()["context"] == 512, estimate.text


async def test_questions_to_a_hub_that_does_not_answer_are_bounded(serve: Any, hub: FakeHub, tmp_path: Path) -> None:
    """Each create of a hub model asks the hub in a thread: at most 4 at once, the next one is
    503 ``server_busy`` before it asks; once the hub answers, the four are created."""
    hub.add("org/tiny", {"model.gguf": WEIGHTS}, stall_info=True)
    svc = await served(serve, hub, tmp_path)
    creates = [
        asyncio.create_task(svc.client.post("/api/deployments", json=answering_its_model(f"m{i}", model=MODEL)))
        for i in range(4)
    ]
    await wait_until(lambda: len([s for s in hub.seen if "/api/models/org/tiny" in s.path]) == 4)
    busy = await svc.client.post("/api/deployments", json=answering_its_model("m4", model=MODEL))
    assert busy.status_code == 503 and busy.json()["error"]["code"] == "server_busy", busy.text
    hub.released.set()
    assert [(await c).status_code for c in creates] == [201] * 4
