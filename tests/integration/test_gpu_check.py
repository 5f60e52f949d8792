"""``make gpu-check DRY_RUN=1`` (issue 52 item 6): the GPU check's own steps, run here against the
suite's vLLM stand-in, give every column of its table. What it proves: the script drives dgxmm
through each step (three cold starts with the compile cache kept and cleared, as vLLM's log lines
say; sleep and wake; placement on a declared device and the engine's CUDA_VISIBLE_DEVICES); the
figures of a GPU come only from a run on one (docs/engines.md#the-gpu-check)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import TESTS

SCRIPT = TESTS.parent / "scripts" / "gpu_check.py"


def test_the_dry_run_walks_every_step_and_fills_the_table(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--json", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(out.read_text())
    assert [r["step"] for r in rows] == [
        "cold start, first",
        "cold start, cache kept",
        "cold start, cache cleared",
        "sleep level 1",
        "wake level 1",
    ]
    # The stand-in says what vLLM says: compiled, then loaded from the kept cache, compiled again
    # once it was cleared.
    assert [r["compile_cache"] for r in rows[:3]] == ["compiled", "loaded", "compiled"]
    for row in rows[:3]:
        assert row["seconds"] > 0 and 0 < row["engine_s"] <= row["seconds"] + 0.01
        assert row["dgxmm_added_s"] is not None
    assert rows[3]["freed_gib"] is not None and rows[4]["seconds"] > 0
    assert all(r["placed_on"] == [0] and r["cuda_visible_devices"] == "0" for r in rows)
    assert all(r["memory_source"] == "meminfo (dry run)" for r in rows)
    header = done.stdout.splitlines()[0]
    for title in ("took (s)", "engine ready (s)", "dgxmm added (s)", "compile cache", "memory freed (GiB)"):
        assert title in header
    assert len(done.stdout.splitlines()) == 2 + len(rows)
