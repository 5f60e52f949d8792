"""``POST /api/estimate`` against files it must not trust (issue 34): a read that hangs is answered
422 at the deadline, at most two reads run at once (a third is 503 ``server_busy``), and once the
reads end the estimates are served again."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until

from dgxmm.api import estimate as api
from dgxmm.deploy.estimate import Estimate

pytestmark = pytest.mark.timeout(60)


@pytest.mark.bounded
async def test_hung_reads_are_answered_at_the_deadline_and_bounded(
    serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    hung = Estimate(0, 0, 0, 1, "f16", "f16")

    def hangs(path: Path, args: list[str], ctx: int | None) -> Estimate:  # a read on a disk that hangs
        release.wait(30)
        return hung

    monkeypatch.setattr(api, "estimate", hangs)
    monkeypatch.setattr(api, "DEADLINE_S", 0.3)
    svc = await serve()
    body = {"model": str(tmp_path / "m.gguf")}
    first, second = (asyncio.create_task(svc.client.post("/api/estimate", json=body)) for _ in range(2))
    await wait_until(lambda: api._running == 2)  # both reads under way
    busy = await svc.client.post("/api/estimate", json=body)
    assert busy.status_code == 503 and busy.json()["error"]["code"] == "server_busy", busy.text
    for late in await asyncio.gather(first, second):
        assert late.status_code == 422 and "was not read within 1.3 s" in late.json()["error"]["message"], late.text
    still = await svc.client.post("/api/estimate", json=body)
    assert still.status_code == 503  # the two threads still read: no third one
    release.set()
    await wait_until(lambda: api._running == 0)  # both reads ended
    served = await svc.client.post("/api/estimate", json=body)
    assert served.status_code == 200 and served.json()["context"] == 1, served.text
