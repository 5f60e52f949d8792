"""What an import found, and the declared file it writes.

Each source module (``llamaswap``, ``ollama``) turns what it reads into ``Imported`` entries: a
``[[deployments]]`` table or the reason there is none, and per setting what it became or why it
was not carried. ``write`` renders the tables as ``dgxmm export`` does (one file per source, so
an import owns its file and running it again replaces only that), checks the text as
``dgxmm check-config`` reads a deployments file, and writes it only when it differs: importing
twice changes nothing.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgxmm import boundedtoml
from dgxmm.declared.export import table
from dgxmm.declared.parse import DeclarationError, Sources, read

Say = Callable[[str], None]
GUESS_GIB = 8.0  # the memory_gib written when nothing says what a model holds: to be measured
_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]+")
ESTIMATED = "# memory_gib estimated by dgxmm import (as `dgxmm estimate`): measure it and adjust"
GUESSED = f"# memory_gib = {GUESS_GIB:g} is a placeholder of dgxmm import: set what the model holds"


@dataclass
class Imported:
    """One model of the source: its table (None: skipped, ``skipped`` says why) and the notes."""

    source_name: str
    fields: dict[str, Any] | None = None
    carried: list[str] = field(default_factory=list)
    not_carried: list[str] = field(default_factory=list)
    memory: str = "given"  # "estimated" or "guessed" when the source did not say it
    skipped: str = ""

    def carry(self, note: str) -> None:
        self.carried.append(note)

    def drop(self, note: str) -> None:
        self.not_carried.append(note)


@dataclass
class Report:
    """Everything one import found: the models, and notes on the source's top-level settings."""

    source: str
    models: list[Imported] = field(default_factory=list)
    top: list[str] = field(default_factory=list)

    def print(self, say: Say) -> None:
        for entry in self.models:
            if entry.fields is None:
                say(f"{entry.source_name}: not imported: {entry.skipped}")
                continue
            say(f"{entry.source_name}: deployment {entry.fields['name']} ({entry.fields['engine']})")
            for note in entry.carried:
                say(f"  carried: {note}")
            for note in entry.not_carried:
                say(f"  not carried: {note}")
        for note in self.top:
            say(f"top level: {note}")


def deployment_name(wanted: str, taken: set[str]) -> str:
    """A deployment name (1-64 letters, digits, '.', '_', '-', from a letter or digit) made of
    ``wanted``, not yet in ``taken`` (which it joins)."""
    base = _NAME_BAD.sub("-", wanted).lstrip("._-")[:60] or "model"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def render(report: Report) -> str:
    """The declared file's text: a header, then each imported model's table."""
    parts = [f"# Written by `dgxmm import {report.source}`; running it again replaces this file.\n"]
    for entry in report.models:
        if entry.fields is None:
            continue
        head = {"estimated": ESTIMATED + "\n", "guessed": GUESSED + "\n"}.get(entry.memory, "")
        parts.append(f"\n{head}{table(entry.fields)}")
    return "".join(parts)


def check(text: str, file_name: str) -> None:
    """``DeclarationError`` unless ``text`` is a deployments file check-config accepts (blocking)."""
    with tempfile.TemporaryDirectory(prefix="dgxmm-import-") as folder:
        (Path(folder) / file_name).write_text(text)
        read(Sources(config_file=None, deployments_dir=Path(folder)))


def keep_valid(report: Report, file_name: str) -> None:
    """Skip, with the reason, each model whose table check-config would refuse (a field out of
    bounds, a name an earlier model holds already, a file past ``boundedtoml``'s size), so that
    the others are written. The whole file is checked first, each table only when it fails."""
    try:
        check(render(report), file_name)
        return
    except DeclarationError:
        pass
    names: dict[str, str] = {}
    size = len(render(Report(report.source)).encode())
    for entry in report.models:
        if entry.fields is None:
            continue
        one = render(Report(report.source, [entry]))
        try:
            check(one, file_name)
        except DeclarationError as exc:
            entry.fields, entry.skipped = None, f"check-config would refuse {exc.field or 'it'}: {exc.message}"
            continue
        mine = [entry.fields.get("served_name") or entry.fields["name"], *entry.fields.get("aliases", [])]
        other = next((names[name] for name in mine if name in names), None)
        size += len(one.encode()) - len(render(Report(report.source)).encode())
        if other is not None:
            entry.fields, entry.skipped = None, f"a name of it is {other}'s already (names are unique on a host)"
        elif size > boundedtoml.MAX_BYTES:
            entry.fields, entry.skipped = None, f"the file would pass {boundedtoml.MAX_BYTES} bytes with it"
        else:
            names.update(dict.fromkeys(mine, entry.source_name))


def write(report: Report, out: Path, file_name: str, dry_run: bool, say: Say) -> int:
    """Check and write ``out/file_name`` (unless ``dry_run``); 0 when written or unchanged."""
    text = render(report)
    target = out / file_name
    try:
        check(text, file_name)
    except DeclarationError as exc:
        say(f"error: the imported file would not pass check-config: {exc}")
        return 1
    count = sum(1 for entry in report.models if entry.fields is not None)
    if dry_run:
        say(f"dry run: {target} would hold {count} deployments; nothing written")
        return 0
    try:
        if target.is_file() and target.read_text() == text:
            say(f"{target}: unchanged ({count} deployments)")
            return 0
        out.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=out, prefix=f".{file_name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(temp, target)  # (a .tmp name: the watcher reads *.toml files only)
    except OSError as exc:
        say(f"error: cannot write {target}: {exc.strerror or exc}")
        return 1
    say(f"{target}: wrote {count} deployments")
    return 0
