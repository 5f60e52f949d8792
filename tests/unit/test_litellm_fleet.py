"""Several dgxmm instances sharing one LiteLLM (a stand-in of its admin API): ownership by
instance id, adoption of entries from before instance ids, warm-first orders with one write per
change, and ``dgxmm litellm purge``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engines.litellm_standin import StandIn
from unit.ondemand_harness import Harness, harness

from dgxmm.records.changes import Change
from dgxmm.records.deployment import Mode, State
from dgxmm.litellm.sync import LiteLLMSync, owned, wants_sync
from dgxmm.litellm.purge import purge, selected
from dgxmm.settings import LiteLLMSettings

pytestmark = pytest.mark.timeout(20)
KEY = "sk-od-1"


class Host:
    def __init__(self, h: Harness, sync: LiteLLMSync) -> None:
        self.h, self.sync = h, sync

    async def sync_ok(self) -> None:
        assert await self.sync.sync_once(), self.sync.state.error


class Fleet:
    def __init__(self, lite: StandIn, settings: LiteLLMSettings, stack: AsyncExitStack, tmp: Path) -> None:
        self.lite, self.settings, self.stack, self.tmp = lite, settings, stack, tmp

    async def host(self, instance: str, *, warm_first: bool = False) -> Host:
        h = await self.stack.enter_async_context(harness(self.tmp / instance))
        http = await self.stack.enter_async_context(aiohttp.ClientSession())
        settings = self.settings.model_copy(update={"warm_first": warm_first})
        sync = LiteLLMSync(settings, h.controller.settings, h.deployer, lambda: KEY, http, instance=instance)
        h.deployer.add_listener(sync.on_change)
        return Host(h, sync)

    def mine(self, instance: str) -> list[dict[str, Any]]:
        return [e for e in self.lite.entries if e["model_info"].get("dgxmm_instance") == instance]

    def ids(self) -> set[str]:
        return {e["model_info"]["id"] for e in self.lite.entries}

    def legacy(self, dgxmm_id: str, name: str) -> str:
        """An entry as a dgxmm from before instance ids wrote it."""
        entry_id = str(uuid.uuid4())
        self.lite.entries.append(
            {
                "model_name": name,
                "litellm_params": {
                    "model": f"openai/{name}",
                    "api_base": f"http://old/dgxmm/ondemand/{dgxmm_id}/v1",
                    "api_key": KEY,
                },
                "model_info": {"id": entry_id, "dgxmm_id": dgxmm_id},
            }
        )
        return entry_id


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    lite = await StandIn().start()
    master = tmp_path / "master.key"
    master.write_text("sk-master\n")
    settings = LiteLLMSettings(
        enabled=True, url=lite.url, master_key_file=master, internal_url="http://dgxmm:8090/dgxmm", sync_interval_s=0.1
    )
    async with AsyncExitStack() as stack:
        yield Fleet(lite, settings, stack, tmp_path)
    await lite.stop()


async def test_two_instances_keep_each_others_entries(fleet: Fleet) -> None:
    a, b = await fleet.host("host-a"), await fleet.host("host-b")
    await a.h.add("m", 2)
    await b.h.add("m", 2)  # the same served name (and even the same deployment id) on both
    await b.h.add("only-b", 2, state=State.READY, mode=Mode.ALWAYS_ON)
    await a.sync_ok()
    await b.sync_ok()
    before = fleet.ids()
    for _ in range(3):
        fleet.lite.calls.clear()
        await a.sync_ok()
        await b.sync_ok()
        assert fleet.lite.writes() == []
    assert fleet.ids() == before
    assert [e["model_name"] for e in fleet.mine("host-a")] == ["m"]
    assert sorted(e["model_name"] for e in fleet.mine("host-b")) == ["m", "only-b"]
    await a.h.deployer.remove("m", actor="api")
    await a.sync_ok()
    await b.sync_ok()
    assert fleet.mine("host-a") == [] and len(fleet.mine("host-b")) == 2


async def test_legacy_entries_are_adopted_by_their_owner_only(fleet: Fleet) -> None:
    a, b = await fleet.host("host-a"), await fleet.host("host-b")
    await a.h.add("a1", 2)
    await b.h.add("b1", 2)
    old_a = fleet.legacy("a1", "a1")
    old_gone = fleet.legacy("gone", "gone")  # a deployment no live instance has
    await b.sync_ok()
    assert {old_a, old_gone} <= fleet.ids()  # b owns neither
    fleet.lite.calls.clear()
    await a.sync_ok()
    assert fleet.lite.writes() == [("POST", "/model/new"), ("POST", "/model/delete")]
    assert old_a not in fleet.ids() and old_gone in fleet.ids()
    [entry] = fleet.lite.by_name("a1")
    assert entry["model_info"]["dgxmm_instance"] == "host-a"
    fleet.lite.calls.clear()
    await a.sync_ok()
    await b.sync_ok()
    assert fleet.lite.writes() == [] and old_gone in fleet.ids()


async def test_a_legacy_entry_of_a_removed_deployment_is_deleted_by_its_owner(fleet: Fleet) -> None:
    a = await fleet.host("host-a")
    await a.h.add("a1", 2, state=State.FAILED)  # failed: not registered, its old entry goes
    old = fleet.legacy("a1", "a1")
    await a.sync_ok()
    assert old not in fleet.ids() and fleet.lite.by_name("a1") == []


def test_ownership_rules() -> None:
    def entry(**info: Any) -> dict[str, Any]:
        return {"model_info": {"id": "x", **info}}

    assert owned(entry(dgxmm_id="d", dgxmm_instance="me"), "me", set())
    assert not owned(entry(dgxmm_id="d", dgxmm_instance="other"), "me", {"d"})
    assert owned(entry(dgxmm_id="d"), "me", {"d"}) and not owned(entry(dgxmm_id="d"), "me", {"e"})
    assert not owned(entry(), "me", {"d"}) and not owned({"model_name": "x"}, "me", set())


def order(entry: dict[str, Any]) -> int | None:
    value: int | None = entry["litellm_params"].get("order")
    return value


async def test_warm_first_orders_change_in_place_once_per_change(fleet: Fleet) -> None:
    a = await fleet.host("host-a", warm_first=True)
    h = a.h
    await h.add("m", 2)
    await h.add("direct", 2, state=State.READY, mode=Mode.ALWAYS_ON)
    await a.sync_ok()
    [cold] = fleet.lite.by_name("m")
    entry_id = cold["model_info"]["id"]
    assert order(cold) == 2 and order(fleet.lite.by_name("direct")[0]) == 1

    fleet.lite.calls.clear()
    h.deployer.restart("m", actor="test")  # starting: warm already
    assert a.sync._wanted.is_set()
    await a.sync_ok()
    assert fleet.lite.writes() == [("PATCH", f"/model/{entry_id}/update")]
    await h.ready("m")
    await a.sync_ok()
    [warm] = fleet.lite.by_name("m")
    assert order(warm) == 1 and warm["model_info"]["id"] == entry_id
    assert len(fleet.lite.writes()) == 1  # starting -> ready wrote nothing

    fleet.lite.calls.clear()
    h.idle_for(120)
    assert await h.controller.reap_once() == ["m"]
    await a.sync_ok()
    [cold_again] = fleet.lite.by_name("m")
    assert order(cold_again) == 2 and cold_again["model_info"]["id"] == entry_id
    assert fleet.lite.writes() == [("PATCH", f"/model/{entry_id}/update")]
    assert cold_again["litellm_params"]["api_key"] == KEY  # the update kept the key


async def test_asleep_is_cold_and_a_failed_start_deregisters(fleet: Fleet) -> None:
    a = await fleet.host("host-a", warm_first=True)
    await a.h.add("s", 2, state=State.ASLEEP)
    await a.h.add("f", 2)
    await a.sync_ok()
    assert order(fleet.lite.by_name("s")[0]) == 2
    a.h.deployer.restart("f", actor="test")
    await a.sync_ok()
    assert order(fleet.lite.by_name("f")[0]) == 1
    await a.h.deployer.starting("f")
    a.h.deployer.fail_start("f")
    await a.h.settled("f")
    await a.sync_ok()
    assert fleet.lite.by_name("f") == []


async def test_without_an_in_place_update_the_entry_is_replaced_adds_first(fleet: Fleet) -> None:
    a = await fleet.host("host-a", warm_first=True)
    await a.h.add("m", 2)
    await a.sync_ok()
    fleet.lite.no_update = True
    entry_id = fleet.lite.by_name("m")[0]["model_info"]["id"]
    fleet.lite.calls.clear()
    a.h.deployer.restart("m", actor="test")
    await a.sync_ok()
    assert fleet.lite.writes() == [
        ("PATCH", f"/model/{entry_id}/update"),
        ("POST", "/model/new"),
        ("POST", "/model/delete"),
    ]
    assert [order(e) for e in fleet.lite.by_name("m")] == [1]


async def test_turning_warm_first_off_removes_the_orders_once(fleet: Fleet) -> None:
    a = await fleet.host("host-a", warm_first=True)
    await a.h.add("m", 2)
    await a.sync_ok()
    a.sync.settings = a.sync.settings.model_copy(update={"warm_first": False})
    fleet.lite.calls.clear()
    await a.sync_ok()
    assert fleet.lite.writes() == [("POST", "/model/new"), ("POST", "/model/delete")]
    assert "order" not in fleet.lite.by_name("m")[0]["litellm_params"]
    fleet.lite.calls.clear()
    await a.sync_ok()
    assert fleet.lite.writes() == []


def test_a_start_triggers_a_sync_only_with_warm_first() -> None:
    from dgxmm.records.deployment import Deployment

    dep = Deployment(
        id="d",
        name="d",
        served_name="d",
        engine="command",
        command=["x"],
        memory_gib=1,
        mode=Mode.ON_DEMAND,
        state=State.STARTING,
    )
    start = Change("state", dep, old_state=State.STOPPED)
    assert wants_sync(start, warm_first=True) and not wants_sync(start)
    wake = Change("state", dep, old_state=State.ASLEEP)
    assert wants_sync(wake, warm_first=True)
    stopped = Change("state", dep.model_copy(update={"state": State.STOPPED}), old_state=State.STOPPING)
    assert not wants_sync(stopped, warm_first=True)
    always = dep.model_copy(update={"mode": Mode.ALWAYS_ON})
    assert not wants_sync(Change("state", always, old_state=State.STOPPED), warm_first=True)


async def test_purge_deletes_one_instance_or_the_unadopted_legacy_entries(fleet: Fleet) -> None:
    a, b = await fleet.host("host-a"), await fleet.host("host-b")
    await a.h.add("m", 2)
    await b.h.add("m", 2)
    await a.sync_ok()
    await b.sync_ok()
    old = fleet.legacy("gone", "gone")
    fleet.lite.add_manual("handmade", "http://elsewhere/v1")
    lines: list[str] = []
    assert await purge(fleet.settings, "host-a", False, True, lines.append)
    assert len(lines) == 1 and lines[0].startswith("would delete m (entry ") and "host-a" in lines[0]
    assert len(fleet.mine("host-a")) == 1
    assert await purge(fleet.settings, "host-a", False, False, lines.append)
    assert fleet.mine("host-a") == [] and len(fleet.mine("host-b")) == 1 and old in fleet.ids()
    assert await purge(fleet.settings, None, True, False, lines.append)
    assert old not in fleet.ids()
    assert sorted(e["model_name"] for e in fleet.lite.entries) == ["handmade", "m"]
    assert await purge(fleet.settings, "nobody", False, False, lines.append)
    assert lines[-1] == "no entries matched"


async def test_purge_reports_failures(fleet: Fleet) -> None:
    a = await fleet.host("host-a")
    await a.h.add("m", 2)
    await a.sync_ok()
    fleet.lite.fail_writes = 1
    lines: list[str] = []
    assert not await purge(fleet.settings, "host-a", False, False, lines.append)
    assert lines[0].startswith("error: m (entry ") and "500" in lines[0]
    fleet.lite.fail_status = 503
    assert not await purge(fleet.settings, "host-a", False, False, lines.append)
    assert lines[-1].startswith("error: cannot read LiteLLM's entries")


def test_selected_ignores_entries_without_a_dgxmm_id() -> None:
    entries = [
        {"model_info": {"id": "1", "dgxmm_instance": "x"}},
        {"model_info": {"id": "2"}},
        {"model_info": {"id": "3", "dgxmm_id": "d"}},
    ]
    assert selected(entries, "x", True) == [entries[2]]
