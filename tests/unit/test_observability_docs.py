"""docs/observability.md and docs/configuration.md name every metric, rule and key there is,
and the dashboard file is what the docs and the provisioning say (issue 13)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from dgxmm.settings import MetricsSettings
from dgxmm.telemetry import catalog

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs/observability.md").read_text()


def test_every_metric_is_documented_with_its_labels() -> None:
    for family in catalog.ALL:
        row = next((line for line in DOC.splitlines() if line.startswith(f"| `{family.name}` |")), None)
        assert row is not None, family.name
        assert f"| {family.kind} |" in row, family.name
        for label in family.labels:
            assert f"`{label}`" in row, (family.name, label)


def test_every_refusal_reason_is_documented() -> None:
    for reason in {*catalog.REASONS.values(), catalog.OTHER_REASON}:
        assert f"| `{reason}` |" in DOC, reason


def test_every_rule_is_documented() -> None:
    rules = yaml.safe_load((ROOT / "examples/prometheus/dgxmm.rules.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            assert f"`{name}`" in DOC or f"`{name.rsplit(':', 1)[0]}:" in DOC, name


def test_every_metrics_key_is_in_the_configuration_page() -> None:
    page = (ROOT / "docs/configuration.md").read_text()
    assert "## `[metrics]`" in page and "| `log_format` |" in page
    for key in MetricsSettings.model_fields:
        assert f"| `{key}` |" in page, key


def test_dashboard_uses_only_dgxmm_metrics_and_its_own_variables() -> None:
    board = json.loads((ROOT / "examples/grafana/dgxmm.json").read_text())
    assert board["uid"] == "dgxmm" and board["title"] == "dgxmm"
    variables = {v["name"] for v in board["templating"]["list"]}
    assert variables == {"datasource", "served_name"}
    names = {f.name for f in catalog.ALL}
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            used = {re.sub(r"_bucket$", "", name) for name in re.findall(r"\bdgxmm_\w+", target["expr"])}
            assert used and used <= names, (panel["title"], used - names)
