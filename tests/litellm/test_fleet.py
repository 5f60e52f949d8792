"""Two dgxmm instances (own data directories and ports, one machine) registering into one real
LiteLLM with PostgreSQL: neither touches the other's entries over sync passes and restarts, one
served name on both hosts is balanced across them, warm-first routing sends everything to the
warm host and wakes exactly one copy once none is warm, and a dead warm host's requests fall over
to the cold copy. Entries from before instance ids are adopted only by their owner.

The proxy is shared with the other tests of the run: these tests only look at the entries of the
instances they started, and purge them at the end.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Service, engine_command, gateway_settings, wait_until
from litellm_proxy import (
    MASTER,
    URL,
    entries_of,
    litellm_section,
    model_info,
    needs_litellm,
    proxy_client,
    purge_instances,
)

from dgxmm.settings import Settings

pytestmark = [pytest.mark.timeout(300), needs_litellm]
HI = [{"role": "user", "content": "hi"}]


@dataclass
class Host:
    """One dgxmm of the fleet: its settings (kept for a restart) and the running service."""

    settings: Settings
    svc: Service
    instance: str = ""

    async def deploy(self, name: str) -> dict[str, Any]:
        return await self.svc.create(
            name=name, served_name=name, engine="command", memory_gib=1, mode="on_demand", command=engine_command()
        )

    async def registered(self, deployment_id: str) -> None:
        async def check() -> bool:
            return (await self.svc.view(deployment_id))["litellm"]["status"] == "registered"

        await wait_until(check, timeout=60, interval=0.3)

    def chats(self, deployment_id: str) -> int:
        """Chat requests the engine of ``deployment_id`` logged (it writes one line per request)."""
        log = self.settings.server.data_dir / "logs" / f"{deployment_id}.log"
        text = log.read_text() if log.exists() else ""
        return sum(line == "POST /v1/chat/completions" for line in text.splitlines())

    async def starts(self, deployment_id: str) -> int:
        resp = await self.svc.client.get("/api/events/history", params={"deployment_id": deployment_id})
        return sum(row["text"] == "Starting" for row in resp.json())


@dataclass
class Fleet:
    serve: Callable[..., Awaitable[Service]]
    tmp: Path
    hosts: list[Host] = field(default_factory=list)

    async def host(self, name: str, **litellm: Any) -> Host:
        folder = self.tmp / name
        folder.mkdir()
        settings = gateway_settings(folder, ondemand={"allowed_cidrs": ["127.0.0.1/32"], "reaper_interval_s": 0.5})
        port = settings.server.port
        section = {
            **litellm_section(folder),
            "sync_interval_s": 2,
            "internal_url": f"http://127.0.0.1:{port}/dgxmm",
            **litellm,
        }
        settings = settings.model_copy(update={"litellm": settings.litellm.model_copy(update=section)})
        host = Host(settings, await self.serve(settings))
        host.instance = host.svc.ctx.instance_id
        self.hosts.append(host)
        return host

    async def restart(self, host: Host) -> None:
        await host.svc.shutdown()
        host.svc = await self.serve(host.settings)
        assert host.svc.ctx.instance_id == host.instance  # kept in its database
        await wait_until(lambda: host.svc.ctx.litellm.ready, timeout=60, interval=0.2)


@pytest.fixture
async def fleet(serve, tmp_path: Path) -> AsyncIterator[Fleet]:
    f = Fleet(serve, tmp_path)
    yield f
    for host in f.hosts:
        await host.svc.shutdown()
    await purge_instances(tmp_path, *(h.instance for h in f.hosts))


def entry_ids(entries: list[dict[str, Any]]) -> set[str]:
    return {e["model_info"]["id"] for e in entries}


async def orders(host: Host, name: str) -> list[int | None]:
    return [e["litellm_params"].get("order") for e in await entries_of(host.instance) if e["model_name"] == name]


async def test_two_instances_keep_each_others_entries(fleet: Fleet) -> None:
    # Only the syncs the test runs, and those a change triggers: a periodic pass of a's between
    # the legacy entries' making and b's pass would adopt a's one before b is checked to leave
    # it (seen on a loaded machine, where the 2 s period elapsed in that window).
    a, b = await fleet.host("a", sync_interval_s=3600), await fleet.host("b", sync_interval_s=3600)
    assert a.instance != b.instance
    shared = f"shared-{uuid.uuid4().hex[:6]}"
    views = [await a.deploy(shared), await a.deploy(f"{shared}-a"), await b.deploy(shared)]
    for host, view in zip((a, a, b), views, strict=True):
        await host.registered(view["id"])
    legacy = [await add_legacy(views[1]["id"], f"{shared}-a"), await add_legacy("0ld0ld0ld0ld", shared)]
    try:
        await adopted_by_a_only(a, b, legacy)
    finally:
        await delete_entries(legacy[1])
    mine_a, mine_b = await entries_of(a.instance), await entries_of(b.instance)
    assert sorted(e["model_name"] for e in mine_a) == [shared, f"{shared}-a"]
    assert [e["model_name"] for e in mine_b] == [shared]
    before = entry_ids(mine_a) | entry_ids(mine_b)

    for _ in range(3):  # sync passes of both, one after the other: nothing to write
        writes = a.svc.ctx.litellm.writes + b.svc.ctx.litellm.writes
        assert await a.svc.ctx.litellm.sync_once() and await b.svc.ctx.litellm.sync_once()
        assert a.svc.ctx.litellm.writes + b.svc.ctx.litellm.writes == writes
    for host in (a, b):
        await fleet.restart(host)
        assert entry_ids(await entries_of(a.instance)) | entry_ids(await entries_of(b.instance)) == before
    assert (await b.svc.client.get("/api/host")).json()["instance_id"] == b.instance

    resp = await a.svc.client.delete(f"/api/deployments/{views[0]['id']}")
    assert resp.status_code == 200

    async def only_a_lost_it() -> bool:
        return [e["model_name"] for e in await entries_of(a.instance)] == [f"{shared}-a"]

    await wait_until(only_a_lost_it, timeout=60, interval=0.5)
    assert entry_ids(await entries_of(b.instance)) == entry_ids(mine_b)


async def add_legacy(deployment_id: str, name: str) -> str:
    """An entry as a dgxmm from before instance ids wrote it: a dgxmm_id, no instance."""
    body = {
        "model_name": name,
        "litellm_params": {
            "model": f"openai/{name}",
            "api_key": "sk-old",
            "api_base": f"http://127.0.0.1:9/dgxmm/ondemand/{deployment_id}/v1",
        },
        "model_info": {"dgxmm_id": deployment_id},
    }
    async with httpx.AsyncClient(timeout=60) as c:
        resp = await c.post(f"{URL}/model/new", json=body, headers={"Authorization": f"Bearer {MASTER}"})
        resp.raise_for_status()
        return str(resp.json()["model_id"])


async def delete_entries(*entry_ids: str) -> None:
    async with httpx.AsyncClient(timeout=60) as c:
        for entry_id in entry_ids:
            resp = await c.post(
                f"{URL}/model/delete", json={"id": entry_id}, headers={"Authorization": f"Bearer {MASTER}"}
            )
            resp.raise_for_status()


async def adopted_by_a_only(a: Host, b: Host, legacy: list[str]) -> None:
    """b leaves both legacy entries alone; a replaces the one of its own deployment, not the other."""
    assert await b.svc.ctx.litellm.sync_once()
    assert set(legacy) <= entry_ids(await model_info())
    assert await a.svc.ctx.litellm.sync_once()
    ids = entry_ids(await model_info())
    assert legacy[0] not in ids and legacy[1] in ids
    assert await b.svc.ctx.litellm.sync_once() and legacy[1] in entry_ids(await model_info())


async def test_one_name_on_two_hosts_gets_traffic_on_both(fleet: Fleet) -> None:
    a, b = await fleet.host("a"), await fleet.host("b")
    name = f"both-{uuid.uuid4().hex[:6]}"
    on_a, on_b = await a.deploy(name), await b.deploy(name)
    await a.registered(on_a["id"])
    await b.registered(on_b["id"])
    client = proxy_client()
    sent = 0
    while sent < 60 and not (a.chats(on_a["id"]) and b.chats(on_b["id"])):
        answer = await client.chat.completions.create(model=name, messages=HI)
        assert answer.choices[0].message.content == "Hello from the test engine"
        sent += 1
    await client.close()
    assert a.chats(on_a["id"]) > 0 and b.chats(on_b["id"]) > 0, sent  # 2 x 0.5^60 odds otherwise
    assert a.chats(on_a["id"]) + b.chats(on_b["id"]) == sent


async def warm_pair(fleet: Fleet) -> tuple[Host, Host, str, str, str]:
    """Host a with the model ready (LiteLLM order 1), host b with it stopped (order 2)."""
    a, b = await fleet.host("a", warm_first=True), await fleet.host("b", warm_first=True)
    name = f"warm-{uuid.uuid4().hex[:6]}"
    on_a, on_b = await a.deploy(name), await b.deploy(name)
    await a.registered(on_a["id"])
    await b.registered(on_b["id"])
    assert await orders(a, name) == [2] and await orders(b, name) == [2]
    [cold_entry] = await entries_of(a.instance)
    writes = a.svc.ctx.litellm.writes
    assert (await a.svc.client.post(f"/api/deployments/{on_a['id']}/start")).status_code == 200
    await a.svc.wait_state(on_a["id"], "ready")

    async def a_is_warm() -> bool:
        return await orders(a, name) == [1]

    await wait_until(a_is_warm, timeout=60, interval=0.3)
    assert await a.svc.ctx.litellm.sync_once()
    assert entry_ids(await entries_of(a.instance)) == {cold_entry["model_info"]["id"]}  # updated in place
    assert a.svc.ctx.litellm.writes == writes + 1  # stopped -> starting -> ready: one write
    return a, b, name, on_a["id"], on_b["id"]


async def test_warm_first_sends_everything_to_the_warm_host(fleet: Fleet) -> None:
    a, b, name, id_a, id_b = await warm_pair(fleet)
    client = proxy_client()
    for _ in range(20):
        answer = await client.chat.completions.create(model=name, messages=HI)
        assert answer.choices[0].message.content == "Hello from the test engine"
    assert a.chats(id_a) == 20 and b.chats(id_b) == 0
    assert (await b.svc.view(id_b))["state"] == "stopped" and await b.starts(id_b) == 0

    # The warm copy idles out (a short idle timeout from now on): both are cold again.
    writes = a.svc.ctx.litellm.writes
    resp = await a.svc.client.patch(f"/api/deployments/{id_a}/mode", json={"mode": "on_demand", "idle_timeout_s": 1})
    assert resp.status_code == 200
    await a.svc.wait_state(id_a, "stopped", timeout=60)

    async def both_cold() -> bool:
        return await orders(a, name) == [2] and await orders(b, name) == [2]

    await wait_until(both_cold, timeout=60, interval=0.3)
    assert a.svc.ctx.litellm.writes == writes + 1  # ready -> stopping -> stopped: one write
    answer = await client.chat.completions.create(model=name, messages=HI)
    assert answer.choices[0].message.content == "Hello from the test engine"
    await client.close()
    started = [await a.starts(id_a) - 1, await b.starts(id_b)]  # a was started once before
    assert sorted(started) == [0, 1], started
    states = sorted([(await a.svc.view(id_a))["state"], (await b.svc.view(id_b))["state"]])
    assert states == ["ready", "stopped"]


async def test_a_dead_warm_host_falls_over_to_the_cold_copy(fleet: Fleet) -> None:
    a, b, name, _id_a, id_b = await warm_pair(fleet)
    await a.svc.shutdown()  # gone without a word: its entry still says warm
    assert await orders(a, name) == [1]
    client = proxy_client()
    answer = await client.chat.completions.create(model=name, messages=HI)
    await client.close()
    assert answer.choices[0].message.content == "Hello from the test engine"
    assert b.chats(id_b) == 1 and await b.starts(id_b) == 1
