"""Settings: the spec's numbers as defaults, TOML plus DGXMM_* environment, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgxmm.settings import ConfigError, Settings, load_settings


def test_defaults_are_the_spec_values() -> None:
    o = Settings().ondemand
    assert (o.queue_timeout_s, o.reaper_interval_s, o.waiter_wake_s, o.stop_settle_s) == (900, 15, 15, 20)
    assert (o.backoff_initial_s, o.backoff_max_s) == (60, 900)
    assert (o.key_check_interval_s, o.previous_key_grace_s, o.rate_limit_failures) == (1, 300, 20)
    assert o.max_body_bytes == 16 * 1024 * 1024
    assert (o.peer_refresh_s, o.metrics_max_age_s) == (30, 60)
    assert (o.upstream_max_connections, o.upstream_connect_timeout_s, o.upstream_pool_timeout_s) == (256, 10, 60)
    assert Settings().litellm.sync_interval_s == 60
    assert Settings().deployer.stop_grace_s == 20
    assert Settings().deployer.max_concurrent_starts == 1
    assert Settings().server.port == 8090 and Settings().server.base_path == "/dgxmm"
    assert Settings().server.instance_id is None and Settings().litellm.warm_first is False


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def test_toml_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "[ondemand]\nqueue_timeout_s = 5\nmax_queued = 7\n[server]\nport = 9000\n")
    monkeypatch.setenv("DGXMM_ONDEMAND__MAX_QUEUED", "3")
    settings = load_settings(path)
    assert settings.ondemand.queue_timeout_s == 5.0  # from the file
    assert settings.ondemand.max_queued == 3  # the environment wins key by key
    assert settings.server.port == 9000


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("[ondemand]\nfoo = 1\n", "config error: ondemand.foo: unknown key"),
        ("[bogus]\na = 1\n", "config error: bogus: unknown key"),
        ("[server]\nport = 'x'\n", "config error: server.port: Input should be a valid integer"),
        ("[ondemand]\nidle_timeout_s = 59\n", "config error: ondemand.idle_timeout_s: must be between 60 and 86400 s"),
        (
            "[ondemand]\nidle_timeout_s = 86401\n",
            "config error: ondemand.idle_timeout_s: must be between 60 and 86400 s",
        ),
        ("[ondemand]\nallowed_cidrs = ['10.0.0.0/33']\n", "config error: ondemand.allowed_cidrs"),
        ("[runtime]\nkind = 'k8s'\n", "config error: runtime.kind"),
        ("[server]\ninstance_id = 'two words'\n", "config error: server.instance_id: String should match pattern"),
        ("[server]\ninstance_id = '-x'\n", "config error: server.instance_id"),
        ("[server\n", "config error:"),
        ("[server]\nlog_format = 'xml'\n", "config error: server.log_format: Input should be 'text' or 'json'"),
        ("[metrics]\npublic = true\n", "config error: metrics: allowed_cidrs is required when public is true"),
        ("[metrics]\nallowed_cidrs = ['10.0.0.0/33']\n", "config error: metrics.allowed_cidrs"),
        ("[metrics]\nallowed_cidrs = 'everyone'\n", "config error: metrics.allowed_cidrs"),
        ("[ondemand]\nquota_reservation_tokens = 0\n", "config error: ondemand.quota_reservation_tokens"),
        ("[ondemand]\nquota_reservation_tokens = 10_000_001\n", "config error: ondemand.quota_reservation_tokens"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, line: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, text))
    assert str(err.value).startswith(line)
    assert "\n" not in str(err.value)


def test_metrics_are_private_by_default_and_public_only_with_networks(tmp_path: Path) -> None:
    assert (Settings().metrics.public, Settings().metrics.allowed_cidrs, Settings().server.log_format) == (
        False,
        [],
        "text",
    )
    settings = load_settings(_write(tmp_path, "[metrics]\npublic = true\nallowed_cidrs = 'auto'\n"))
    assert settings.metrics.public and settings.metrics.allowed_cidrs == "auto"


def test_idle_timeout_bounds_follow_the_configured_minimum(tmp_path: Path) -> None:
    settings = load_settings(_write(tmp_path, "[ondemand]\nidle_timeout_min_s = 1\nidle_timeout_s = 2\n"))
    assert settings.ondemand.idle_timeout_s == 2
