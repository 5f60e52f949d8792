"""Through the served admin API, with the process runtime and the suite's vLLM stand-in (which keeps
its "compiled graph" under VLLM_CACHE_ROOT as vLLM does): a vLLM deployment's compile work outlives
its engine, its size is shown, a changed argument starts a new entry, and it can be cleared.
(The real vLLM's reuse is tests/vllm's; docs/engines.md#compile-cache.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from conftest import TESTS, make_settings

FAKE_VLLM = TESTS / "engines" / "fakevllm"
COMPILED = "Compiling a graph for compile range"
LOADED = "Directly load the compiled graph(s)"


def engine_env(svc: Any, deployment_id: str) -> dict[str, str]:
    handle = svc.ctx.deployer.get(deployment_id).runtime_handle
    raw = Path(f"/proc/{handle.ref}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


async def run_once(svc: Any, deployment_id: str) -> list[str]:
    """Start the deployment, wait until it serves, stop it; the log lines of that run."""
    assert (await svc.client.post(f"/api/deployments/{deployment_id}/start")).status_code == 200
    await svc.wait_state(deployment_id, "ready")
    env = engine_env(svc, deployment_id)
    assert (await svc.client.post(f"/api/deployments/{deployment_id}/stop")).status_code == 200
    lines = (await svc.client.get(f"/api/deployments/{deployment_id}/logs", params={"tail": 50})).json()["lines"]
    run = lines[max(i for i, line in enumerate(lines) if line.startswith("--- dgxmm: starting")) :]
    return [env["VLLM_CACHE_ROOT"], env["TRITON_CACHE_DIR"], *run]


async def test_a_second_start_loads_what_the_first_compiled_until_it_is_cleared(serve, tmp_path: Path) -> None:
    settings = make_settings(tmp_path, memory={"capacity_gib": 128}, engines={"vllm_python": sys.executable})
    svc = await serve(settings)
    view = await svc.create(
        name="q", engine="vllm", model="org/model", memory_gib=8, mode="on_demand", env={"PYTHONPATH": str(FAKE_VLLM)}
    )
    dep_id = view["id"]
    root, triton, *first = await run_once(svc, dep_id)
    mine = settings.server.data_dir / "compile-cache" / dep_id
    assert Path(root).parent == mine and triton == f"{root}/triton"
    assert any(COMPILED in line for line in first) and not any(LOADED in line for line in first)

    again, _, *second = await run_once(svc, dep_id)
    assert again == root
    assert any(LOADED in line for line in second) and not any(COMPILED in line for line in second)

    shown = (await svc.client.get(f"/api/deployments/{dep_id}/compile-cache")).json()
    assert shown["kept"] is True and shown["where"] == str(mine)
    assert [e["key"] for e in shown["entries"]] == [Path(root).name]
    assert shown["bytes"] == (Path(root) / "torch_compile_cache/standin/rank_0_0/graph.py").stat().st_size > 0

    # A changed argument is a new entry; the stale one goes at that start.
    await svc.client.patch(f"/api/deployments/{dep_id}", json={"args": ["--max-model-len", "2048"]})
    changed, _, *third = await run_once(svc, dep_id)
    assert changed != root and any(COMPILED in line for line in third)
    assert sorted(p.name for p in mine.iterdir()) == [Path(changed).name]

    # Cleared: refused while the engine runs, then gone, and the next start compiles anew.
    assert (await svc.client.post(f"/api/deployments/{dep_id}/start")).status_code == 200
    await svc.wait_state(dep_id, "ready")
    busy = await svc.client.delete(f"/api/deployments/{dep_id}/compile-cache")
    assert busy.status_code == 409 and "stop it before clearing" in busy.json()["error"]["message"]
    assert (await svc.client.post(f"/api/deployments/{dep_id}/stop")).status_code == 200
    cleared = (await svc.client.delete(f"/api/deployments/{dep_id}/compile-cache")).json()
    assert cleared == {"cleared": dep_id, "bytes": shown["bytes"]} and not mine.exists()
    assert (await svc.client.get(f"/api/deployments/{dep_id}/compile-cache")).json()["bytes"] == 0
    _, _, *fourth = await run_once(svc, dep_id)
    assert any(COMPILED in line for line in fourth)

    # Removing the deployment removes its compile work.
    assert (await svc.client.delete(f"/api/deployments/{dep_id}")).status_code == 200
    assert not mine.exists()


async def test_other_engines_keep_no_compile_cache(serve, tmp_path: Path) -> None:
    svc = await serve(make_settings(tmp_path, memory={"capacity_gib": 128}))
    view = await svc.create(name="c", engine="command", command=["true"], memory_gib=1, mode="on_demand")
    assert (await svc.client.get(f"/api/deployments/{view['id']}/compile-cache")).json() == {"kept": False}
    assert not (svc.settings.server.data_dir / "compile-cache").exists()
