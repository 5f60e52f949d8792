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


def test_observability_profile_scrapes_dgxmm_and_provisions_grafana() -> None:
    """Prometheus and Grafana come only with the profile; Prometheus scrapes dgxmm where the
    example config serves its metrics, with the rules it mounts beside its config; Grafana finds
    Prometheus and the dashboard where provisioning looks for them."""
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert services["prometheus"]["profiles"] == services["grafana"]["profiles"] == ["observability"]
    assert all("profiles" not in services[name] for name in ("dgxmm", "litellm", "postgres"))
    for service in services.values():  # every file the stack mounts is in the repository
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./") and not source.startswith("./secrets"):
                assert (ROOT / source).exists(), source

    settings = load_settings(ROOT / "examples/docker/dgxmm.toml")
    assert settings.metrics.public and settings.metrics.allowed_cidrs == "auto"
    prometheus = services["prometheus"]
    assert "dgxmm" in prometheus["networks"] and "dgxmm" not in services["grafana"]["networks"]
    config_mount = next(v for v in prometheus["volumes"] if v.startswith("./examples/prometheus/prometheus.yml:"))
    config_dir = Path(config_mount.split(":")[1]).parent
    config = yaml.safe_load((ROOT / "examples/prometheus/prometheus.yml").read_text())
    for rules in config["rule_files"]:
        assert (ROOT / "examples/prometheus" / rules).exists()
        assert f"./examples/prometheus/{rules}:{config_dir / rules}:ro" in prometheus["volumes"]
    job = config["scrape_configs"][0]
    assert job["metrics_path"] == f"{settings.server.base_path}/metrics"
    assert job["static_configs"][0]["targets"] == [f"dgxmm:{settings.server.port}"]
    assert "dgxmm" in compose["services"]["dgxmm"]["networks"]["dgxmm"]["aliases"]

    grafana = services["grafana"]
    datasource = yaml.safe_load((ROOT / "examples/grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    assert set(grafana["networks"]) & set(prometheus["networks"])
    provider = yaml.safe_load((ROOT / "examples/grafana/provisioning/dashboards/dgxmm.yaml").read_text())
    dashboards = provider["providers"][0]["options"]["path"]
    assert f"./examples/grafana/dgxmm.json:{dashboards}/dgxmm.json:ro" in grafana["volumes"]
    assert "./examples/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
