"""Reading and checking declared deployments: ``[[deployments]]`` tables in the config file and
in every ``*.toml`` file of ``[server] deployments_dir``, with ``[deployment_defaults]``.

Each table is checked with the admin API's own schema (``DeploymentCreate``), so a table is
exactly what ``POST /api/deployments`` would accept, and then all of them together (one name
once, each served name and alias once). The first problem is raised as one ``DeclarationError``
naming the file, the table, the field and the line when it is known: the whole change is
refused, so a half-valid set of files never half-applies. Reading is blocking file work, and
bounded (``MAX_FILES``, ``MAX_TOTAL_BYTES``, ``MAX_DEPLOYMENTS``, and each file by
``dgxmm.boundedtoml``'s bounds, checked before the TOML parser sees it): callers on the event loop
run ``read`` in a thread, and a whole reading of the largest files takes seconds, not more.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dgxmm import boundedtoml
from dgxmm.api.schemas import DeploymentCreate
from dgxmm.boundedtoml import TomlError
from dgxmm.settings import Settings

MAX_FILES = 256  # *.toml files in deployments_dir
MAX_TOTAL_BYTES = 4 * 1024 * 1024  # all of them and the config file together
MAX_DEPLOYMENTS = 1000  # declared deployments in all files together
FIELDS = frozenset(DeploymentCreate.model_fields)

_HEADER = re.compile(r"^\s*\[\[\s*deployments\s*\]\]")
_DEFAULTS = re.compile(r"^\s*\[\s*deployment_defaults\s*\]")
_ANY_HEADER = re.compile(r"^\s*\[")
_KEY = re.compile(r'^\s*(?:"([^"]+)"|([A-Za-z0-9_-]+))\s*=')


class DeclarationError(Exception):
    """A declared file that cannot be applied: where (file, line, table, field) and why."""

    def __init__(
        self,
        file: str,
        message: str,
        *,
        line: int | None = None,
        table: int | None = None,
        name: str | None = None,
        field: str | None = None,
        recheck: bool = False,
    ) -> None:
        self.file, self.message, self.line = file, message, line
        self.table, self.name, self.field = table, name, field
        self.recheck = recheck  # a file the table names (its model), looked at again until it is right
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file + (f":{self.line}" if self.line is not None else "")
        table = ""
        if self.table is not None:
            table = f" [[deployments]] #{self.table + 1}" + (f" ({self.name})" if self.name else "")
        field = f" {self.field}:" if self.field else ""
        return f"{where}:{table}{field} {self.message}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "table": None if self.table is None else self.table + 1,
            "name": self.name,
            "field": self.field,
            "message": self.message,
            "text": str(self),
            "recheck": self.recheck,
        }


@dataclass(frozen=True)
class Declaration:
    """One checked table: ``fields`` are ``DeploymentCreate``'s, ``served_name`` filled in."""

    name: str
    fields: dict[str, Any]
    file: str
    table: int  # its place in its file, from 0
    line: int | None  # its ``[[deployments]]`` header, when the file has one
    lines: dict[str, int] = dataclasses.field(default_factory=dict, compare=False)  # its own keys' lines

    def error(self, message: str, field: str | None = None, *, recheck: bool = False) -> DeclarationError:
        """An error of this table; ``field``'s own line when the table sets it, else the header's."""
        line = self.lines.get(field, self.line) if field is not None else self.line
        return DeclarationError(
            self.file, message, line=line, table=self.table, name=self.name, field=field, recheck=recheck
        )


@dataclass(frozen=True)
class Sources:
    """Where declarations come from. ``config_file`` is read again at each reload; without one
    (settings built in code) the tables the settings hold are the config file's."""

    config_file: Path | None
    deployments_dir: Path | None
    tables: tuple[dict[str, Any], ...] = ()
    defaults: tuple[tuple[str, Any], ...] = ()
    idle_timeout_min_s: float = 60.0
    idle_timeout_max_s: float = 86400.0
    runtime: str = "process"  # where engines run: a model path is a file here only for "process"

    @classmethod
    def of(cls, settings: Settings) -> Sources:
        return cls(
            settings.source,
            settings.server.deployments_dir,
            tuple(settings.deployments),
            tuple(settings.deployment_defaults.items()),
            settings.ondemand.idle_timeout_min_s,
            settings.ondemand.idle_timeout_max_s,
            settings.runtime.kind,
        )

    def files(self) -> list[Path]:
        """The files to read now, the config file first, then the directory's in name order."""
        found = [self.config_file] if self.config_file is not None else []
        if self.deployments_dir is not None:
            try:
                listed = sorted(p for p in self.deployments_dir.iterdir() if p.suffix == ".toml" and p.is_file())
            except OSError as exc:
                raise DeclarationError(
                    str(self.deployments_dir), f"cannot read the directory: {exc.strerror}"
                ) from None
            if len(listed) > MAX_FILES:
                raise DeclarationError(str(self.deployments_dir), f"more than {MAX_FILES} *.toml files")
            found += listed
        return found


def read(sources: Sources) -> tuple[Declaration, ...]:
    """Every declaration of ``sources``, checked one by one and together (blocking)."""
    declared: list[Declaration] = []
    defaults: dict[str, Any] = dict(sources.defaults)
    files = sources.files()
    if sources.config_file is None:
        declared += _tables("config", list(sources.tables), defaults, "", sources)
    total = 0
    for path in files:
        text = _read_text(path)
        total += len(text.encode())
        if total > MAX_TOTAL_BYTES:
            raise DeclarationError(str(path), f"the declared files are larger than {MAX_TOTAL_BYTES} bytes together")
        data = _loads(str(path), text)
        if path == sources.config_file:
            defaults = data.get("deployment_defaults", {})
            if not isinstance(defaults, dict):
                raise DeclarationError(str(path), "deployment_defaults must be a table", line=_first(_DEFAULTS, text))
            _check_defaults(str(path), defaults, text)
        else:
            for key in data:
                if key != "deployments":
                    raise DeclarationError(str(path), f"unknown key {key!r}: a deployments file holds [[deployments]]")
        tables = data.get("deployments", [])
        if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
            raise DeclarationError(str(path), "deployments must be [[deployments]] tables")
        if len(declared) + len(tables) > MAX_DEPLOYMENTS:  # before checking them one by one
            raise DeclarationError(str(path), f"more than {MAX_DEPLOYMENTS} declared deployments")
        declared += _tables(str(path), tables, defaults, text, sources)
    together(declared)
    return tuple(declared)


def _read_text(path: Path) -> str:
    try:
        return boundedtoml.read_text(path)
    except OSError as exc:
        raise DeclarationError(str(path), f"cannot read: {exc.strerror}") from None
    except TomlError as exc:
        raise DeclarationError(str(path), exc.message) from None


def _loads(file: str, text: str) -> dict[str, Any]:
    try:
        return boundedtoml.loads(text)
    except TomlError as exc:
        raise DeclarationError(file, exc.message, line=exc.line) from None


def _first(pattern: re.Pattern[str], text: str) -> int | None:
    return next((n for n, line in enumerate(text.splitlines(), 1) if pattern.match(line)), None)


def _check_defaults(file: str, defaults: dict[str, Any], text: str) -> None:
    for key in defaults:
        if key == "name" or key not in FIELDS:
            line = _field_line(text, _first(_DEFAULTS, text), key)
            why = "each deployment names itself" if key == "name" else "unknown field"
            raise DeclarationError(file, f"[deployment_defaults]: {why}", line=line, field=key)


def _header_lines(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), 1) if _HEADER.match(line)]


def _field_line(text: str, start: int | None, field: str | None) -> int | None:
    """The line of ``field = ...`` in the table whose header is line ``start``; else ``start``."""
    if start is None or field is None:
        return start
    key = re.compile(rf'^\s*("{re.escape(field)}"|{re.escape(field)})\s*=')
    lines = text.splitlines()
    for n in range(start, len(lines)):  # the lines after the header (line numbers from 1)
        if _ANY_HEADER.match(lines[n]):
            break
        if key.match(lines[n]):
            return n + 1
    return start


def _key_lines(lines: list[str], start: int | None) -> dict[str, int]:
    """The line of each ``key = ...`` of the table whose header is line ``start`` (one pass)."""
    found: dict[str, int] = {}
    if start is None:
        return found
    for n in range(start, len(lines)):  # the lines after the header (line numbers from 1)
        if _ANY_HEADER.match(lines[n]):
            break
        key = _KEY.match(lines[n])
        if key:
            found.setdefault(key[1] or key[2], n + 1)
    return found


def _tables(
    file: str, tables: list[dict[str, Any]], defaults: dict[str, Any], text: str, sources: Sources
) -> list[Declaration]:
    headers = _header_lines(text)
    lines = text.splitlines()
    declared = []
    for index, table in enumerate(tables):
        header = headers[index] if len(headers) == len(tables) else None
        decl = _table(file, index, table, header, defaults, text, sources)
        declared.append(replace(decl, lines=_key_lines(lines, header)))
    return declared


def _table(
    file: str,
    index: int,
    table: dict[str, Any],
    line: int | None,
    defaults: dict[str, Any],
    text: str,
    sources: Sources,
) -> Declaration:
    """One table, with the defaults under it, checked as ``POST /api/deployments`` checks a body."""
    name = table.get("name") if isinstance(table.get("name"), str) else None

    def refused(message: str, field: str | None) -> DeclarationError:
        at = _field_line(text, line, field)
        return DeclarationError(file, message, line=at, table=index, name=name, field=field)

    if "name" not in table:
        raise refused("every [[deployments]] table needs a name", "name")
    try:
        checked = DeploymentCreate.model_validate(defaults | table)
    except ValidationError as exc:
        field, message = _first_error(exc)
        raise refused(message, field) from None
    low, high = sources.idle_timeout_min_s, sources.idle_timeout_max_s
    idle = checked.idle_timeout_s
    if idle is not None and idle != 0 and not low <= idle <= high:  # 0: never stopped for idleness
        raise refused(f"must be 0 (never idle) or between {low:g} and {high:g} s", "idle_timeout_s")
    fields = checked.model_dump()
    fields["served_name"] = checked.served_name or checked.name
    return Declaration(checked.name, fields, file, index, line)


def _first_error(exc: ValidationError) -> tuple[str | None, str]:
    """The first error as (field, message); a whole-table check names its field in its text.
    An unknown field comes first: a misspelt key also makes the real one missing."""
    errors = exc.errors()
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(part) for part in err["loc"]]
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    if not loc:
        head, sep, rest = message.partition(": ")
        if sep and head in FIELDS:
            return head, rest
        return None, message
    return loc[0], message if len(loc) == 1 else f"{'.'.join(loc[1:])}: {message}"


def together(declared: list[Declaration]) -> None:
    """One name once, and each served name and alias once, across every file."""
    names: dict[str, Declaration] = {}
    served: dict[str, Declaration] = {}
    for decl in declared:
        first = names.get(decl.name)
        if first is not None:
            raise decl.error(f"declared twice: first in {first.file} [[deployments]] #{first.table + 1}", "name")
        names[decl.name] = decl
        for field, value in [("served_name", decl.fields["served_name"])] + [
            ("aliases", alias) for alias in decl.fields["aliases"]
        ]:
            other = served.get(value)
            if other is not None:
                raise decl.error(f"{value!r} is a name of {other.name} ({other.file}) already", field)
            served[value] = decl
