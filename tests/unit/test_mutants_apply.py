"""Every mutant of ``make mutants`` still applies to the code: its text is found exactly once.

A formatter run or a refactor that moves a mutated line would otherwise be found only by the
next ``make mutants`` (minutes long, not in CI), and a mutant that no longer applies tests nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mutants() -> list:
    spec = importlib.util.spec_from_file_location("dgxmm_mutants", ROOT / "scripts" / "mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up by name)
    spec.loader.exec_module(module)
    return list(module.MUTANTS)


@pytest.mark.parametrize("mutant", _mutants(), ids=lambda m: m.name)
def test_the_mutant_applies_once(mutant) -> None:
    for file, old, new in mutant.edits:
        assert old != new
        assert (ROOT / file).read_text().count(old) == 1, f"{mutant.name}: its text in {file} is not found exactly once"
