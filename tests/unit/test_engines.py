"""Engine kinds: launch arguments and the running/waiting numbers read from /metrics."""

from __future__ import annotations

import pytest

from dgxmm.deploy.engines import ENGINES
from dgxmm.records.deployment import Deployment
from dgxmm.settings import EngineSettings


def dep(**kw: object) -> Deployment:
    base = {
        "id": "x",
        "name": "x",
        "served_name": "tiny",
        "engine": "command",
        "memory_gib": 1,
        "model": "/m/tiny.gguf",
    }
    return Deployment(**{**base, **kw})


def test_command_placeholders() -> None:
    d = dep(command=["srv", "--port", "{port}", "--name={served_name}", "{model}"])
    assert ENGINES["command"].argv(d, 1234, EngineSettings()) == [
        "srv",
        "--port",
        "1234",
        "--name=tiny",
        "/m/tiny.gguf",
    ]


def test_llamacpp_argv() -> None:
    d = dep(engine="llamacpp", args=["-c", "2048"])
    argv = ENGINES["llamacpp"].argv(d, 5, EngineSettings(llamacpp_bin="/bin/llama-server"))
    assert argv == [
        "/bin/llama-server",
        "-m",
        "/m/tiny.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "5",
        "--alias",
        "tiny",
        "--metrics",
        "-c",
        "2048",
    ]
    assert not ENGINES["llamacpp"].sleeps(d)


def test_vllm_argv_and_sleep_mode() -> None:
    d = dep(engine="vllm", sleep_mode=True)
    kind = ENGINES["vllm"]
    argv = kind.argv(d, 7, EngineSettings(vllm_python="py"))
    assert argv[:3] == ["py", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-sleep-mode" in argv and argv[argv.index("--port") + 1] == "7"
    assert kind.extra_env(d) == {"VLLM_SERVER_DEV_MODE": "1"} and kind.sleeps(d)


VLLM_PAGE = """# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
"""

LLAMA_PAGE = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""


def test_parse_load() -> None:
    load = ENGINES["vllm"].parse_load(VLLM_PAGE)
    assert (load.running, load.waiting) == (2, 3)
    load = ENGINES["llamacpp"].parse_load(LLAMA_PAGE)
    assert (load.running, load.waiting) == (1, 0)
    load = ENGINES["command"].parse_load(LLAMA_PAGE)  # command engines may speak either
    assert (load.running, load.waiting) == (1, 0)


def test_parse_load_without_the_metrics_is_an_error() -> None:
    with pytest.raises(ValueError, match="none of"):
        ENGINES["vllm"].parse_load(LLAMA_PAGE)


def test_the_engine_names_the_api_takes_are_the_kinds() -> None:
    """``EngineName`` is written out for the type checker: it must list exactly ENGINES' keys."""
    from typing import get_args

    from dgxmm.deploy.engines import ENGINES, EngineName

    assert set(get_args(EngineName)) == set(ENGINES)
