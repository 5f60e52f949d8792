"""Served names and aliases, unique on a host (issue 27): the deployer's name lookup, what a
clash is refused with, and a database from before names were unique."""

from __future__ import annotations

import pytest

from dgxmm.deploy.names import Names
from dgxmm.errors import InvalidInput
from dgxmm.records.deployment import Deployment


def dep(dep_id: str, served: str, *aliases: str) -> Deployment:
    return Deployment(
        id=dep_id, name=f"n-{dep_id}", served_name=served, aliases=list(aliases), engine="command", memory_gib=1
    )


def name_of(dep_id: str) -> str:
    return f"n-{dep_id}"


def test_every_name_finds_its_deployment_and_a_rename_frees_the_old_ones() -> None:
    names = Names()
    names.claim(dep("a", "chat", "talk", "gpt"))
    assert [names.find(n) for n in ("chat", "talk", "gpt", "other")] == ["a", "a", "a", None]
    names.claim(dep("a", "chat2", "talk"))
    assert [names.find(n) for n in ("chat", "chat2", "talk", "gpt")] == [None, "a", "a", None]
    names.release("a")
    assert [names.find(n) for n in ("chat2", "talk")] == [None, None]


@pytest.mark.parametrize(
    ("new", "field"),
    [
        (dep("b", "chat"), "served_name"),
        (dep("b", "coder", "talk"), "aliases"),
        (dep("b", "talk"), "served_name"),
    ],
)
def test_a_name_of_another_deployment_is_refused_naming_the_field_and_the_other(new: Deployment, field: str) -> None:
    names = Names()
    names.claim(dep("a", "chat", "talk"))
    with pytest.raises(InvalidInput) as refused:
        names.check(new, name_of)
    assert refused.value.field == field and "n-a (id a)" in refused.value.message


def test_a_deployment_may_keep_its_own_names() -> None:
    names = Names()
    names.claim(dep("a", "chat", "talk"))
    names.check(dep("a", "talk", "chat"), name_of)  # swapped between its served name and an alias


def test_a_name_two_old_deployments_share_stays_the_older_ones_until_it_goes() -> None:
    names = Names()
    assert names.claim(dep("old", "llama")) == []
    assert names.claim(dep("new", "llama", "mine")) == ["llama"]  # a database from before
    assert names.find("llama") == "old" and names.find("mine") == "new"
    names.release("old")
    assert names.find("llama") == "new"
    names.claim(dep("new", "other"))
    assert names.find("llama") is None
