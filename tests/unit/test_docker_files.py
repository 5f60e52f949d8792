"""The files a user runs dgxmm in Docker with agree with each other and with the config keys.
(Building the image needs a registry, which these machines do not reach.)"""

from __future__ import annotations

from pathlib import Path

import yaml

from dgxmm.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_is_valid_and_matches_the_compose_networks() -> None:
    settings = load_settings(ROOT / "examples/docker/dgxmm.toml")
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    names = {net["name"] for net in compose["networks"].values()}
    assert settings.runtime.kind == "docker" and settings.runtime.network in names
    assert settings.ondemand.decider_network in names
    assert settings.runtime.network != settings.ondemand.decider_network
    dgxmm = compose["services"]["dgxmm"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in dgxmm["volumes"]
    assert set(dgxmm["networks"]) == {"dgxmm", "dgxmm-decider"}
    assert compose["services"]["litellm"]["networks"] == ["dgxmm"]
    assert settings.litellm.internal_url.startswith("http://dgxmm:8090")
    assert settings.litellm.url == "http://litellm:4000"


def test_the_default_example_is_valid() -> None:
    assert load_settings(ROOT / "examples/dgxmm.toml").server.port == 8090


def test_dockerfile_runs_serve_with_the_mounted_config() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["dgxmm"]' in text and "/etc/dgxmm/dgxmm.toml" in text
