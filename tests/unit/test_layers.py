"""Which module may import which: the layers stay layers, and the controller's parts import in
one direction (read from the source, so no import-time side effect can hide an edge)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def imports_of(path: Path) -> set[str]:
    """Every dgxmm module ``path`` imports, at module level or inside functions and TYPE_CHECKING."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith("dgxmm")}


def module(name: str) -> Path:
    return SRC / (name.replace(".", "/") + ".py")


def test_nothing_under_deploy_imports_ondemand() -> None:
    offenders = {
        str(path.relative_to(SRC)): sorted(n for n in imports_of(path) if n.startswith("dgxmm.ondemand"))
        for path in (SRC / "dgxmm" / "deploy").rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}


@pytest.mark.parametrize(
    ("name", "forbidden"),
    [
        ("dgxmm.ondemand.decide", "dgxmm.ondemand.controller"),
        ("dgxmm.ondemand.decide", "dgxmm.ondemand.queue"),
        ("dgxmm.ondemand.decide", "dgxmm.ondemand.effects"),
        ("dgxmm.ondemand.queue", "dgxmm.ondemand.controller"),
        ("dgxmm.ondemand.queue", "dgxmm.ondemand.decide"),
        ("dgxmm.ondemand.effects", "dgxmm.ondemand.controller"),
        ("dgxmm.ondemand.texts", "dgxmm.ondemand.controller"),
        ("dgxmm.ondemand.slots", "dgxmm.ondemand.controller"),
        ("dgxmm.ondemand.forward", "dgxmm.ondemand.gateway"),
        ("dgxmm.deploy.watchdog", "dgxmm.deploy.deployer"),
    ],
)
def test_one_direction(name: str, forbidden: str) -> None:
    assert not any(n == forbidden or n.startswith(forbidden + ".") for n in imports_of(module(name)))
