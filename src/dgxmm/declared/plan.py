"""What applying the declarations would do: a pure function of the declarations and the
deployments as they are (no I/O), so ``check-config``, ``GET /api/config/plan`` and the applier
give one answer, and it is tested with tables like ``controller.decide``.

Only declared deployments (``managed_by == "config"``) are created, changed or removed; one made
through the API is never touched, and a declaration that takes its name, served name or alias is
an error of the declaring file. A change of a field the engine sees restarts a running
deployment (``restart``); the names callers use, preload, the mode and the idle timeout change
while it runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dgxmm.declared.parse import FIELDS, Declaration
from dgxmm.records.deployment import RUNNING, Deployment

# What changes without a restart: what the engine does not see (as the deployer's
# CHANGES_WHILE_RUNNING), the mode and idle timeout (the controller's), and the declaring file.
LIVE_FIELDS = frozenset(
    {
        "aliases",
        "preload",
        "max_concurrent",
        "mode",
        "idle_timeout_s",
        "declared_in",
        "request_defaults",
        "request_overrides",
        "strip_params",
        "capabilities",
    }
)


@dataclass(frozen=True)
class Change:
    name: str
    id: str
    fields: dict[str, tuple[Any, Any]]  # each changed field: (now, declared)
    restart: bool  # running, and a field its engine sees changed

    def new(self) -> dict[str, Any]:
        return {key: new for key, (_, new) in self.fields.items()}


@dataclass(frozen=True)
class Removal:
    name: str
    id: str
    file: str | None


@dataclass(frozen=True)
class Creation:
    declaration: Declaration
    id: str  # derived from the name (``declared_id``), so a rebuilt database gives it again


@dataclass(frozen=True)
class Plan:
    created: tuple[Creation, ...] = ()
    changed: tuple[Change, ...] = ()
    removed: tuple[Removal, ...] = ()
    unchanged: int = 0

    @property
    def restarted(self) -> tuple[str, ...]:
        return tuple(change.name for change in self.changed if change.restart)

    @property
    def empty(self) -> bool:
        return not (self.created or self.changed or self.removed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "created": [{"name": c.declaration.name, "id": c.id, "file": c.declaration.file} for c in self.created],
            "changed": [
                {"name": c.name, "id": c.id, "fields": sorted(c.fields), "restart": c.restart} for c in self.changed
            ],
            "restarted": list(self.restarted),
            "removed": [{"name": r.name, "id": r.id, "file": r.file} for r in self.removed],
            "unchanged": self.unchanged,
        }

    def lines(self) -> list[str]:
        """The plan as ``dgxmm check-config`` prints it."""
        return lines_of(self.as_dict())


def lines_of(answer: dict[str, Any]) -> list[str]:
    """A plan (``Plan.as_dict``, or a running dgxmm's ``GET /api/config/plan``) as lines."""
    if not (answer["created"] or answer["changed"] or answer["removed"]):
        return [f"no change ({answer['unchanged']} declared deployments as declared)"]
    out = [f"create  {c['name']} ({c['file']})" for c in answer["created"]]
    for c in answer["changed"]:
        out.append(f"change  {c['name']}: {', '.join(c['fields'])}" + (" (restarted)" if c["restart"] else ""))
    out += [f"remove  {r['name']}" for r in answer["removed"]]
    return [*out, f"unchanged: {answer['unchanged']}"]


def declared_id(name: str) -> str:
    """A declared deployment's id: the same for a name on every host and every database, so
    LiteLLM's entries and the activity log keep following it (the deployer's ids are 12 hex digits)."""
    return hashlib.sha256(f"dgxmm declared deployment {name}".encode()).hexdigest()[:12]


def current_fields(dep: Deployment) -> dict[str, Any]:
    """A stored deployment's settings, as a declaration holds them."""
    return dep.model_dump(include=set(FIELDS)) | {"mode": dep.effective_mode, "declared_in": dep.declared_in}


def differences(decl: Declaration, dep: Deployment) -> dict[str, tuple[Any, Any]]:
    now = current_fields(dep)
    wanted = decl.fields | {"declared_in": decl.file}
    changed = {}
    for key, value in wanted.items():
        if key == "gpus" and value is None:  # the deployer sets it from the engine's parallel flags
            continue
        if now.get(key) != value:
            changed[key] = (now.get(key), value)
    return changed


def plan(declared: Sequence[Declaration], current: Sequence[Deployment]) -> Plan:
    """What applying ``declared`` to ``current`` does. Raises the declaring file's
    ``DeclarationError`` when a declaration takes what a deployment made through the API has
    (``recheck``: removing that deployment, not only an edit of the file, settles it)."""
    by_name = {dep.name: dep for dep in current}
    made = [dep for dep in current if dep.managed_by != "config"]
    taken = {name: dep for dep in made for name in dep.names}
    ids = {dep.id for dep in current}
    created, changed = [], []
    unchanged = 0
    for decl in declared:
        dep = by_name.get(decl.name)
        if dep is not None and dep.managed_by != "config":
            raise decl.error(f"a deployment made through the API (id {dep.id}) has this name", "name", recheck=True)
        for field, value in [("served_name", decl.fields["served_name"])] + [
            ("aliases", a) for a in decl.fields["aliases"]
        ]:
            other = taken.get(value)
            if other is not None:
                raise decl.error(f"{value!r} is a name of {other.name}, made through the API", field, recheck=True)
        if dep is None:
            new_id = declared_id(decl.name)
            created.append(Creation(decl, new_id if new_id not in ids else ""))
            continue
        fields = differences(decl, dep)
        if not fields:
            unchanged += 1
            continue
        restart = dep.state in RUNNING and bool(set(fields) - LIVE_FIELDS)
        changed.append(Change(decl.name, dep.id, fields, restart))
    names = {decl.name for decl in declared}
    removed = [
        Removal(dep.name, dep.id, dep.declared_in)
        for dep in current
        if dep.managed_by == "config" and dep.name not in names
    ]
    return Plan(tuple(created), tuple(changed), tuple(removed), unchanged)
