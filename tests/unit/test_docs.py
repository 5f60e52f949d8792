"""The docs say what the code does: every config key in docs/configuration.md with its real
default, every link between the docs landing on a heading that exists, and the semantics a
review once found wrong (the start timeout counts from the engine's launch, not from the wait at
the start-up gate)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dgxmm.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIGURATION = (DOCS / "configuration.md").read_text()
SECTIONS = [name for name in Settings.model_fields]


def documented(section: str) -> dict[str, str]:
    """The rows of a section's table: key -> its default cell."""
    part = CONFIGURATION.split(f"## `[{section}]`", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| [^|]* \| ([^|]*) \|", part, flags=re.M)
    return {key: cell.strip() for key, cell in rows}


def default_of(section: str, key: str) -> Any:
    model: type[BaseModel] = Settings.model_fields[section].annotation  # type: ignore[assignment]
    field = model.model_fields[key]
    return field.get_default(call_default_factory=True)


@pytest.mark.parametrize("section", SECTIONS)
def test_every_key_of_a_section_is_documented_and_nothing_else(section: str) -> None:
    model: type[BaseModel] = Settings.model_fields[section].annotation  # type: ignore[assignment]
    assert set(documented(section)) == set(model.model_fields)


@pytest.mark.parametrize(("section", "key"), [(s, k) for s in SECTIONS for k in documented(s)])
def test_documented_defaults_are_the_real_ones(section: str, key: str) -> None:
    cell = documented(section)[key]
    value = default_of(section, key)
    if cell.startswith("unset"):
        assert value is None, (section, key, value)
        return
    if cell.startswith("see below"):
        return  # explained in prose (the declared capacity)
    written = re.match(r"`([^`]*)`", cell)
    assert written is not None, (section, key, cell)
    loaded = json.loads(written.group(1))
    assert (Path(loaded) if isinstance(value, Path) else loaded) == value, (section, key, cell, value)


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a markdown text's headings."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_every_link_between_the_docs_lands_on_a_heading() -> None:
    broken = []
    for doc in [*DOCS.glob("*.md"), ROOT / "README.md"]:
        for target, anchor in re.findall(r"\]\(((?:docs/)?[\w\-]+\.md)?#([\w\-]+)\)", doc.read_text()):
            path = (doc.parent / target) if target else doc
            if not path.exists() or anchor not in anchors(path.read_text()):
                broken.append(f"{doc.name}: {target}#{anchor}")
    assert broken == []


def test_the_start_timeout_counts_from_the_launch_in_every_doc_and_in_the_code() -> None:
    row = re.search(r"^\| `start_timeout_s` \|.*$", CONFIGURATION, flags=re.M)
    assert row is not None and "launched" in row.group(0) and "does not count" in row.group(0)
    deployer = (DOCS / "deployer.md").read_text()
    assert "since the engine was launched (time waiting at\n     the gate does not count" in deployer
    starts = (ROOT / "src" / "dgxmm" / "deploy" / "starts.py").read_text()
    assert "started = time.monotonic()  # the start timeout counts from the launch, not the gate" in starts
    assert starts.index("async with self._gate:") < starts.index("started = time.monotonic()  # the start")
