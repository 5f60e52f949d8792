"""How straight a warm request walks through dgxmm (issue 48 item 5): a chat by model name to a
ready on-demand model, traced at run time (``tests/walk.py``: real sockets, the test engine as a
real process), its modules, moves and bounces held under the bounds docs/architecture.md states.
A change that makes the walk more crooked fails here and says where it went."""

from __future__ import annotations

from pathlib import Path

import httpx
from conftest import KEY, engine_command, gateway_settings, wait_until
from walk import Walk

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

# Today's walk (docs/architecture.md, "The walk of a request"): the largest of its shapes, with a
# little room. A bound is lowered when the walk is straightened, never raised without the page
# saying why.
WARM_BOUNDS = {"modules": 60, "moves": 320, "bounces": 85, "upcalls": 14}


async def test_a_warm_request_by_name_walks_within_its_bounds(serve, tmp_path: Path) -> None:
    # Background work far apart (sampling, health checks), so that the window holds the request.
    quiet = {"metrics_interval_s": 30, "health_interval_s": 30}
    svc = await serve(gateway_settings(tmp_path, deployer=quiet))
    await svc.create(name="chat", engine="command", memory_gib=1, mode="on_demand", command=engine_command())
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{svc.settings.server.port}/v1",
        transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    ) as r:
        for _ in range(2):  # the cold start, then one warm request: connections and caches made
            assert (await r.post("/chat/completions", json={**CHAT, "model": "chat"})).status_code == 200
        with Walk() as walk:
            resp = await r.post("/chat/completions", json={**CHAT, "model": "chat"})
            # The walk ends once the live status has looked at what the request announced (its
            # grant and release): its check is part of every request's cost.
            await wait_until(lambda: not svc.ctx.live._announced.is_set())
        assert resp.status_code == 200
    figures = walk.figures()
    print(walk.report())
    assert all(figures[name] <= bound for name, bound in WARM_BOUNDS.items()), walk.report()
