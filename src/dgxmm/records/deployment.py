"""The deployment record, its states and the transitions the deployer may make between them.

The record is the deployer's and frozen: every other part of dgxmm reads the stored record itself
(no copy), and only the deployer's one writer makes a new one. The transition table is a pure
function so the state machine can be tested without engines.
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, JsonValue


class State(StrEnum):
    PLANNED = "planned"
    STARTING = "starting"
    READY = "ready"
    ASLEEP = "asleep"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


class Mode(StrEnum):
    ON_DEMAND = "on_demand"
    ALWAYS_ON = "always_on"


class Role(StrEnum):
    MODEL = "model"
    SYSTEM = "system"
    DECIDER = "decider"


# Engines in these states occupy their declared memory: a starting engine is loading, a stopping
# one has not released it yet, and an asleep one keeps its weights in the same (unified) pool.
HOLDS_MEMORY = frozenset({State.STARTING, State.READY, State.ASLEEP, State.STOPPING})

# Engines in these states may have a process or container behind them.
RUNNING = HOLDS_MEMORY

# A ``model`` that names a repository of the Hugging Face Hub (``hf://ORG/REPO[@REV][/PATH]``,
# modelstore/names.py) rather than a path: the model store fetches its files, and the engine is
# given their local path (``model_path``) once they are verified.
HUB_SCHEME = "hf://"

# What a model can do, in Ollama's words (``POST /api/show``'s ``capabilities``).
Capability = Literal["completion", "tools", "insert", "vision", "embedding", "thinking"]

TRANSITIONS: dict[State, frozenset[State]] = {
    State.PLANNED: frozenset({State.STARTING, State.STOPPED, State.FAILED}),
    State.STOPPED: frozenset({State.STARTING, State.PLANNED}),
    State.FAILED: frozenset({State.STARTING, State.STOPPING, State.STOPPED, State.PLANNED}),
    State.STARTING: frozenset({State.READY, State.FAILED, State.STOPPING}),
    State.READY: frozenset({State.ASLEEP, State.STOPPING, State.FAILED}),
    # asleep -> ready only when the engine refused to go to sleep
    State.ASLEEP: frozenset({State.STARTING, State.READY, State.STOPPING, State.FAILED}),
    State.STOPPING: frozenset({State.STOPPED, State.FAILED}),
}


def can_transition(old: State, new: State) -> bool:
    """Whether the state machine allows ``old -> new``."""
    return new in TRANSITIONS[old]


class InvalidTransition(Exception):
    def __init__(self, deployment_id: str, old: State, new: State) -> None:
        super().__init__(f"deployment {deployment_id}: {old} -> {new} is not allowed")
        self.old, self.new = old, new


class RuntimeHandle(BaseModel):
    """Where a running engine is and how the runtime finds it again after a dgxmm restart."""

    model_config = ConfigDict(frozen=True)

    ref: str
    base_url: str
    port: int | None = None
    # The key this run of the engine demands (``EngineKind.api_key_env``); dgxmm sends it with
    # every request it makes or forwards. None: the engine demands none.
    api_key: str | None = None
    # The process runtime's engine: its leader's start time (clock ticks since boot), so that a
    # later dgxmm adopts the process it started and never another that got the pid since.
    started_ticks: int | None = None

    @property
    def auth(self) -> dict[str, str]:
        """The header that carries the engine's key, for dgxmm's own calls (probes, metrics)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


class MemoryLimit(BaseModel):
    """The memory limit an engine is launched with (deploy/limits.py), kept on the record so the
    deployment view shows what dgxmm applied."""

    model_config = ConfigDict(frozen=True)

    flag: str  # the flag (or, for VLLM_CPU_KVCACHE_SPACE, the variable) that sets the limit
    value: str  # its value, as the engine reads it
    gib: float  # the memory it grants the engine, in GiB (a KV cache size plus the weights)
    set_by: Literal["dgxmm", "deployment"]
    added: list[str]  # the arguments dgxmm appends to the engine's own
    device_total_gib: float | None = None  # what a share of the device is a share of
    weights_gib: float | None = None  # the model's weight files, when dgxmm can read them


class Deployment(BaseModel):
    """One stored deployment. ``mode`` None reads as always_on (rows from before on-demand).

    Frozen: a record cannot be changed in place (an assignment raises pydantic's ``frozen_instance``
    error and mypy reports it), so the deployer hands its stored records to every reader without a
    copy, and every change is a new record the deployer's one writer stores (``model_copy(update=...)``),
    with its event, audit row and store write. Its lists and dicts are not to be changed either.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    served_name: str
    aliases: list[str] = Field(default_factory=list)  # more names callers may use (the model router)
    engine: str
    model: str = ""
    # For a model a hub names: the local file or snapshot directory the model store verified, what
    # the engine is given; set by the deployer once the files are here, None until then (and for a
    # local model).
    model_path: str | None = None
    image: str | None = None
    args: list[str] = Field(default_factory=list)
    command: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    memory_gib: float
    role: Role = Role.MODEL
    mode: Mode | None = Mode.ALWAYS_ON
    idle_timeout_s: float | None = None
    preload: bool = False  # on demand: started when dgxmm starts (and when created) if it fits as it is
    pending_mode: Mode | None = None
    sleep_mode: bool = False
    # Which vLLM sleep level (deploy/sleeplevels.py): 1, 2 or "kv"; None: what frees memory here.
    sleep_level: Literal[1, 2, "kv"] | None = None
    # How many devices the engine spans (vLLM's tensor x pipeline parallel size); 0: none (a CPU
    # engine on a GPU host); None: one, and for a container the engine kind's default GPU request.
    gpus: int | None = None
    gpu_ids: list[int] | None = None  # the devices it may run on (pins), as many as it spans
    placed_on: list[int] | None = None  # where the deployer placed its running engine (set at each start)
    volumes: list[str] = Field(default_factory=list)  # container engines: "host:container[:ro]"
    shm_size: str | None = None  # container engines: /dev/shm size, e.g. "8g"
    health_path: str | None = None
    metrics_path: str | None = None
    # The gateway's pool of connections to this engine (None: [ondemand] upstream_max_connections).
    upstream_max_connections: int | None = None
    # At most this many requests in flight on the model through dgxmm; the others wait their turn
    # in arrival order (controller/turns.py). None: no limit.
    max_concurrent: int | None = None
    # What the gateway sets in each chat, completion and responses body when the client did not,
    # what it sets whatever the client sent, and what it removes (gateway/bodyparams.py).
    request_defaults: dict[str, JsonValue] = Field(default_factory=dict)
    request_overrides: dict[str, JsonValue] = Field(default_factory=dict)
    strip_params: list[str] = Field(default_factory=list)
    # What the model can do, as Ollama's /api/show says it (ollama/views.py), where its files cannot
    # tell; empty: what they show.
    capabilities: list[Capability] = Field(default_factory=list)
    # Who owns its settings: "api" (the admin API and the console) or "config" (a [[deployments]]
    # table; ``declared_in`` names its file). The API refuses to edit or delete a declared one.
    managed_by: Literal["api", "config"] = "api"
    declared_in: str | None = None
    memory_limit: MemoryLimit | None = None  # set by the deployer at creation and at each start
    state: State = State.STOPPED
    state_reason: str = ""
    runtime_handle: RuntimeHandle | None = None
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    state_changed_at: float = Field(default_factory=time.time)

    @property
    def effective_mode(self) -> Mode:
        return self.mode or Mode.ALWAYS_ON

    @property
    def is_on_demand(self) -> bool:
        return self.effective_mode is Mode.ON_DEMAND

    @property
    def is_fixed(self) -> bool:
        """Counts against capacity: always-on models and system or decider deployments."""
        return self.role is not Role.MODEL or not self.is_on_demand

    @property
    def holds_memory(self) -> bool:
        return self.state in HOLDS_MEMORY

    @property
    def device_count(self) -> int:
        """How many devices the engine spans (``gpus``; one when unset)."""
        return 1 if self.gpus is None else self.gpus

    @property
    def from_hub(self) -> bool:
        """Its model is named by a hub (``HUB_SCHEME``), not a path."""
        return self.model.startswith(HUB_SCHEME)

    @property
    def awaits_files(self) -> bool:
        """A hub model whose files are not verified here yet: no engine may start on it."""
        return self.from_hub and self.model_path is None

    @property
    def local_model(self) -> str:
        """What the engine loads: a hub model's local path, else ``model`` itself."""
        return self.model_path if self.from_hub and self.model_path is not None else self.model

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a caller may give as ``model``: the served name, then the aliases."""
        return (self.served_name, *self.aliases)

    @property
    def base_url(self) -> str | None:
        if self.runtime_handle is None or self.state not in RUNNING:
            return None
        return self.runtime_handle.base_url

    def config_fingerprint(self) -> tuple[Any, ...]:
        """What a start depends on: a change of any of it resets an on-demand start backoff."""
        return (
            self.engine,
            self.model,
            self.model_path,
            self.image,
            tuple(self.args),
            tuple(self.command or ()),
            tuple(sorted(self.env.items())),
            self.memory_gib,
            self.sleep_mode,
            self.sleep_level,
            self.health_path,
            self.metrics_path,
            self.gpus,
            tuple(self.volumes),
            self.shm_size,
            tuple(self.gpu_ids or ()),
        )


class DeploymentReader(Protocol):
    """A deployment's record by its id, for a part that reads one and changes nothing (the
    deployer's ``get``: ``NotFound``, a 404, for an id it does not have)."""

    def get(self, deployment_id: str) -> Deployment: ...
