"""The plan (dgxmm.declared.plan): declarations and deployments in, what to do out, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from dgxmm.declared.parse import DeclarationError, Sources, read
from dgxmm.declared.plan import declared_id, plan
from dgxmm.records.deployment import Deployment, State


def decls(*tables: dict[str, Any]) -> list[Any]:
    base = {"engine": "llamacpp", "model": "/m.gguf", "memory_gib": 4, "mode": "on_demand"}
    return list(read(Sources(None, None, tuple(base | t for t in tables))))


def stored(name: str, state: State = State.STOPPED, **fields: Any) -> Deployment:
    """The record a declaration of ``name`` (as ``decls`` builds it) leaves once created."""
    decl = decls({"name": name})[0]
    data = decl.fields | {"managed_by": "config", "declared_in": "config"} | fields
    return Deployment(id=declared_id(name), state=state, **data)


def test_new_names_are_created_with_ids_derived_from_them() -> None:
    result = plan(decls({"name": "a"}, {"name": "b"}), [])
    assert [(c.declaration.name, c.id) for c in result.created] == [("a", declared_id("a")), ("b", declared_id("b"))]
    assert declared_id("a") == declared_id("a") != declared_id("b") and len(declared_id("a")) == 12
    assert not result.changed and not result.removed


def test_as_declared_is_no_change() -> None:
    result = plan(decls(*({"name": f"m{i}"} for i in range(100))), [stored(f"m{i}") for i in range(100)])
    assert result.empty and result.unchanged == 100
    assert result.lines() == ["no change (100 declared deployments as declared)"]


@pytest.mark.parametrize(
    ("table", "state", "fields", "restart"),
    [
        ({"memory_gib": 6}, State.READY, ["memory_gib"], True),
        ({"memory_gib": 6}, State.STOPPED, ["memory_gib"], False),
        ({"args": ["-c", "8192"]}, State.ASLEEP, ["args"], True),
        ({"env": {"A": "1"}}, State.STARTING, ["env"], True),
        ({"aliases": ["x"]}, State.READY, ["aliases"], False),
        ({"preload": True}, State.READY, ["preload"], False),
        ({"max_concurrent": 2}, State.READY, ["max_concurrent"], False),
        ({"mode": "always_on"}, State.READY, ["mode"], False),
        ({"idle_timeout_s": 120}, State.READY, ["idle_timeout_s"], False),
        ({"served_name": "other", "aliases": ["y"]}, State.READY, ["aliases", "served_name"], True),
    ],
)
def test_a_change_restarts_a_running_engine_only_when_the_engine_sees_it(
    table: dict[str, Any], state: State, fields: list[str], restart: bool
) -> None:
    [change] = plan(decls({"name": "a"} | table), [stored("a", state)]).changed
    assert (sorted(change.fields), change.restart, change.id) == (fields, restart, declared_id("a"))


def test_gpus_the_deployer_derived_is_no_change() -> None:
    assert plan(decls({"name": "a"}), [stored("a", gpus=2)]).empty


def test_a_table_moved_to_another_file_changes_only_its_file() -> None:
    [change] = plan(decls({"name": "a"}), [stored("a", State.READY, declared_in="old.toml")]).changed
    assert change.fields == {"declared_in": ("old.toml", "config")} and not change.restart


def test_removed_are_the_declared_ones_only() -> None:
    api = Deployment(id="api1", name="made", served_name="made", engine="llamacpp", memory_gib=1)
    result = plan(decls({"name": "a"}), [stored("a"), stored("gone", State.READY), api])
    assert [(r.name, r.id) for r in result.removed] == [("gone", declared_id("gone"))]
    assert result.unchanged == 1 and not result.created
    assert result.as_dict()["removed"] == [{"name": "gone", "id": declared_id("gone"), "file": "config"}]


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"name": "made"}, "name"),
        ({"name": "a", "served_name": "m2"}, "served_name"),
        ({"name": "a", "aliases": ["m3"]}, "aliases"),
    ],
)
def test_what_an_api_deployment_holds_is_an_error_of_the_file(table: dict[str, Any], field: str) -> None:
    api = Deployment(id="api1", name="made", served_name="m2", aliases=["m3"], engine="llamacpp", memory_gib=1)
    with pytest.raises(DeclarationError) as caught:
        plan(decls(table), [api])
    assert (
        caught.value.field == field and caught.value.file == "config" and "made through the API" in caught.value.message
    )


def test_lines_say_what_happens() -> None:
    result = plan(decls({"name": "new"}, {"name": "a", "memory_gib": 8}), [stored("a", State.READY), stored("old")])
    assert result.lines() == [
        "create  new (config)",
        "change  a: memory_gib (restarted)",
        "remove  old",
        "unchanged: 0",
    ]
    assert result.restarted == ("a",)
