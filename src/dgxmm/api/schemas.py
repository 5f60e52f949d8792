"""Request bodies of the admin API. Each field is checked here so a 422 can name it."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from dgxmm.api import requestparams
from dgxmm.deploy import placeholders
from dgxmm.deploy.engines import ENGINES, EngineName
from dgxmm.modelstore.names import parse as parse_hub_name
from dgxmm.records.deployment import Capability, Mode, Role
from dgxmm.front.limits import CONNECTION_CEILING

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # used with fullmatch: no "$" before a newline
_SIZE = re.compile(r"[0-9]+[bkmgBKMG]?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what a shell and execve() take as a variable's name
# A deployment's own gateway pool: no more connections to one engine than the front door admits.
MAX_UPSTREAM_CONNECTIONS = CONNECTION_CEILING
MAX_ALIASES = 32
MAX_CONCURRENT = CONNECTION_CEILING  # requests in flight on one model: no more than connections
MAX_DEVICES = 64  # devices an engine may span, and device indices (a host has at most 8 or 16)


class DeploymentCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    served_name: str | None = None
    aliases: list[str] = Field(default_factory=list, max_length=MAX_ALIASES)
    engine: EngineName
    model: str = ""
    memory_gib: float = Field(gt=0, le=4096)
    mode: Mode = Mode.ALWAYS_ON
    idle_timeout_s: float | None = None
    preload: bool = False
    role: Role = Role.MODEL
    command: list[str] | None = None
    image: str | None = None
    args: list[str] = Field(default_factory=list)
    sleep_mode: bool = False
    sleep_level: Literal[1, 2, "kv"] | None = None  # deploy/sleeplevels.py; null: what frees memory here
    # How many devices the engine spans (true and false, as before: 1 and 0, no GPU); null: one.
    gpus: int | None = Field(None, ge=0, le=MAX_DEVICES)
    gpu_ids: list[Annotated[int, Field(ge=0, lt=MAX_DEVICES)]] | None = Field(
        None, min_length=1, max_length=MAX_DEVICES
    )
    volumes: list[str] = Field(default_factory=list)
    shm_size: str | None = None
    health_path: str | None = None
    metrics_path: str | None = None
    upstream_max_connections: int | None = Field(None, ge=1, le=MAX_UPSTREAM_CONNECTIONS)
    # Requests in flight on the model through dgxmm; the others wait their turn (null: no limit).
    # Strict: "2", 2.5 and true are refused, not read as 2 or 1.
    max_concurrent: int | None = Field(None, ge=1, le=MAX_CONCURRENT, strict=True)
    env: dict[str, str] = Field(default_factory=dict)
    # What the gateway sets in, forces on and removes from each chat, completion and responses
    # body (gateway/bodyparams.py; bounds: requestparams).
    request_defaults: dict[str, JsonValue] = Field(default_factory=dict)
    request_overrides: dict[str, JsonValue] = Field(default_factory=dict)
    strip_params: list[str] = Field(default_factory=list)
    # What the model can do where its files cannot tell (Ollama's /api/show); each once.
    capabilities: list[Capability] = Field(default_factory=list, max_length=6)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError("1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @field_validator("served_name")
    @classmethod
    def _served_name(cls, value: str | None) -> str | None:
        if value is not None:
            _check_model_name(value)
        return value

    @field_validator("aliases")
    @classmethod
    def _aliases(cls, value: list[str]) -> list[str]:
        for alias in value:
            _check_model_name(alias, f"{alias!r}: ")
        if len(set(value)) != len(value):
            raise ValueError("each alias may appear once")
        return value

    @field_validator("model", "image")
    @classmethod
    def _no_nul(cls, value: str | None) -> str | None:
        if value is not None and "\0" in value:
            raise ValueError("must not contain a NUL byte")
        return value

    @field_validator("model")
    @classmethod
    def _hub_name(cls, value: str) -> str:
        """A model a hub names is one dgxmm can pull (docs/models.md, "Deployments by name")."""
        try:
            parse_hub_name(value)
        except ValueError as exc:
            raise ValueError(str(exc).removeprefix("model: ")) from None
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            if not _ENV_NAME.fullmatch(name):
                raise ValueError(
                    f"{name!r} is not a variable name (letters, digits and '_', not starting with a digit)"
                )
            if "\0" in text:
                raise ValueError(f"{name}: the value must not contain a NUL byte")
        return value

    @field_validator("health_path", "metrics_path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value

    @field_validator("volumes")
    @classmethod
    def _volumes(cls, value: list[str]) -> list[str]:
        for volume in value:
            parts = volume.split(":")
            if (
                len(parts) not in (2, 3)
                or not parts[0]
                or not parts[1].startswith("/")
                or (len(parts) == 3 and parts[2] not in ("ro", "rw"))
            ):
                raise ValueError(f"{volume!r} is not 'host:/container/path[:ro|rw]'")
        return value

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, value: str | None) -> str | None:
        if value is not None and not _SIZE.fullmatch(value):
            raise ValueError("a size such as '8g', '512m' or '1073741824'")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not value[0]):
            raise ValueError("must name a program to run")
        return value

    @field_validator("command", "args")
    @classmethod
    def _placeholders(cls, value: list[str] | None) -> list[str] | None:
        for part in value or []:
            if "\0" in part:  # execve() cannot pass it: what runs would differ from what is stored
                raise ValueError("must not contain a NUL byte")
            placeholders.check(part)  # a BadPlaceholder is a ValueError: 422 naming the field
        return value

    @model_validator(mode="after")
    def _engine_needs(self) -> DeploymentCreate:
        kind = ENGINES[self.engine]
        if kind.needs == "command" and self.command is None:
            raise ValueError(f"command: required for the {self.engine} engine")
        if kind.needs == "model" and not self.model:
            raise ValueError(f"model: required for the {self.engine} engine")
        if self.role is not Role.MODEL and self.mode is Mode.ON_DEMAND:
            raise ValueError(f"mode: a {self.role} deployment is always always_on")
        if self.sleep_mode and not kind.can_sleep:
            raise ValueError(f"sleep_mode: {kind.label} has no sleep mode")
        if self.sleep_level is not None and not self.sleep_mode:
            raise ValueError("sleep_level: only with sleep_mode true")
        if (self.served_name or self.name) in self.aliases:
            raise ValueError(f"aliases: {(self.served_name or self.name)!r} is the served name already")
        requestparams.check(self.request_defaults, self.request_overrides, self.strip_params)
        if len(set(self.capabilities)) < len(self.capabilities):
            raise ValueError("capabilities: each at most once")
        return self


def _check_model_name(value: str, where: str = "") -> None:
    """A name callers give as ``model``: what a served name and an alias must be."""
    if not value.strip() or len(value) > 200:
        raise ValueError(f"{where}must be 1-200 characters")
    if not value.isprintable():  # a newline would forge a log line
        raise ValueError(f"{where}must be printable: no line breaks or other control characters")


class DeploymentPatch(BaseModel):
    """``PATCH /deployments/{id}``: the settings to change (only those given). The result is
    checked whole, as a create would be; mode and idle timeout have their own endpoint."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    served_name: str | None = None
    aliases: list[str] | None = None
    engine: EngineName | None = None
    model: str | None = None
    memory_gib: float | None = None
    preload: bool | None = None
    role: Role | None = None
    command: list[str] | None = None
    image: str | None = None
    args: list[str] | None = None
    sleep_mode: bool | None = None
    sleep_level: Literal[1, 2, "kv"] | None = None
    gpus: int | None = Field(None, ge=0, le=MAX_DEVICES)
    gpu_ids: list[Annotated[int, Field(ge=0, lt=MAX_DEVICES)]] | None = Field(
        None, min_length=1, max_length=MAX_DEVICES
    )
    volumes: list[str] | None = None
    shm_size: str | None = None
    health_path: str | None = None
    metrics_path: str | None = None
    upstream_max_connections: int | None = Field(None, ge=1, le=MAX_UPSTREAM_CONNECTIONS)
    max_concurrent: int | None = Field(None, ge=1, le=MAX_CONCURRENT, strict=True)
    env: dict[str, str] | None = None
    request_defaults: dict[str, JsonValue] | None = None
    request_overrides: dict[str, JsonValue] | None = None
    strip_params: list[str] | None = None
    capabilities: list[Capability] | None = Field(None, max_length=6)


class ModeChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: Mode
    idle_timeout_s: float | None = None


class LogTail(BaseModel):
    lines: list[str]


Action = Literal["start", "stop", "sleep", "wake"]
