"""The fleet example (examples/fleet: compose file, dgxmm and LiteLLM configs) agrees with itself,
with docs/fleet.md (the per-host .env examples are read from it) and with dgxmm's config keys,
for the host that runs LiteLLM and for one that LiteLLM reaches over the LAN."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from dgxmm.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "examples" / "fleet"
DOC = (ROOT / "docs" / "fleet.md").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load((FLEET / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")


def expand(value: str, env: dict[str, str]) -> str:
    """Compose's interpolation: ${NAME}, ${NAME:-default}, ${NAME:?error}."""

    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        if env.get(name):
            return env[name]
        if kind == "?":
            raise AssertionError(f"{name} is required: {rest}")
        return rest if kind == "-" else ""

    return VARIABLE.sub(one, value)


def host_envs() -> dict[str, dict[str, str]]:
    """The .env files docs/fleet.md shows, by DGXMM_INSTANCE_ID."""
    envs = {}
    for block in re.findall(r"```sh\n(DGXMM_INSTANCE_ID=.*?)```", DOC, re.DOTALL):
        env = dict(line.split("=", 1) for line in block.strip().splitlines())
        envs[env["DGXMM_INSTANCE_ID"]] = env
    return envs


def settings_for(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name, value in SERVICES["dgxmm"]["environment"].items():
        monkeypatch.setenv(name, expand(value, env))
    return load_settings(FLEET / "dgxmm.toml")


def mounts(service: str) -> dict[str, str]:
    return dict(tuple(v.split(":")[:2]) for v in SERVICES[service]["volumes"])


def published(service: str, env: dict[str, str]) -> tuple[str | None, int, int]:
    """(host address, host port, container port) of the service's one published port."""
    [spec] = SERVICES[service]["ports"]
    parts = expand(spec, env).split(":")
    address = parts[0] if len(parts) == 3 else None
    return address, int(parts[-2]), int(parts[-1])


def litellm_port() -> int:
    command = SERVICES["litellm"]["command"]
    return int(command[command.index("--port") + 1])


def test_the_doc_shows_two_hosts_one_of_them_running_litellm() -> None:
    envs = host_envs()
    assert len(envs) == 2
    assert [name for name, env in envs.items() if "LITELLM_URL" not in env] == ["spark-01"]
    assert "docker compose --profile litellm up -d" in DOC and "examples/fleet/" in DOC
    assert "](docs/fleet.md)" in (ROOT / "README.md").read_text()


def test_every_variable_of_the_compose_file_is_documented() -> None:
    text = (FLEET / "compose.yaml").read_text()
    names = {m.group(1) for m in VARIABLE.finditer(text)}
    assert names == {
        "DGXMM_INSTANCE_ID",
        "LITELLM_URL",
        "DGXMM_INTERNAL_URL",
        "DGXMM_ALLOWED_CIDRS",
        "DGXMM_PUBLISH",
        "LITELLM_MASTER_KEY",
    }
    header = text.split("\nname:")[0]
    documented = set().union(*(env.keys() for env in host_envs().values()))
    for name in names:
        assert name in header and name in documented, name


def test_every_dgxmm_variable_names_a_config_key() -> None:
    for name in SERVICES["dgxmm"]["environment"]:
        section, key = name.removeprefix("DGXMM_").lower().split("__")
        model = Settings.model_fields[section].annotation
        assert key in model.model_fields, name  # type: ignore[union-attr]


@pytest.mark.parametrize("host", ["spark-01", "spark-02"])
def test_each_host_gets_a_valid_config_that_fits_the_compose_file(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = host_envs()[host]
    settings = settings_for(env, monkeypatch)
    assert settings.server.instance_id == host and settings.litellm.warm_first
    assert settings.litellm.enabled and settings.runtime.kind == "docker"
    address, host_port, container_port = published("dgxmm", env)
    assert container_port == settings.server.port and settings.server.host == "0.0.0.0"
    internal = urlsplit(settings.litellm.internal_url)
    url = urlsplit(settings.litellm.url or "")
    assert internal.path == settings.server.base_path
    if host == "spark-01":  # LiteLLM is here: both talk over the shared Docker network
        assert (url.hostname, url.port) == ("litellm", litellm_port())
        assert internal.hostname in SERVICES["dgxmm"]["networks"]["dgxmm"]["aliases"]
        assert internal.port == settings.server.port
        assert settings.ondemand.allowed_cidrs == "auto" and address == "127.0.0.1"
    else:  # LiteLLM calls over the LAN: the published port, from LiteLLM's host address only
        assert url.port == published("litellm", env)[1] and internal.port == host_port
        assert address == "0.0.0.0" and isinstance(settings.ondemand.allowed_cidrs, list)
        litellm_host = ipaddress.ip_address(url.hostname or "")
        assert any(litellm_host in ipaddress.ip_network(c) for c in settings.ondemand.allowed_cidrs)
        assert internal.hostname != url.hostname


def test_mounts_networks_and_paths_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(host_envs()["spark-01"], monkeypatch)
    dgxmm = mounts("dgxmm")
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dgxmm["./dgxmm.toml"] in dockerfile and dgxmm["./dgxmm.toml"].startswith(dgxmm["./secrets"] + "/")
    for path in (settings.ondemand.key_file, settings.litellm.master_key_file, settings.server.admin_token_file):
        assert str(Path(str(path)).parent) == dgxmm["./secrets"]
    assert dgxmm["dgxmm-data"] == str(settings.server.data_dir)
    assert dgxmm["/var/run/docker.sock"] == (settings.runtime.docker_host or "").removeprefix("unix://")
    assert (FLEET / SERVICES["dgxmm"]["build"] / "Dockerfile").exists()
    network = COMPOSE["networks"]["dgxmm"]["name"]
    assert settings.runtime.network == network
    for name in ("dgxmm", "litellm", "postgres"):
        assert "dgxmm" in SERVICES[name]["networks"], name


def test_litellm_runs_on_one_host_only_with_its_database() -> None:
    assert "profiles" not in SERVICES["dgxmm"]
    assert SERVICES["litellm"]["profiles"] == SERVICES["postgres"]["profiles"] == ["litellm"]
    lite, pg = SERVICES["litellm"]["environment"], SERVICES["postgres"]["environment"]
    db = urlsplit(lite["DATABASE_URL"])
    assert (db.hostname, db.username, db.password, db.path) == (
        "postgres",
        pg["POSTGRES_USER"],
        pg["POSTGRES_PASSWORD"],
        "/" + pg["POSTGRES_DB"],
    )
    assert lite["STORE_MODEL_IN_DB"] == "True"
    command = SERVICES["litellm"]["command"]
    assert mounts("litellm")["./litellm.yaml"] == command[command.index("--config") + 1]


def test_litellm_config_follows_the_router_advice() -> None:
    config = yaml.safe_load((FLEET / "litellm.yaml").read_text())
    general, router = config["general_settings"], config["router_settings"]
    assert general["master_key"] == "os.environ/LITELLM_MASTER_KEY"
    assert "LITELLM_MASTER_KEY" in SERVICES["litellm"]["environment"]
    assert general["background_health_checks"] is True and general["enable_health_check_routing"] is True
    assert f"`health_check_interval`, {general['health_check_interval']} s there" in " ".join(DOC.split())
    for key in (
        "allowed_fails",
        "allowed_fails_policy",
        "retry_policy",
        "disable_cooldowns",
        "enable_weighted_failover",
        "num_retries",
    ):
        assert key not in router and key not in general, key
    assert router["routing_strategy"] == "simple-shuffle" and "model_list" not in config
