"""Every stored record has one writer (issue 48 item 2), read from the source as test_layers.py reads
the imports: a deployment record changes only through the ledger's named writes (deploy/ledger.py),
which no module outside deploy/ calls or reaches; the model store's records and the caller keys
are frozen, and only their writer makes a new one (``dataclasses.replace``) or stores one."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from dgxmm.deploy.ledger import Ledger
from dgxmm.gateway.keyrecord import CallerKey
from dgxmm.modelstore.record import ModelFile, ModelRecord
from dgxmm.records.deployment import Deployment, MemoryLimit, RuntimeHandle

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "dgxmm"
MODULES = {".".join(p.relative_to(SRC).with_suffix("").parts): p for p in PACKAGE.rglob("*.py")}

# The ledger's methods that read: every other public one writes a record or tells its listeners.
READERS = frozenset({"peek", "all", "name_of", "require", "require_writable"})
WRITES = (
    frozenset(name for name, _ in inspect.getmembers(Ledger, inspect.isfunction) if not name.startswith("_")) - READERS
)
# The named writes the deployer hands on, each through its user's Protocol: the controller's mode
# switch (controller/effects.py) and a declaration's move (declared/apply.py).
HANDED_ON = frozenset({"switch_mode", "pend_mode", "move_declaration"})
# The generic writes that are gone: no module may bring one back under its old name.
GONE = frozenset({"set_state", "record_handle", "write"})
# A write's name common enough to be another object's method (``set.add``, ``dict.update``):
# counted only on a receiver named as the deployer, its ledger or its records are.
RECEIVERS = ("deployer", "ledger", "records")


def deployment_writes(path: Path) -> list[str]:
    """The calls in ``path`` of a write of deployment records other than those handed on, and
    every mention of the ledger (its module imported, or ``_ledger`` reached)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "dgxmm.deploy.ledger":
            found.append(f"imports dgxmm.deploy.ledger at line {node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr == "_ledger":
            found.append(f"reaches {ast.unparse(node)} at line {node.lineno}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, receiver = node.func.attr, ast.unparse(node.func.value)
            named = any(word in receiver.rsplit(".", 1)[-1] for word in RECEIVERS)
            distinctive = "_" in name and name in WRITES | GONE
            if name not in HANDED_ON and (distinctive or (named and name in WRITES | GONE | {"update"})):
                found.append(f"{receiver}.{name} at line {node.lineno}")
    return found


def test_the_ledger_names_its_writes() -> None:
    assert {"mark_ready", "mark_stopped", "declare_stopped", "set_model_path", "edit", "switch_mode"} <= WRITES
    assert not {"set_state", "update", "write"} & WRITES  # (no write of any field by name)


def test_no_module_outside_deploy_calls_a_deployment_write() -> None:
    """Outside deploy/, a part that changes a deployment asks the deployer for an operation that
    checks it (``reconfigure``, ``reset_after_edit``, ``restart``, ``stop`` ...) or calls a
    named write handed on to it (``HANDED_ON``); none holds the ledger."""
    calls = sorted(
        f"{module}: {call}"
        for module, path in MODULES.items()
        if not module.startswith("dgxmm.deploy.")
        for call in deployment_writes(path)
    )
    assert calls == []


def test_the_write_rule_sees_each_way_of_writing(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from dgxmm.deploy.ledger import Ledger\n"
        "ctx.deployer.set_state(i, s)\n"
        "self._deployer.update(i, mode=m)\n"
        "found.update(x)\n"
        "records.update(i, a=1)\n"
        "self._records.mark_ready(i)\n"
        "deployer._ledger.edit(i, {})\n"
        "things.add(x)\n"
        "self._deployer.switch_mode(i, m, None)\n"
    )
    assert deployment_writes(tmp_path / "m.py") == [
        "imports dgxmm.deploy.ledger at line 1",
        "ctx.deployer.set_state at line 2",
        "self._deployer.update at line 3",
        "records.update at line 5",
        "self._records.mark_ready at line 6",
        "deployer._ledger.edit at line 7",
        "reaches deployer._ledger at line 7",
    ]


# --- frozen records, each with one writer ---------------------------------------------------------

FROZEN_MODELS: list[type[BaseModel]] = [Deployment, RuntimeHandle, MemoryLimit]
FROZEN_DATACLASSES: list[type] = [ModelRecord, ModelFile, CallerKey]
# Each dataclass record's writer: the one module that makes a new record of it (``replace``) and
# stores it (the store call named). A deployment is stored by the ledger alone (``Store.put``).
WRITERS = {
    "ModelRecord": ("dgxmm.modelstore.store", "put_model"),
    "CallerKey": ("dgxmm.gateway.callerkeys", "put_caller_key"),
    "Deployment": ("dgxmm.deploy.ledger", "put"),
}


@pytest.mark.parametrize("model", FROZEN_MODELS, ids=lambda c: c.__name__)
def test_a_deployment_record_is_frozen(model: type[BaseModel]) -> None:
    assert model.model_config.get("frozen") is True


@pytest.mark.parametrize("record", FROZEN_DATACLASSES, ids=lambda c: c.__name__)
def test_a_stored_dataclass_record_is_frozen(record: type) -> None:
    assert dataclasses.is_dataclass(record) and record.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_an_assignment_to_a_record_fails() -> None:
    key = CallerKey(id="k", name="k", prefix="", digest=b"", models=("a-*",))
    model = ModelRecord("m", "org/repo", "main", [])
    dep = Deployment(id="d", name="d", served_name="d", engine="command", memory_gib=1)
    for record, field in ((key, "models"), (model, "bytes_done"), (dep, "state")):
        with pytest.raises((dataclasses.FrozenInstanceError, ValidationError)):
            setattr(record, field, None)
    assert key.allows("a-1") and not key.allows("b-1")  # (its pattern built with the frozen record)


def replacers(path: Path) -> set[str]:
    """The record classes ``path`` names (imports or annotates) if it calls ``dataclasses.replace``."""
    tree = ast.parse(path.read_text())
    calls = any(
        isinstance(node, ast.Call) and ast.unparse(node.func) in ("replace", "dataclasses.replace")
        for node in ast.walk(tree)
    )
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    return {cls for cls in WRITERS if cls in names} if calls else set()


def store_calls(path: Path) -> set[str]:
    """The store writes ``path`` calls, of those the records' writers make."""
    stores = {call for _, call in WRITERS.values()}
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            receiver = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
            if name in stores and (name != "put" or receiver.rsplit(".", 1)[-1] in ("store", "_store", "db", "_db")):
                found.add(name)
    return found


def test_only_its_writer_makes_or_stores_a_new_record() -> None:
    """A frozen record is changed by a new one in its place: only its writer makes it (a
    deployment's what-ifs, ``model_copy``, are no write: only the ledger stores one)."""
    made = sorted(
        f"{module}: replaces {cls}"
        for module, path in MODULES.items()
        for cls in replacers(path)
        if cls != "Deployment" and WRITERS[cls][0] != module
    )
    stored = sorted(
        f"{module}: {call}"
        for module, path in MODULES.items()
        for call in store_calls(path)
        if all(writer != module for writer, store in WRITERS.values() if store == call)
    )
    assert (made, stored) == ([], [])


def test_the_writer_rules_see_a_second_writer(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from dataclasses import replace\n"
        "from dgxmm.modelstore.record import ModelRecord\n"
        "def f(r: ModelRecord, db):\n"
        "    put_model(db, replace(r, path=None).row())\n"
        "    self._store.put(dep)\n"
        "    queue.put(x)\n"
    )
    assert replacers(tmp_path / "m.py") == {"ModelRecord"}
    assert store_calls(tmp_path / "m.py") == {"put_model", "put"}
