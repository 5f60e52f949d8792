"""The names the prose gives stay true (issue 48): every ``dgxmm.x.y`` dotted name a docstring of
src/dgxmm or a page of docs/ gives, and every ``pkg/module.py`` path a page of docs/ names, exists,
so a rename or a removal that leaves a stale mention fails here, not in a reader's hands (the files
src/dgxmm itself names are test_docs.py's).

A dotted name is found as a module of src/ (the longest prefix that is one) and then as the names
defined in it, a class's own inside a class. A path is found from the repository's root, src/ or
src/dgxmm/. What is not a Python name of ours is left out by rule or by the short list below: a
name ending in a file's suffix is a file (``dgxmm.toml``); ``REV:path`` names a file as it was at
a commit (``git show``), which the tree no longer needs to hold."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

FILE_SUFFIXES = frozenset({"db", "toml", "yaml", "yml", "json", "lock"})
NOT_PYTHON = frozenset(
    {
        "dgxmm.managed",  # Docker labels dgxmm puts on its containers (deploy/runtimes/docker.py)
        "dgxmm.deployment",
        "dgxmm.instance",
        "dgxmm.compile",  # the compile cache volumes' label, dgxmm.compile-cache (deploy/runtimes/dockercache.py)
        "dgxmm.access",  # the access log's logger name (docs/observability.md)
        "dgxmm.ui",  # the console's localStorage key, dgxmm.ui-preferences (docs/ui.md)
    }
)
NOT_OURS = frozenset(
    {
        "starlette/middleware/errors.py",  # profiles of the libraries (docs/performance.md)
        "uvicorn/protocols/http/httptools_impl.py",
    }
)

DOTTED = re.compile(r"\bdgxmm(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./:-])((?:[\w.-]+/)+[\w.-]+\.py)\b")


def docstrings() -> Iterator[tuple[str, str]]:
    """Every docstring of src/dgxmm (module, class, function), with its file."""
    for path in sorted((SRC / "dgxmm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    yield str(path.relative_to(ROOT)), doc


def pages() -> Iterator[tuple[str, str]]:
    """Every page of docs/."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        yield str(page.relative_to(ROOT)), page.read_text()


def module_body(parts: list[str]) -> list[ast.stmt] | None:
    base = SRC.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return ast.parse(candidate.read_text()).body
    return None


def defined(body: list[ast.stmt], name: str) -> ast.stmt | None:
    """The statement of ``body`` that binds ``name`` (a def, a class, an assignment or an
    import), looking into ``if`` and ``try`` blocks."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return node
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(target, ast.Name) and target.id == name for target in targets):
                return node
        if isinstance(node, ast.Import | ast.ImportFrom):
            if any((alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return node
        if isinstance(node, ast.If | ast.Try):
            found = defined(node.body, name)
            if found is not None:
                return found
    return None


def exists(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        body = module_body(parts[:cut])
        if body is None:
            continue
        for name in parts[cut:]:
            node = defined(body, name)
            if node is None:
                return False
            body = node.body if isinstance(node, ast.ClassDef) else []
        return True
    return False


def test_every_dotted_name_the_prose_gives_exists() -> None:
    stale = [
        f"{where}: {name}"
        for where, text in [*docstrings(), *pages()]
        for name in sorted(set(DOTTED.findall(text)))
        if name.rsplit(".", 1)[-1] not in FILE_SUFFIXES and name not in NOT_PYTHON and not exists(name)
    ]
    assert stale == []


def test_every_path_the_docs_give_exists() -> None:
    stale = [
        f"{where}: {path}"
        for where, text in pages()
        for path in sorted(set(PATH.findall(text)))
        if path not in NOT_OURS and not any((base / path).exists() for base in (ROOT, SRC, SRC / "dgxmm"))
    ]
    assert stale == []


@pytest.mark.parametrize(
    ("name", "there"),
    [
        ("dgxmm.gateway.refused.Refused", True),
        ("dgxmm.store.db.Store.put", True),  # a method, in its class
        ("dgxmm.records.usage", False),  # renamed to records/tally.py
        ("dgxmm.controller.errors.Refused", False),  # moved to gateway/refused.py
        ("dgxmm.store.db.Store.missing", False),
    ],
)
def test_a_dotted_name_is_found_or_not(name: str, there: bool) -> None:
    assert exists(name) is there


def test_a_path_is_seen_and_a_commits_file_is_not() -> None:
    text = "see gateway/usage.py, `git show 1844b78:bench/ttfb_ab.py` and bench/gateway.py"
    assert PATH.findall(text) == ["gateway/usage.py", "bench/gateway.py"]
