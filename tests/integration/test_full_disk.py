"""A failing disk (issue 26): the data directory on a small tmpfs, filled to the brim while dgxmm
runs. Stop still stops; a dead engine is still found; a start whose ready record cannot be
written is stopped and reported; the admin API refuses changes with 503 ``store_unavailable``,
but for a caller key's revocation or change, in force at once (issue 47); and once there is room
again dgxmm writes what it kept and accepts changes, without a restart.

Mounting a tmpfs needs root (CI runs as root)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TMPFS_SKIP, Service, caller, engine_command, gateway_settings, make_settings, wait_until
from integration.test_caller_keys import code_of, new_key, router
from integration.test_engine_faults import gone, pid_of
from integration.test_key_revocation import ended_with, streaming

pytestmark = [
    pytest.mark.hostile,  # issue 26's attacks: also run by `pytest -m hostile`
    pytest.mark.skipif(os.geteuid() != 0, reason=TMPFS_SKIP),
]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs; unmounted at the end (after the service: fixtures end in reverse)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


class Filler:
    """Fills a file system to its last byte, and frees it again."""

    def __init__(self, mount: Path) -> None:
        self.path = mount / "filler"

    def fill(self) -> None:
        with open(self.path, "ab", buffering=0) as out:
            for size in (1 << 20, 4096, 1):  # big pieces, then the last pages, then the last bytes
                with contextlib.suppress(OSError):
                    while True:
                        out.write(b"\0" * size)
        probe = self.path.with_name("probe")
        with pytest.raises(OSError) as caught, open(probe, "wb", buffering=0) as out:
            out.write(b"\0" * 4096)
        assert caught.value.errno == errno.ENOSPC
        probe.unlink()

    def free(self) -> None:
        self.path.unlink()


async def served_on(serve, disk: Path, tmp_path: Path) -> Service:  # type: ignore[no-untyped-def]
    return await serve(make_settings(tmp_path, server={"data_dir": disk / "data"}))


async def ready_always_on(svc: Service) -> str:
    """An always-on deployment of the test engine, ready; its id."""
    view = await svc.create(name="m", engine="command", memory_gib=1, command=engine_command())
    await svc.wait_state(view["id"], "ready")
    return str(view["id"])


def stored_state(disk: Path, deployment_id: str) -> str | None:
    """The state on disk, read once dgxmm has closed the database."""
    with contextlib.closing(sqlite3.connect(disk / "data" / "dgxmm.db")) as conn:
        row = conn.execute("SELECT state FROM deployments WHERE id = ?", (deployment_id,)).fetchone()
    return None if row is None else str(row[0])


async def test_with_a_full_disk_stop_stops_and_changes_are_refused_until_there_is_room(
    serve,
    small_disk: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    svc = await served_on(serve, small_disk, tmp_path)
    dep_id = await ready_always_on(svc)
    pid = pid_of(svc, dep_id)
    filler = Filler(small_disk)
    filler.fill()

    resp = await svc.client.post(f"/api/deployments/{dep_id}/stop")
    assert resp.status_code == 200, resp.text  # it used to be 500, the engine left running
    await wait_until(lambda: gone(pid), 10)
    assert (await svc.view(dep_id))["state"] == "stopped"

    for method, path, body in (
        ("POST", "/api/deployments", {"name": "n", "engine": "command", "memory_gib": 1, "command": engine_command()}),
        ("PATCH", f"/api/deployments/{dep_id}", {"memory_gib": 2}),
        ("POST", f"/api/deployments/{dep_id}/start", None),
        ("DELETE", f"/api/deployments/{dep_id}", None),
    ):
        resp = await svc.client.request(method, path, json=body)
        assert resp.status_code == 503, (method, path, resp.text)
        assert resp.json()["error"]["code"] == "store_unavailable", resp.text
    assert [d["name"] for d in (await svc.client.get("/api/deployments")).json()] == ["m"]

    filler.free()  # room again: the next change is accepted, no restart
    resp = await svc.client.post(f"/api/deployments/{dep_id}/start")
    assert resp.status_code == 200, resp.text
    await svc.wait_state(dep_id, "ready")
    await svc.shutdown()
    assert stored_state(small_disk, dep_id) == "stopped"  # (recorded stopped at shutdown, as always)


async def test_a_refused_change_leaves_the_store_unwritable_until_there_is_room(
    serve,
    small_disk: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Nothing is kept after a refused create: the store's check must write to find out (on a
    full disk an empty transaction commits), or it would read as writable, log its recovery and
    fail again with the next change."""
    svc = await served_on(serve, small_disk, tmp_path)
    filler = Filler(small_disk)
    filler.fill()
    resp = await svc.client.post(
        "/api/deployments",
        json={"name": "n", "engine": "command", "memory_gib": 1, "mode": "on_demand", "command": engine_command()},
    )
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "store_unavailable", resp.text
    assert svc.ctx.store.flush() is False and not svc.ctx.store.writable
    filler.free()
    assert svc.ctx.store.flush() is True


async def test_with_a_full_disk_a_dead_engine_is_found_and_recorded_once_there_is_room(
    serve,
    small_disk: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    svc = await served_on(serve, small_disk, tmp_path)
    dep_id = await ready_always_on(svc)
    filler = Filler(small_disk)
    filler.fill()
    os.kill(pid_of(svc, dep_id), signal.SIGKILL)
    failed = await svc.wait_state(dep_id, "failed")  # it used to stay ready (callers got 502)
    assert "exited" in failed["state_reason"], failed["state_reason"]
    assert not svc.ctx.store.writable
    filler.free()
    await wait_until(lambda: svc.ctx.store.writable, 10)  # written back without any request
    await svc.shutdown()
    assert stored_state(small_disk, dep_id) == "failed"


async def test_a_start_whose_ready_record_cannot_be_written_is_stopped_and_reported(
    serve,
    small_disk: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    svc = await served_on(serve, small_disk, tmp_path)
    view = await svc.create(name="m", engine="command", memory_gib=1, command=engine_command("--start-delay", "3"))
    dep_id = view["id"]
    await wait_until(lambda: svc.ctx.deployer.get(dep_id).runtime_handle is not None, 10)
    pid = pid_of(svc, dep_id)
    filler = Filler(small_disk)
    filler.fill()
    failed = await svc.wait_state(dep_id, "failed", timeout=30)  # it used to stay starting, unwatched
    assert "database" in failed["state_reason"], failed["state_reason"]
    await wait_until(lambda: gone(pid), 10)
    filler.free()
    await wait_until(lambda: svc.ctx.store.writable, 10)
    await svc.shutdown()
    assert stored_state(small_disk, dep_id) == "failed"


async def test_with_a_full_disk_an_on_demand_request_is_refused_with_the_reason(
    serve,
    small_disk: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    settings = gateway_settings(tmp_path, server={"data_dir": small_disk / "data"}, ondemand={"backoff_initial_s": 0})
    svc = await serve(settings)
    view = await svc.create(name="m", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    filler = Filler(small_disk)
    filler.fill()
    async with caller(svc) as c:
        url = f"/{view['id']}/v1/chat/completions"
        resp = await c.post(url, json=CHAT)  # the start's first write to the disk is its engine's log
        assert resp.status_code == 503, resp.text
        error = resp.json()["error"]
        assert error["code"] == "start_failed" and "cannot write the engine's log" in error["message"], error
        assert "No space left on device" in error["message"], error
        resp = await c.post(url, json=CHAT)  # the store knows now: no start is tried
        error = resp.json()["error"]
        assert resp.status_code == 503 and error["code"] == "start_failed", resp.text
        assert "cannot start: the database" in error["message"] and "is full" in error["message"], error
        filler.free()
        resp = await c.post(url, json=CHAT)  # room again: it starts
        assert resp.status_code == 200, resp.text


async def test_with_a_full_disk_a_revoked_key_is_refused_at_once_and_stays_revoked_once_written(
    serve,
    small_disk: Path,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Issue 47, finding 5: the revocation used to answer 503 and leave the key working."""
    settings = gateway_settings(tmp_path, server={"data_dir": small_disk / "data"})
    svc = await serve(settings)
    view = await svc.create(name="a-1", engine="command", memory_gib=1, command=engine_command("--chunk-delay", "60"))
    await svc.wait_state(view["id"], "ready")
    made, kept = await new_key(svc, name="alice"), await new_key(svc, name="bob", models=["a-*", "b-*"])
    filler = Filler(small_disk)
    async with router(svc, made["key"]) as r, streaming(r, "a-1") as stream:
        filler.fill()
        revoked = await svc.client.delete(f"/api/keys/{made['id']}")
        assert revoked.status_code == 202, revoked.text
        answer = revoked.json()
        assert answer["revoked"] is True and answer["persisted"] is False and "database" in answer["message"]
        ended_with(await stream.rest(), "key_revoked")
        refused = await r.post("/chat/completions", json={**CHAT, "model": "a-1"})
        assert refused.status_code == 401 and code_of(refused) == "invalid_api_key"
    narrowed = await svc.client.patch(f"/api/keys/{kept['id']}", json={"models": ["b-*"], "tokens_per_day": 5})
    assert narrowed.status_code == 200 and narrowed.json()["persisted"] is False, narrowed.text
    async with router(svc, kept["key"]) as r:
        refused = await r.post("/chat/completions", json={**CHAT, "model": "a-1"})
        assert refused.status_code == 404 and code_of(refused) == "model_not_found", "narrowed at once"
    assert not svc.ctx.store.writable

    filler.free()  # room again: the next usage flush writes what was kept, first
    await wait_until(lambda: not svc.ctx.callers.unwritten(), 20)
    await svc.shutdown()
    with contextlib.closing(sqlite3.connect(small_disk / "data" / "dgxmm.db")) as conn:
        rows = conn.execute("SELECT id, models, tokens_per_day FROM caller_keys").fetchall()
    assert [(key_id, json.loads(models), tokens) for key_id, models, tokens in rows] == [(kept["id"], ["b-*"], 5)]
    again = await serve(settings)  # and a restart does not bring the key back
    assert [key["id"] for key in (await again.client.get("/api/keys")).json()] == [kept["id"]]
    async with router(again, made["key"]) as r:
        assert (await r.get("/models")).status_code == 401
