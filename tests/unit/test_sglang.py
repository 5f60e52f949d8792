"""The ``sglang`` engine kind: its command lines, its memory share, its devices and its load.

Whether SGLang's own parser takes these command lines is tests/sglang's (it needs SGLang)."""

from __future__ import annotations

from typing import Any

import pytest

from dgxmm.deploy.engines import ENGINES
from dgxmm.deploy.gpus import settled
from dgxmm.deploy.limits import EngineLimits
from dgxmm.errors import InvalidInput
from dgxmm.records.deployment import Deployment
from dgxmm.settings import EngineSettings

KIND = ENGINES["sglang"]


def dep(**kw: Any) -> Deployment:
    base = {"id": "s", "name": "s", "served_name": "qwen", "engine": "sglang", "memory_gib": 32, "model": "/m/qwen"}
    return Deployment(**{**base, **kw})


def limited(d: Deployment, total: float = 128, spans: int = 1) -> Deployment:
    limits = EngineLimits(lambda index: total, EngineSettings(), spans=lambda _: spans)
    return d.model_copy(update={"memory_limit": limits.resolve(d)})


def test_the_process_command_line() -> None:
    d = limited(dep(args=["--context-length", "8192"]))
    assert KIND.argv(d, 41867, EngineSettings(sglang_python="/opt/sgl/bin/python")) == [
        "/opt/sgl/bin/python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/m/qwen",
        "--served-model-name",
        "qwen",
        "--host",
        "127.0.0.1",
        "--port",
        "41867",
        "--enable-metrics",
        "--context-length",
        "8192",
        "--mem-fraction-static",
        "0.25",
    ]


def test_the_container_command_line_runs_the_server_in_the_image() -> None:
    d = limited(dep())
    assert KIND.container_port == 30000 and KIND.image(EngineSettings()) == "lmsysorg/sglang:latest"
    assert KIND.container_cmd(d, 30000) == [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/m/qwen",
        "--served-model-name",
        "qwen",
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
        "--enable-metrics",
        "--mem-fraction-static",
        "0.25",
    ]


@pytest.mark.parametrize(
    ("memory", "total", "spans", "share"), [(32, 128, 1, "0.25"), (40, 119.7, 1, "0.334"), (120, 80, 2, "0.75")]
)
def test_the_share_is_vllms_arithmetic(memory: float, total: float, spans: int, share: str) -> None:
    d = limited(dep(memory_gib=memory), total, spans)
    assert d.memory_limit is not None
    assert (d.memory_limit.flag, d.memory_limit.value, d.memory_limit.set_by) == (
        "--mem-fraction-static",
        share,
        "dgxmm",
    )


def test_its_own_share_is_kept_when_it_fits_and_refused_when_it_claims_more() -> None:
    d = limited(dep(args=["--mem-fraction-static", "0.2"]))
    assert d.memory_limit is not None
    assert (d.memory_limit.set_by, d.memory_limit.added, d.memory_limit.gib) == ("deployment", [], pytest.approx(25.6))
    assert KIND.argv(d, 1, EngineSettings()).count("--mem-fraction-static") == 1
    with pytest.raises(InvalidInput, match=r"--mem-frac 0.9 claims 115.20 GiB, more than memory_gib 32") as info:
        limited(dep(args=["--mem-frac", "0.9"]))
    assert info.value.field == "args"


def test_a_share_sglang_cannot_take_is_refused_on_memory_gib() -> None:
    with pytest.raises(InvalidInput, match="--mem-fraction-static must be between") as info:
        limited(dep(memory_gib=200))
    assert info.value.field == "memory_gib"


def test_placed_on_several_devices_it_gets_tp_size_unless_it_gave_its_own() -> None:
    d = limited(dep(placed_on=[0, 1], gpus=2), 80, 2)
    argv = KIND.argv(d, 1, EngineSettings())
    assert argv[argv.index("--tp-size") + 1] == "2" and "--tensor-parallel-size" not in argv
    own = dep(placed_on=[0, 1], args=["--tensor-parallel-size", "2"])
    assert KIND.argv(own, 1, EngineSettings()).count("--tp-size") == 0


@pytest.mark.parametrize(
    ("args", "gpus"), [(["--tp-size", "2"], 2), (["--tp-size=2", "--pp-size", "2"], 4), ([], None)]
)
def test_its_own_parallel_flags_set_how_many_devices_it_spans(args: list[str], gpus: int | None) -> None:
    assert settled(dep(args=args), [0, 1, 2, 3], pooled=False).gpus == gpus


def test_vllms_short_flags_are_not_sglangs() -> None:
    """``-tp`` is vLLM's; SGLang's parser has no such flag, so it spans nothing here."""
    assert settled(dep(args=["-tp", "2"]), [0, 1], pooled=False).gpus is None


SGLANG_PAGE = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="qwen",tp_rank="0"} 2.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="qwen",tp_rank="0"} 5.0
"""


def test_its_load_is_read_from_its_scheduler_gauges() -> None:
    load = KIND.parse_load(SGLANG_PAGE)
    assert (load.running, load.waiting) == (2, 5)
    assert ENGINES["command"].parse_load(SGLANG_PAGE).waiting == 5  # a command engine may be SGLang
    with pytest.raises(ValueError, match="none of sglang:num_running_reqs"):
        KIND.parse_load("vllm:num_requests_running 1\n")


def test_it_offers_no_sleep_and_no_key_variable() -> None:
    """Its release/resume routes are not vLLM's /sleep; it reads its key only from --api-key,
    which would show the key in its command line (docs/engines.md#sglang)."""
    assert not KIND.sleeps(dep(sleep_mode=True)) and KIND.api_key_env is None
    assert KIND.describe(EngineSettings())["label"] == "SGLang"
