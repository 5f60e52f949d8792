"""Issue 34 item 1, replayed against the served dgxmm: every hostile GGUF (tests/hostile/ggufs.py),
a FIFO, a sparse 4 GiB file, a directory and a device, posted to ``/api/estimate`` as the deploy
wizard posts any path ending in ``.gguf``. Each is refused 422 on ``model`` with the words that
say what is wrong, within a second, and dgxmm's RSS stays within 20 MiB of what it was before
(a 41-byte file grew it by 2.7 GB in 16 s)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from served import Served

from hostile.ggufs import SHAPES, valid, write_shapes, write_specials
from hostile.harness import Front, Peak

pytestmark = pytest.mark.hostile

RSS_BOUND_MIB = 20.0
SECONDS = 1.0


def warm(served: Served, folder: Path) -> float:
    """The RSS once an estimate has run: the first one imports ``gguf`` (and numpy with it), once."""
    model = folder / "valid.gguf"
    model.write_bytes(valid())
    with served.admin() as admin:
        for _ in range(3):
            assert admin.post("/estimate", json={"model": str(model)}).status_code == 200
    time.sleep(0.5)  # (settling the RSS figure; the bound below has 20 MiB of room, not a timing)
    return served.rss_mib()


def test_every_hostile_gguf_is_refused_at_once_within_20_mib(front: Front, tmp_path: Path) -> None:
    before = front.served.rss_mib()
    idle = warm(front.served, tmp_path)
    front.figures.append(("estimate: three valid ones first (the first imports gguf)", before, idle, idle))
    files = {name: (path, SHAPES[name][1]) for name, path in write_shapes(tmp_path / "shapes").items()}
    files.update(write_specials(tmp_path / "specials"))
    slow: list[str] = []
    with front.served.admin() as admin:
        for name, (path, words) in files.items():
            with Peak(front.served) as peak:
                began = time.monotonic()
                resp = admin.post("/estimate", json={"model": str(path), "args": ["-c", "4096"]})
                took = time.monotonic() - began
            front.figures.append((f"estimate: {name} ({took * 1000:.0f} ms)", idle, peak.peak, front.served.rss_mib()))
            assert resp.status_code == 422, (name, resp.text)
            error = resp.json()["error"]
            assert error["code"] == "invalid_input" and error["field"] == "model", (name, error)
            assert words in error["message"] and "\n" not in error["message"], (name, error)
            assert peak.peak - idle < RSS_BOUND_MIB, (name, idle, peak.peak)
            if took >= SECONDS:
                slow.append(f"{name}: {took:.2f} s")
    assert slow == []
    assert front.served.proc is not None and front.served.proc.poll() is None  # still serving
