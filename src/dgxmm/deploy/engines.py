"""Engine kinds: everything dgxmm knows of each kind of engine, in one place.

A kind is data plus a few small functions: its name and label (the API and the UI take both
from here, ``GET /api/host``), what a deployment of it must give (a model or a command), whether
it can sleep, how its memory is limited (the strategy ``limits.py`` applies), how to launch it as
a process or a container, where it answers health and metrics, and its metric names. The model
an engine is given is the deployment's ``local_model``: for a model a hub names, the local file
or snapshot the model store verified.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from dgxmm.deploy import placeholders
from dgxmm.deploy.gpus import tensor_parallel_args
from dgxmm.records.deployment import Deployment
from dgxmm.settings import EngineSettings

VLLM_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")
LLAMACPP_METRICS = ("llamacpp:requests_processing", "llamacpp:requests_deferred")
# SGLang's scheduler gauges (its metrics collector, in SGLang 0.5.23), served with --enable-metrics.
SGLANG_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs")


@dataclass(frozen=True)
class Load:
    running: float
    waiting: float


@dataclass(frozen=True)
class EngineKind:
    name: str
    label: str  # how people call it (the UI's cards, the wizard's choice)
    needs: Literal["model", "command"]  # what a deployment of this kind must give
    can_sleep: bool  # whether a deployment may turn on its sleep mode (``sleep_mode``)
    memory_limit: Literal["vllm", "sglang", "gguf", "none"]  # how limits.py holds it to ``memory_gib``
    summary: str  # what it is, in a few words, beside the label where there is room
    # (running, waiting) metric name pairs this kind may expose; values are summed over labels.
    metrics: tuple[tuple[str, str], ...]
    argv: Callable[[Deployment, int, EngineSettings], list[str]]
    # Container form (docker runtime): the command after the image's entrypoint, and defaults.
    container_cmd: Callable[[Deployment, int], list[str]] = lambda dep, port: []
    image: Callable[[EngineSettings], str | None] = lambda settings: None
    gpus: bool = False
    shm_size: str | None = None
    container_port: int = 8000
    extra_env: Callable[[Deployment], dict[str, str]] = lambda dep: {}
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    # The variable through which the engine takes an API key: dgxmm gives each run of it a key of
    # its own, so that no other local process can call it (its port is in its command line).
    api_key_env: str | None = None
    # The engine closes its connection after every streamed answer, while its headers still offer
    # keep-alive: the gateway must not pool such a connection (llama-server's HTTP library ends a
    # chunked answer by reporting failure, which closes the connection).
    closes_after_streams: bool = False

    def sleeps(self, dep: Deployment) -> bool:
        """Whether the deployment's engine has its sleep mode on (``/sleep``, ``/wake_up``)."""
        return self.can_sleep and dep.sleep_mode

    def describe(self, settings: EngineSettings) -> dict[str, object]:
        """What the API tells of the kind (``GET /api/host``, ``engines``)."""
        return {
            "name": self.name,
            "label": self.label,
            "summary": self.summary,
            "needs": self.needs,
            "can_sleep": self.can_sleep,
            "image": self.image(settings),
        }

    def health_path_of(self, dep: Deployment) -> str:
        return dep.health_path or self.health_path

    def metrics_path_of(self, dep: Deployment) -> str:
        return dep.metrics_path or self.metrics_path

    def parse_load(self, text: str) -> Load:
        """Running and waiting requests from a Prometheus text page; raises ValueError if absent."""
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
        for running, waiting in self.metrics:
            if running in values or waiting in values:
                return Load(values.get(running, 0.0), values.get(waiting, 0.0))
        names = ", ".join(name for pair in self.metrics for name in pair)
        raise ValueError(f"metrics page has none of {names}")


def _fill(template: list[str], dep: Deployment, port: int) -> list[str]:
    values = {"port": str(port), "model": dep.local_model, "served_name": dep.served_name}
    return [placeholders.fill(part, values) for part in template]


def _command_argv(dep: Deployment, port: int, settings: EngineSettings) -> list[str]:
    return _fill(dep.command or [], dep, port)


def _llamacpp_argv(dep: Deployment, port: int, settings: EngineSettings) -> list[str]:
    return [
        settings.llamacpp_bin,
        "-m",
        dep.local_model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--alias",
        dep.served_name,
        "--metrics",
        *_fill(dep.args, dep, port),
    ]


def _limit_args(dep: Deployment) -> list[str]:
    """dgxmm's memory limit (deploy/limits.py), last so that it wins over anything before it."""
    return list(dep.memory_limit.added) if dep.memory_limit is not None else []


def _vllm_argv(dep: Deployment, port: int, settings: EngineSettings) -> list[str]:
    # `python -m` because the CPU build's `vllm` CLI cannot find its own version.
    argv = [
        settings.vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        dep.local_model,
        "--served-model-name",
        dep.served_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if dep.sleep_mode:
        argv.append("--enable-sleep-mode")
    return argv + _fill(dep.args, dep, port) + tensor_parallel_args(dep) + _limit_args(dep)


def _sglang_flags(dep: Deployment, host: str, port: int) -> list[str]:
    # --enable-metrics: SGLang serves /metrics only when asked, and dgxmm reads idleness there.
    argv = ["--model-path", dep.local_model, "--served-model-name", dep.served_name, "--host", host]
    argv += ["--port", str(port), "--enable-metrics"]
    return argv + _fill(dep.args, dep, port) + tensor_parallel_args(dep) + _limit_args(dep)


def _sglang_argv(dep: Deployment, port: int, settings: EngineSettings) -> list[str]:
    return [settings.sglang_python, "-m", "sglang.launch_server", *_sglang_flags(dep, "127.0.0.1", port)]


def _sglang_container(dep: Deployment, port: int) -> list[str]:
    # The lmsysorg/sglang image has no server entrypoint: its documented command is this one.
    return ["python3", "-m", "sglang.launch_server", *_sglang_flags(dep, "0.0.0.0", port)]


def _command_container(dep: Deployment, port: int) -> list[str]:
    return _fill(dep.command or [], dep, port)


def _llamacpp_container(dep: Deployment, port: int) -> list[str]:
    # The llama.cpp server image's entrypoint is llama-server itself.
    return [
        "-m",
        dep.local_model,
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--alias",
        dep.served_name,
        "--metrics",
        *_fill(dep.args, dep, port),
    ]


def _vllm_container(dep: Deployment, port: int) -> list[str]:
    # The vLLM image's entrypoint is its OpenAI server; it takes the same flags.
    argv = [
        "--model",
        dep.local_model,
        "--served-model-name",
        dep.served_name,
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
    ]
    if dep.sleep_mode:
        argv.append("--enable-sleep-mode")
    return argv + _fill(dep.args, dep, port) + tensor_parallel_args(dep) + _limit_args(dep)


def _vllm_env(dep: Deployment) -> dict[str, str]:
    # vLLM serves /sleep and /wake_up only in its development mode.
    return {"VLLM_SERVER_DEV_MODE": "1"} if dep.sleep_mode else {}


ENGINES: dict[str, EngineKind] = {
    "llamacpp": EngineKind(
        "llamacpp",
        "llama.cpp",
        "model",
        False,
        "gguf",
        "",
        (LLAMACPP_METRICS,),
        _llamacpp_argv,
        container_cmd=_llamacpp_container,
        image=lambda s: s.llamacpp_image,
        container_port=8080,
        closes_after_streams=True,
        api_key_env="LLAMA_API_KEY",
    ),
    "vllm": EngineKind(
        "vllm",
        "vLLM",
        "model",
        True,
        "vllm",
        "",
        (VLLM_METRICS,),
        _vllm_argv,
        extra_env=_vllm_env,
        container_cmd=_vllm_container,
        image=lambda s: s.vllm_image,
        gpus=True,
        shm_size="8g",
        api_key_env="VLLM_API_KEY",
    ),
    "sglang": EngineKind(
        "sglang",
        "SGLang",
        "model",
        False,  # its release/resume memory routes differ from vLLM's /sleep: not offered yet
        "sglang",
        "",
        (SGLANG_METRICS,),
        _sglang_argv,
        container_cmd=_sglang_container,
        image=lambda s: s.sglang_image,
        gpus=True,
        shm_size="32g",  # SGLang's docker instructions give 32g
        container_port=30000,
    ),
    "command": EngineKind(
        "command",
        "Command",
        "command",
        True,
        "none",
        "any OpenAI-compatible server",
        (VLLM_METRICS, LLAMACPP_METRICS, SGLANG_METRICS),
        _command_argv,
        container_cmd=_command_container,
    ),
}


# The names a deployment's ``engine`` may take (the API's schema lists them), written out so the
# type checker reads them; tests/unit/test_engines.py holds them to ENGINES' keys.
EngineName = Literal["llamacpp", "vllm", "sglang", "command"]


def engine_of(dep: Deployment) -> EngineKind:
    return ENGINES[dep.engine]
