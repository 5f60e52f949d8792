"""How straight a warm request walks through dgxmm (issue 48 item 5): a chat by model name to a
ready on-demand model, traced at run time (``tests/walk.py``: real sockets, the test engine as a
real process), its modules, moves and bounces held under the bounds docs/architecture.md states.
A change that makes the walk more crooked fails here and says where it went."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from conftest import KEY, engine_command, gateway_settings, wait_until
from walk import Walk

from dgxmm.status.live import LiveStatus


async def one_check(live: LiveStatus) -> None:
    assert live.check() == []  # a warm request leaves the model as it found it: ready and idle


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

# Today's walk (docs/architecture.md, "The walk of a request"), one shape: 60 modules, 159
# moves, 34 bounces, 8 upcalls, with a little room. A bound is lowered when the walk is
# straightened, never raised without the page saying why.
WARM_BOUNDS = {"modules": 60, "moves": 165, "bounces": 36, "upcalls": 8}


async def test_a_warm_request_by_name_walks_within_its_bounds(serve, tmp_path: Path) -> None:
    # Background work far apart (sampling, health checks), so that the window holds the request.
    quiet = {"metrics_interval_s": 30, "health_interval_s": 30}
    svc = await serve(gateway_settings(tmp_path, deployer=quiet))
    dep_id = (
        await svc.create(name="chat", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    )["id"]
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    ) as r:
        for _ in range(2):  # the cold start, then one warm request: connections and caches made
            assert (await r.post("/chat/completions", json={**CHAT, "model": "chat"})).status_code == 200
        # The live status looks at what a request announced (its grant and release) in one check
        # or two, as they fall on its 50 ms gap (CHECK_GAP_S): its task is paused, and the walk
        # holds exactly one check of both, run once the request is over. The loop-lag sampler's
        # ticks, as many as the request lasts, are not the request's.
        svc.ctx.supervisor.stop("live-status")
        with Walk(ignored=frozenset({"loop-lag"})) as walk:
            resp = await r.post("/chat/completions", json={**CHAT, "model": "chat"})
            await wait_until(lambda: (track := svc.ctx.ondemand.tracked(dep_id)) and track.inflight == 0)
            await asyncio.create_task(one_check(svc.ctx.live), name="live-check")
        assert resp.status_code == 200
    figures = walk.figures()
    print(walk.report())
    assert all(figures[name] <= bound for name, bound in WARM_BOUNDS.items()), walk.report()
