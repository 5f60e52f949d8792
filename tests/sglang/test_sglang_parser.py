"""Every command line dgxmm builds for SGLang, parsed by the parser of an SGLang dgxmm is given.

Collected only when ``DGXMM_SGLANG_PYTHON`` names a Python that imports ``sglang`` (tests/conftest.py);
SGLang needs a GPU build of PyTorch to run, but its parser does not, so any Python with SGLang and
its light dependencies will do (docs/engines.md#sglang says how this was run)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from dgxmm.deploy.engines import ENGINES
from dgxmm.deploy.limits import MEM_FRACTION_STEMS, EngineLimits
from dgxmm.records.deployment import Deployment
from dgxmm.settings import EngineSettings

SGLANG_PYTHON = os.environ.get("DGXMM_SGLANG_PYTHON", "")
if not SGLANG_PYTHON:  # tests/conftest.py leaves this directory out then; named explicitly, it fails
    raise RuntimeError("DGXMM_SGLANG_PYTHON is not set: name a Python that imports sglang")


def probe(checks: list[list[str]]) -> dict[str, Any]:
    done = subprocess.run(
        [SGLANG_PYTHON, str(Path(__file__).with_name("parser_probe.py"))],
        input=json.dumps(checks),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line is not None, f"the probe printed no report (exit {done.returncode}): {done.stderr[-2000:]}"
    report: dict[str, Any] = json.loads(line.removeprefix("PROBE "))
    return report


def test_every_flag_dgxmm_passes_exists_in_sglangs_parser() -> None:
    """The process and container forms, dgxmm's share and tensor parallel size, parse and mean
    what dgxmm intends; a made-up flag is caught, so the check can fail."""
    kind = ENGINES["sglang"]
    base = Deployment(
        id="s",
        name="s",
        served_name="tiny",
        engine="sglang",
        model="/m",
        memory_gib=32,
        args=["--context-length", "1024"],
    )
    placed = base.model_copy(update={"placed_on": [0, 1], "gpus": 2})
    base = base.model_copy(update={"memory_limit": EngineLimits(lambda i: 128, EngineSettings()).resolve(base)})
    two = EngineLimits(lambda i: 80, EngineSettings(), spans=lambda _: 2)
    placed = placed.model_copy(update={"memory_limit": two.resolve(placed)})
    lines = [
        kind.argv(base, 8123, EngineSettings())[3:],
        kind.container_cmd(base, 30000)[3:],
        kind.argv(placed, 8124, EngineSettings())[3:],
        ["--model-path", "/m", "--no-such-flag-dgxmm-made-up", "1"],
    ]
    report = probe(lines)
    process, container, several, made_up = report["results"]
    assert process["ok"], process
    values = process["values"]
    assert (values["model_path"], values["served_model_name"], values["port"]) == ("/m", "tiny", 8123)
    assert values["mem_fraction_static"] == 0.25 and values["enable_metrics"] is True
    assert values["context_length"] == 1024 and values["host"] == "127.0.0.1"
    assert container["ok"] and container["values"]["host"] == "0.0.0.0", container
    assert several["ok"] and several["values"]["tp_size"] == 2, several
    assert several["values"]["mem_fraction_static"] == 0.2  # 32 GiB over two 80 GiB devices
    assert not made_up["ok"] and "--no-such-flag-dgxmm-made-up" in made_up["error"][0]
    # dgxmm finds a deployment's own share by this stem (argparse takes abbreviations): it must
    # name exactly one flag of the parser.
    for stem in MEM_FRACTION_STEMS:
        assert [opt for opt in report["options"] if opt.startswith(stem)] == ["--mem-fraction-static"]
