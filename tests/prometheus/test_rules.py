"""The example rules and Prometheus config pass promtool: syntax, and the rules' unit tests."""

from __future__ import annotations

import subprocess

from prometheus.promserver import EXAMPLES, binary


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=EXAMPLES, check=False
    )


def test_rules_pass_promtool_check_rules() -> None:
    out = promtool("check", "rules", "dgxmm.rules.yml")
    assert out.returncode == 0 and "SUCCESS: 15 rules found" in out.stdout, out.stdout + out.stderr


def test_rules_pass_their_unit_tests() -> None:
    out = promtool("test", "rules", "dgxmm.rules.test.yml")
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_example_config_passes_promtool_check_config() -> None:
    out = promtool("check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_catches_a_broken_rule(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The checks above can fail: a rule with bad PromQL does not pass."""
    broken = tmp_path / "broken.yml"
    broken.write_text((EXAMPLES / "dgxmm.rules.yml").read_text().replace("> 60", "> > 60"))
    out = promtool("check", "rules", str(broken))
    assert out.returncode != 0
