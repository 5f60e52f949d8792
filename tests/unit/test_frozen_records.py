"""No stored deployment record can be changed from outside the deployer (issue 36 item 3): every
way a reader reaches one (``find``, ``peek``, ``get``, ``by_name``, ``all``, ``peek_all``, a
listener's ``Change``, a stop's precheck) hands the stored record itself, frozen, so an
assignment raises pydantic's frozen error and the record stays as the deployer wrote it. (mypy
strict over src reports such an assignment too: "Property ... is read-only".)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from pydantic import ValidationError
from unit.fakes import FakeRuntime

from dgxmm.deploy.budget import MemoryBudget
from dgxmm.deploy.deployer import Deployer
from dgxmm.events import EventBus
from dgxmm.records.changes import Change
from dgxmm.records.deployment import Deployment, RuntimeHandle, State
from dgxmm.settings import DeployerSettings, MemorySettings
from dgxmm.store.db import Store


@pytest.fixture
async def deployer(tmp_path: Path) -> AsyncIterator[Deployer]:
    store = Store(tmp_path / "db.sqlite")
    async with aiohttp.ClientSession() as http:
        d = Deployer(
            DeployerSettings(),
            store,
            EventBus(store),
            MemoryBudget(MemorySettings(capacity_gib=10)),
            FakeRuntime(),
            http,
        )
        yield d
        await d.close()


def assert_frozen(dep: Deployment) -> None:
    with pytest.raises(ValidationError, match="frozen"):
        dep.state = State.READY
    with pytest.raises(ValidationError, match="frozen"):
        dep.name = "other"
    if dep.runtime_handle is not None:
        with pytest.raises(ValidationError, match="frozen"):
            dep.runtime_handle.base_url = "http://127.0.0.1:1"


async def test_every_reader_gets_a_record_it_cannot_change(deployer: Deployer) -> None:
    heard: list[Change] = []
    deployer.add_listener(heard.append)
    deployer.create(
        Deployment(id="a", name="a", served_name="a", engine="command", memory_gib=1), user=None, start=False
    )
    deployer._ledger.mark_starting("a", None)
    deployer._ledger.set_handle("a", RuntimeHandle(ref="r", base_url="http://127.0.0.1:9"))
    prechecked: list[Deployment] = []
    deployer._begin_stop("a", lambda dep: prechecked.append(dep) or False, "stopped")  # refused: nothing changes
    reached = [
        deployer.find("a"),
        deployer.peek("a"),
        deployer.get("a"),
        deployer.by_name("a"),
        *deployer.all(),
        *deployer.peek_all(),
        *prechecked,
        *(change.deployment for change in heard),
    ]
    assert len(reached) == 7 + 2 and len(heard) == 2  # created, starting
    for dep in reached:
        assert dep is not None
        assert_frozen(dep)
    stored = deployer.get("a")
    assert (stored.state, stored.name, stored.runtime_handle) == (
        State.STARTING,
        "a",
        RuntimeHandle(ref="r", base_url="http://127.0.0.1:9"),
    )


async def test_create_stores_a_new_record_and_leaves_the_callers_as_it_was(deployer: Deployer) -> None:
    mine = Deployment(id="", name="b", served_name="b", engine="command", memory_gib=1, state=State.READY)
    stored = deployer.create(mine, user=None, start=False)
    assert (mine.id, mine.state) == ("", State.READY)
    assert stored is not mine and stored.id != "" and stored.state is State.STOPPED
    assert deployer.get(stored.id) is stored  # a read hands the stored record, no copy
    assert_frozen(stored)


async def test_a_change_is_a_new_record_and_the_old_one_stays_as_it_was(deployer: Deployer) -> None:
    before = deployer.create(
        Deployment(id="c", name="c", served_name="c", engine="command", memory_gib=1), user=None, start=False
    )
    after = deployer._ledger.edit("c", {"idle_timeout_s": 60})
    assert (before.idle_timeout_s, after.idle_timeout_s) == (None, 60)
    assert deployer.get("c") is after


SNIPPET = """
from dgxmm.records.deployment import Deployment, RuntimeHandle, State


def reader(dep: Deployment, handle: RuntimeHandle) -> Deployment:
    dep.state = State.READY
    handle.base_url = "http://127.0.0.1:1"
    return dep.model_copy(update={"state": State.READY})
"""


def test_the_type_checker_reports_an_assignment_to_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """mypy (strict, with the pydantic plugin, as ``make lint`` runs it over src) names each
    assignment; a new record made with ``model_copy`` passes. About a second with a cold cache."""
    from mypy import api

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("MYPYPATH", str(root / "src"))  # this checkout's dgxmm, as make lint checks it
    (tmp_path / "snippet.py").write_text(SNIPPET)
    out, err, code = api.run(
        [
            *("--config-file", str(root / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache")),
            *("--follow-imports", "silent", "--no-error-summary", str(tmp_path / "snippet.py")),
        ]
    )
    errors = [line.split(": error: ")[1] for line in out.splitlines() if ": error: " in line]
    assert errors == [
        'Property "state" defined in "Deployment" is read-only  [misc]',
        'Property "base_url" defined in "RuntimeHandle" is read-only  [misc]',
    ], out + err
    assert code == 1
