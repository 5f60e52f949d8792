"""The docs say what the code does: every config key in docs/configuration.md with its real
default, every link between the docs landing on a heading that exists, the semantics a review
once found wrong (the start timeout counts from the engine's launch, not from the wait at the
start-up gate), and the claims issue 36's small drifts were about: every file src cites exists
(a DESIGN.md that was never in the repo), the environment wins over the file as the docs and the
``Settings`` docstring say, ``Report.stopped`` names every reason the controller passes, and
docs/api.md's table lists every route of the admin API (the playground was missing), and
docs/controller.md's state table names attributes that exist (it named ``Controller._last_stop``)."""

from __future__ import annotations

import ast
import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from conftest import make_settings
from pydantic import BaseModel

from dgxmm.api.schemas import Action
from dgxmm.app import create_app
from dgxmm.controller.effects import Report
from dgxmm.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "src" / "dgxmm"
CONFIGURATION = (DOCS / "configuration.md").read_text()
# The sections (tables of keys); ``deployments`` and ``deployment_defaults`` are declared
# deployments, documented in their own part ("Deployments in files").
SECTIONS = [name for name, f in Settings.model_fields.items() if name not in ("deployments", "deployment_defaults")]


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


# A file named in src: ``docs/x.md``, ``gateway/request.py``, ``fleet.md#anchor``...
CITED = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:md|py))(?:#([\w-]+))?(?![\w/])")


def cited_in_src() -> list[tuple[Path, str, str]]:
    """Every file a module, script or page of src/dgxmm names: (where, the name, its anchor)."""
    found = []
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix in (".py", ".js", ".html", ".css"):
            found.extend((path, name, anchor) for name, anchor in CITED.findall(path.read_text()))
    return found


def resolve(where: Path, name: str) -> Path | None:
    """The file ``name`` means, seen from ``where``: beside it or in a package above it, or from the
    repo's root, src/ or docs/ (a doc named bare, ``fleet.md``)."""
    bases = [
        where.parent,
        *[p for p in where.parents if p == PACKAGE or PACKAGE in p.parents],
        ROOT,
        ROOT / "src",
        DOCS,
    ]
    return next((base / name for base in bases if (base / name).is_file()), None)


def test_every_file_src_cites_exists() -> None:
    cited = cited_in_src()
    assert len(cited) > 50  # the pattern finds them (docs/..., request.py, ...)
    missing = sorted(f"{where.relative_to(ROOT)}: {name}" for where, name, _ in cited if resolve(where, name) is None)
    assert missing == []


def test_every_doc_anchor_src_cites_lands_on_a_heading() -> None:
    broken = []
    for where, name, anchor in cited_in_src():
        target = resolve(where, name)
        if anchor and target is not None and target.suffix == ".md" and anchor not in anchors(target.read_text()):
            broken.append(f"{where.relative_to(ROOT)}: {name}#{anchor}")
    assert broken == []


def test_the_environment_wins_over_the_file_key_by_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/configuration.md: a ``DGXMM_<SECTION>__<KEY>`` variable "overrides one key of the file
    and leaves the other keys of that section alone"; the ``Settings`` docstring says the same."""
    config = tmp_path / "dgxmm.toml"
    config.write_text('[server]\nport = 1234\nhost = "127.0.0.2"\n')
    monkeypatch.setenv("DGXMM_SERVER__PORT", "4321")
    settings = load_settings(config)
    assert (settings.server.port, settings.server.host) == (4321, "127.0.0.2")
    assert "overrides one key of the\n   file and leaves the other keys of that section alone" in CONFIGURATION
    doc = " ".join((Settings.__doc__ or "").split())
    assert "a ``DGXMM_*`` variable wins over an init argument" in doc and "TOML file" in doc


def test_report_stopped_names_every_reason_the_controller_passes() -> None:
    """``Stops.stop(deployment_id, text, reason, ...)``: each reason a call in controller/ passes is
    in ``Report.stopped``'s docstring (it once left out ``drain``)."""
    reasons = set()
    for path in (PACKAGE / "controller").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "stop"
                and len(node.args) >= 3
                and isinstance(node.args[2], ast.Constant)
            ):
                reasons.add(node.args[2].value)
    assert reasons == {"make_room", "drain", "idle", "unload"}
    doc = Report.stopped.__doc__ or ""
    assert all(f"``{reason}``" in doc for reason in reasons), (reasons, doc)


def route_of(method: str, path: str) -> str:
    """``METHOD /api/path``, every path parameter written ``{id}``."""
    return f"{method} {re.sub(r'[{][a-z_]+[}]', '{id}', path)}"


def endpoints_table() -> set[str]:
    """``METHOD /api/path`` of every route docs/api.md's Endpoints table names (ids as ``{id}``)."""
    api = (DOCS / "api.md").read_text()
    table = api.split("\n## Endpoints\n", 1)[1].split("\n#", 1)[0]
    rows = "\n".join(line for line in table.splitlines() if line.startswith("| `"))
    found = re.findall(r"`(GET|POST|PUT|PATCH|DELETE) (/api/[^\s`?]*)", rows)
    return {route_of(method, path) for method, path in found}


def test_the_api_table_lists_every_route_of_the_admin_api(tmp_path: Path) -> None:
    """Every route of the admin API (the schema of the app ``create_app`` builds) has a row or a
    mention in docs/api.md's Endpoints table, and the table names no route that is not there."""
    settings = make_settings(tmp_path)
    routes = set()
    for path, item in create_app(settings).api.openapi()["paths"].items():
        path = path.removeprefix(settings.server.base_path)
        if not path.startswith("/api/"):
            continue
        paths = [path]
        if path.endswith("/{action}"):  # POST /api/deployments/{id}/{action}: one row per action
            paths = [path.replace("{action}", value) for value in typing.get_args(Action)]
        routes.update(route_of(method.upper(), each) for method in item for each in paths)
    assert "POST /api/deployments/{id}/playground" in routes
    assert routes == endpoints_table()


def attributes_of_classes() -> dict[str, set[str]]:
    """Every class of src/dgxmm: the names its body defines and those its methods assign to
    ``self`` (a dataclass's fields, a property, ``self._tracks = ...``)."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            names = found.setdefault(node.name, set())
            for item in ast.walk(node):
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item in node.body:
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) and item.value.id == "self":
                    names.add(item.attr)
    return found


def test_the_controllers_state_table_names_attributes_that_exist() -> None:
    """docs/controller.md's "State and its single owner": every ``Class.attribute`` (and every
    class) its "where" column names is in the code (it once named ``Controller._last_stop``
    after the grace clock had moved to ``Stops.last_stop``)."""
    page = (DOCS / "controller.md").read_text()
    table = page.split("\n## State and its single owner\n", 1)[1].split("\n#", 1)[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    named = [name for row in rows[1:] for name in re.findall(r"`([A-Z]\w*(?:\.\w+)?)`", row[1])]
    assert len(named) > 5  # the pattern finds them
    classes = attributes_of_classes()
    missing = []
    for name in named:
        cls, _, attribute = name.partition(".")
        if cls not in classes or (attribute and attribute not in classes[cls]):
            missing.append(name)
    assert missing == []
