"""LiteLLMSync against an in-process stand-in of LiteLLM's admin API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from engines.litellm_standin import StandIn
from unit.ondemand_harness import Harness, harness

from dgxmm.records.deployment import Mode, State
from dgxmm.litellm.sync import LiteLLMSync, params_fingerprint
from dgxmm.gateway.keys import fingerprint
from dgxmm.settings import LiteLLMSettings, OndemandSettings

pytestmark = pytest.mark.timeout(20)
KEY = "sk-od-1"


class Env:
    def __init__(self, h: Harness, lite: StandIn, sync: LiteLLMSync, keybox: dict[str, str | None]):
        self.h, self.lite, self.sync, self.keybox = h, lite, sync, keybox

    async def sync_ok(self) -> None:
        assert await self.sync.sync_once(), self.sync.state.error


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    lite = await StandIn().start()
    master = tmp_path / "master.key"
    master.write_text("sk-master\n")
    keybox: dict[str, str | None] = {"key": KEY}
    async with harness(tmp_path) as h, aiohttp.ClientSession() as http:
        settings = LiteLLMSettings(
            enabled=True,
            url=lite.url,
            master_key_file=master,
            internal_url="http://dgxmm:8090/dgxmm",
            sync_interval_s=0.1,
        )
        sync = LiteLLMSync(settings, h.controller.settings, h.deployer, lambda: keybox["key"], http, instance="host-a")
        h.deployer.add_listener(sync.on_change)
        yield Env(h, lite, sync, keybox)
    await lite.stop()


async def test_registration_of_each_kind(env: Env) -> None:
    h = env.h
    await h.add("od", 2)
    await h.add("al", 2, state=State.READY, mode=Mode.ALWAYS_ON)
    await h.add("bad", 2, state=State.FAILED)
    await h.add("off", 2, mode=Mode.ALWAYS_ON)
    await env.sync_ok()
    od = env.lite.by_name("od")[0]
    assert od["litellm_params"] == {
        "model": "openai/od",
        "api_base": "http://dgxmm:8090/dgxmm/ondemand/od/v1",
        "api_key": KEY,
        "timeout": 1500.0,
        "stream_timeout": 1500.0,
        "num_retries": 0,
    }
    info = od["model_info"]
    assert info["dgxmm_id"] == "od" and info["dgxmm_key_fp"] == fingerprint(KEY)
    assert info["dgxmm_instance"] == "host-a"
    assert info["dgxmm_params_fp"] == params_fingerprint(h.controller.settings)
    assert info["health_check_params"] == {"extra_headers": {"x-dgxmm-health-check": "1"}}
    al = env.lite.by_name("al")[0]
    assert al["litellm_params"]["api_base"] == "http://127.0.0.1:9/v1"
    assert al["model_info"] == {
        "dgxmm_id": "al",
        "dgxmm_instance": "host-a",
        "dgxmm_key_fp": fingerprint("dgxmm-direct"),
        "id": al["model_info"]["id"],
    }
    assert "order" not in od["litellm_params"] and "order" not in al["litellm_params"]
    assert env.lite.by_name("bad") == [] and env.lite.by_name("off") == []
    assert env.sync.status("od") == {"status": "registered", "error": None}
    assert env.sync.status("off") == {"status": "pending", "error": None}
    assert env.sync.ready


async def test_a_second_sync_writes_nothing(env: Env) -> None:
    await env.h.add("od", 2)
    await env.h.add("al", 2, state=State.READY, mode=Mode.ALWAYS_ON)
    await env.sync_ok()
    writes = len(env.lite.writes())
    await env.sync_ok()
    assert len(env.lite.writes()) == writes == 2


async def test_an_always_on_engine_with_a_new_key_at_the_same_address_gets_its_entry_rewritten(env: Env) -> None:
    """A new run of an engine demands a new key (docs/engines.md); a container can come back on its
    old address, and LiteLLM never shows the key it holds: the key's fingerprint tells."""
    await env.h.add("al", 2, state=State.READY, mode=Mode.ALWAYS_ON)
    handle = env.h.deployer.get("al").runtime_handle
    assert handle is not None
    env.h.deployer._ledger.set_handle("al", handle.model_copy(update={"api_key": "run-1"}))
    await env.sync_ok()
    env.h.deployer._ledger.set_handle("al", handle.model_copy(update={"api_key": "run-2"}))
    await env.sync_ok()
    [entry] = env.lite.by_name("al")
    assert entry["litellm_params"]["api_key"] == "run-2"
    assert entry["model_info"]["dgxmm_key_fp"] == fingerprint("run-2")


async def test_timeout_follows_the_queue_limit(tmp_path: Path) -> None:
    settings = OndemandSettings(queue_timeout_s=1800)
    from dgxmm.litellm.sync import request_timeout

    assert request_timeout(settings) == 2400 and request_timeout(OndemandSettings()) == 1500


async def test_a_rotated_key_replaces_entries_adds_before_deletes(env: Env) -> None:
    await env.h.add("od", 2)
    await env.sync_ok()
    old_id = env.lite.by_name("od")[0]["model_info"]["id"]
    env.keybox["key"] = "sk-od-2"
    env.lite.calls.clear()
    await env.sync_ok()
    assert env.lite.writes() == [("POST", "/model/new"), ("POST", "/model/delete")]
    [entry] = env.lite.by_name("od")
    assert entry["model_info"]["id"] != old_id
    assert entry["model_info"]["dgxmm_key_fp"] == fingerprint("sk-od-2")
    assert entry["litellm_params"]["api_key"] == "sk-od-2"


async def test_changed_params_or_old_entries_are_replaced_once(env: Env) -> None:
    await env.h.add("od", 2)
    await env.h.add("od2", 2)
    await env.sync_ok()
    # An entry from before the health-check marker: no params fingerprint.
    env.lite.by_name("od2")[0]["model_info"].pop("dgxmm_params_fp")
    env.sync._ondemand = OndemandSettings(queue_timeout_s=1200)  # a changed queue timeout
    env.lite.calls.clear()
    await env.sync_ok()
    assert len(env.lite.writes()) == 4
    assert env.lite.by_name("od")[0]["litellm_params"]["timeout"] == 1800
    env.lite.calls.clear()
    await env.sync_ok()
    assert env.lite.writes() == []


async def test_mode_switch_adds_the_new_entry_before_deleting_the_old(env: Env) -> None:
    h = env.h
    await h.add("m", 2)
    await env.sync_ok()
    await h.controller.set_mode("m", Mode.ALWAYS_ON, None, user="admin")
    await env.sync_ok()  # pending: the gateway entry stays while the start runs
    assert [e["litellm_params"]["api_base"] for e in env.lite.by_name("m")] == ["http://dgxmm:8090/dgxmm/ondemand/m/v1"]
    await h.ready("m")
    env.lite.calls.clear()
    await env.sync_ok()
    assert env.lite.writes() == [("POST", "/model/new"), ("POST", "/model/delete")]
    assert [e["litellm_params"]["api_base"] for e in env.lite.by_name("m")] == ["http://127.0.0.1:9/v1"]


async def test_without_a_key_nothing_is_registered_and_nothing_deleted(env: Env) -> None:
    await env.h.add("od", 2)
    await env.sync_ok()
    env.keybox["key"] = None
    await env.h.add("od2", 2)
    env.lite.calls.clear()
    await env.sync_ok()
    assert env.lite.writes() == []
    assert len(env.lite.by_name("od")) == 1 and env.lite.by_name("od2") == []
    assert env.sync.status("od") == {"status": "error", "error": "ondemand_not_configured"}
    assert env.sync.status("od2") == {"status": "error", "error": "ondemand_not_configured"}


async def test_entries_made_by_hand_are_never_touched(env: Env) -> None:
    env.lite.add_manual("handmade", "http://elsewhere/v1")
    env.lite.add_manual("od", "http://elsewhere/v1")  # even with the same name
    await env.h.add("od", 2)
    await env.sync_ok()
    await env.h.deployer.remove("od", actor="api")
    await env.sync_ok()
    assert [e["model_name"] for e in env.lite.entries] == ["handmade", "od"]


async def test_removed_deployments_are_deregistered(env: Env) -> None:
    await env.h.add("od", 2)
    await env.sync_ok()
    await env.h.deployer.remove("od", actor="api")
    await env.sync_ok()
    assert env.lite.entries == []


async def test_litellm_down_is_retried_and_shown(env: Env) -> None:
    await env.h.add("od", 2)
    env.lite.fail_status = 503
    assert not await env.sync.sync_once()
    assert not env.sync.ready and "503" in (env.sync.state.error or "")
    assert env.sync.status("od") == {"status": "error", "error": "litellm_unavailable"}
    env.lite.fail_status = None
    await env.sync_ok()
    assert env.sync.ready and env.sync.status("od")["status"] == "registered"


async def test_failed_writes_leave_the_sync_not_ready(env: Env) -> None:
    await env.h.add("od", 2)
    env.lite.fail_writes = 1
    assert not await env.sync.sync_once()
    assert env.sync.status("od") == {"status": "error", "error": "litellm_rejected"}
    await env.sync_ok()


async def test_a_vanished_entry_on_delete_is_a_failed_sync_then_settles(env: Env) -> None:
    await env.h.add("od", 2)
    await env.sync_ok()
    await env.h.deployer.remove("od", actor="api")
    original = env.lite._route

    async def vanish_first(request: Any) -> Any:  # someone deleted it just before us: 400
        if request.path == "/model/delete":
            env.lite.entries.clear()
        return await original(request)

    env.lite._route = vanish_first  # type: ignore[method-assign]
    assert not await env.sync.sync_once()
    await env.sync_ok()


async def test_unreachable_litellm(env: Env) -> None:
    env.sync.admin.settings = env.sync.settings.model_copy(update={"url": "http://127.0.0.1:9"})
    assert not await env.sync.sync_once()
    assert "unreachable" in (env.sync.state.error or "")


async def test_syncs_never_overlap(env: Env) -> None:
    await env.h.add("od", 2)
    env.lite.delay_s = 0.05
    await asyncio.gather(*(env.sync.sync_once() for _ in range(5)))
    assert env.lite.max_concurrent == 1


async def test_triggers(env: Env) -> None:
    h, wanted = env.h, env.sync._wanted
    await h.add("a", 2)
    assert wanted.is_set()  # created
    wanted.clear()
    h.deployer.restart("a", actor="test")
    assert not wanted.is_set()  # stopped -> starting: nothing LiteLLM sees changes
    await h.ready("a")
    assert wanted.is_set()
    wanted.clear()
    h.deployer._ledger.edit("a", {"idle_timeout_s": 300})
    assert not wanted.is_set()
    await h.controller.set_mode("a", Mode.ALWAYS_ON, None, user="admin")
    assert wanted.is_set()
    wanted.clear()
    await h.deployer.remove("a", actor="api")
    assert wanted.is_set()


async def test_run_syncs_on_trigger_and_periodically(env: Env) -> None:
    await env.h.add("od", 2)
    task = asyncio.create_task(env.sync.run())
    for _ in range(100):
        if env.sync.ready:
            break
        await asyncio.sleep(0.02)
    env.lite.entries.clear()  # someone emptied LiteLLM: the periodic sync brings it back
    for _ in range(100):
        if env.lite.by_name("od"):
            break
        await asyncio.sleep(0.02)
    task.cancel()
    assert env.lite.by_name("od")
