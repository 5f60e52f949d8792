"""Deployments whose model a hub names (deploy/preparation.py), on the real deployer with a model
store the test drives: planned until the files are here, its reason the download's progress (at
most once a second), then what it would have been at create; the engine given the local path;
no engine before the files are verified; a failed fetch failed, a start fetching again; the
downloaded file checked as a create checks a local one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from conftest import wait_until
from unit.fakes import FakeModelFiles, FakeRuntime
from unit.ondemand_harness import until

from dgxmm.demo.tiny_gguf import write_tiny_gguf
from dgxmm.deploy import preparation
from dgxmm.deploy.budget import InsufficientMemory, MemoryBudget
from dgxmm.deploy.deployer import Deployer
from dgxmm.deploy.limits import EngineLimits
from dgxmm.errors import Conflict
from dgxmm.events import EventBus
from dgxmm.records.changes import Change
from dgxmm.records.deployment import Deployment, Mode, State
from dgxmm.settings import DeployerSettings, EngineSettings, MemorySettings
from dgxmm.store.db import Store

pytestmark = pytest.mark.timeout(15)
MODEL = "hf://org/tiny/model.gguf"


class Setup:
    def __init__(self, deployer: Deployer, models: FakeModelFiles, store: Store) -> None:
        self.deployer, self.models, self.store = deployer, models, store
        self.runtime: FakeRuntime = deployer.runtime  # type: ignore[assignment]
        self.changes: list[Change] = []
        deployer.add_listener(self.changes.append)

    def create(self, name: str = "a", *, mode: Mode = Mode.ON_DEMAND, gib: float = 4, **kw: object) -> Deployment:
        fields: dict[str, object] = {"engine": "command", "command": ["x", "{model}"], "model": MODEL, **kw}
        dep = Deployment(id=name, name=name, served_name=name, memory_gib=gib, mode=mode, **fields)  # type: ignore[arg-type]
        return self.deployer.create(dep, user="admin", start=mode is Mode.ALWAYS_ON)

    def state(self, name: str = "a") -> State:
        return self.deployer.get(name).state

    async def fetching(self, model: str = MODEL) -> None:
        await until(lambda: self.models.readiness_of(model).downloading)

    def events(self, name: str = "a") -> list[str]:
        return [row["text"] for row in self.store.list_events(100, name)]


@pytest.fixture(autouse=True)
def progress_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each progress written as it comes (the fold has its own test)."""
    monkeypatch.setattr(preparation, "PROGRESS_S", 0.0)


@pytest.fixture
async def s(tmp_path: Path) -> AsyncIterator[Setup]:
    store = Store(tmp_path / "db.sqlite")
    models = FakeModelFiles()
    budget = MemoryBudget(MemorySettings(capacity_gib=10))
    async with aiohttp.ClientSession() as http:
        deployer = Deployer(
            DeployerSettings(start_timeout_s=5, start_poll_s=0.01),
            store,
            EventBus(store),
            budget,
            FakeRuntime(),
            http,
            EngineLimits(budget.device_total, EngineSettings()),
            models=models,
        )
        yield Setup(deployer, models, store)
        await deployer.close()


async def test_an_on_demand_one_is_planned_while_its_files_come_then_stopped_and_its_engine_gets_the_local_path(
    s: Setup, tmp_path: Path
) -> None:
    made = s.create()
    assert made.state is State.PLANNED and made.state_reason == f"waiting for the files of {MODEL}"
    assert made.model_path is None
    await s.fetching()
    assert s.models.fetched == [MODEL]
    with pytest.raises(Conflict):  # no engine before the files are here: a start is refused
        s.deployer.restart("a", actor="api")
    s.models.progress(MODEL, "downloading 0.5 of 1.0 GiB, 100 MiB/s, about 5 s left")
    await until(lambda: s.deployer.get("a").state_reason.startswith("downloading 0.5"))
    heard = [c.deployment.state_reason for c in s.changes if c.kind == "progress"]  # by listeners, in order
    assert heard == ["downloading 0.0 of 1.0 GiB", "downloading 0.5 of 1.0 GiB, 100 MiB/s, about 5 s left"]
    local = tmp_path / "snap" / "model.gguf"
    s.models.arrive(MODEL, str(local))
    await until(lambda: s.state() is State.STOPPED)
    dep = s.deployer.get("a")
    assert dep.model == MODEL and dep.model_path == str(local) and dep.local_model == str(local)
    assert dep.state_reason == "" and s.runtime.started == []  # on demand: its first request starts it
    assert f"Fetched {MODEL} into {local}" in s.events()
    s.deployer.restart("a", actor="api")
    await until(lambda: s.runtime.started == ["a"])
    assert s.runtime.launched["a"].local_model == str(local)  # what {model} and -m are given


async def test_an_always_on_one_is_started_once_its_files_are_here_or_left_stopped_saying_it_does_not_fit(
    s: Setup, tmp_path: Path
) -> None:
    with pytest.raises(InsufficientMemory):  # as for a local model: one that cannot fit is not created
        s.create("huge", mode=Mode.ALWAYS_ON, gib=12)
    assert s.deployer.find("huge") is None and s.models.fetched == []
    s.create("big", mode=Mode.ALWAYS_ON, gib=8)
    other = "hf://org/other/m.gguf"
    s.create("late", mode=Mode.ALWAYS_ON, gib=4, model=other)
    assert s.state("big") is s.state("late") is State.PLANNED and s.runtime.started == []
    s.models.arrive(MODEL, str(tmp_path / "m.gguf"))
    await until(lambda: s.runtime.started == ["big"])
    assert s.state("big") is State.STARTING and s.runtime.launched["big"].local_model == str(tmp_path / "m.gguf")
    s.models.arrive(other, str(tmp_path / "o.gguf"))  # 8 of 10 GiB are held now
    await until(lambda: s.state("late") is State.STOPPED)
    assert s.deployer.get("late").state_reason.startswith("not started: ") and s.runtime.started == ["big"]


async def test_a_failed_fetch_fails_it_with_the_downloads_error_and_a_start_fetches_again(s: Setup) -> None:
    s.create()
    await s.fetching()
    s.models.fail(MODEL, "model.gguf: SHA-256 abc does not match the hub's def; the file was not kept")
    await until(lambda: s.state() is State.FAILED)
    assert s.deployer.get("a").state_reason.startswith("model.gguf: SHA-256")
    s.deployer.restart("a", actor="api")  # a start: planned again, the files fetched again, no engine
    assert s.state() is State.PLANNED and s.runtime.started == []
    await until(lambda: s.models.fetched == [MODEL, MODEL])
    assert f"Fetching {MODEL} again" in s.events()


async def test_a_fetch_the_store_refuses_fails_it_with_the_refusal(s: Setup) -> None:
    s.models.refuse[MODEL] = f"model: {MODEL}: org/tiny@main has no file model.gguf"
    s.create()
    await until(lambda: s.state() is State.FAILED)
    assert s.deployer.get("a").state_reason == s.models.refuse[MODEL]


async def test_progress_is_written_at_once_then_at_most_once_a_second_with_the_latest(
    s: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(preparation, "PROGRESS_S", 0.3)
    s.create()
    await s.fetching()
    await until(lambda: s.deployer.get("a").state_reason.startswith("downloading 0.0"))  # the first: at once
    written = [c for c in s.changes if c.kind == "progress"]
    for step in range(1, 20):  # a burst of ticks, far quicker than PROGRESS_S
        s.models.progress(MODEL, f"downloading {step / 100:.2f} of 1.0 GiB")
        await asyncio.sleep(0)
    assert [c for c in s.changes if c.kind == "progress"] == written
    await wait_until(lambda: s.deployer.get("a").state_reason == "downloading 0.19 of 1.0 GiB", 5)  # the latest
    assert len([c for c in s.changes if c.kind == "progress"]) == len(written) + 1


async def test_the_downloaded_file_is_checked_as_a_create_checks_a_local_gguf(s: Setup, tmp_path: Path) -> None:
    """A llama.cpp deployment: a file that is no GGUF, or larger than memory_gib, fails it with
    the admin API's own message; a GGUF that fits is stopped, with llama.cpp's estimate said."""
    not_gguf = tmp_path / "junk.gguf"
    not_gguf.write_bytes(b"not a model" * 100)
    big = tmp_path / "big.gguf"
    big.write_bytes(b"GGUF" + bytes(2 * 1024 * 1024))
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    for name, model, path in (("junk", "hf://o/r/junk.gguf", not_gguf), ("big", "hf://o/r/big.gguf", big)):
        s.create(name, engine="llamacpp", command=None, model=model, gib=0.001)
        s.models.arrive(model, str(path))
    s.create("tiny", engine="llamacpp", command=None, model="hf://o/r/tiny.gguf", gib=1)
    s.models.arrive("hf://o/r/tiny.gguf", str(tiny))
    await until(lambda: s.state("junk") is s.state("big") is State.FAILED and s.state("tiny") is State.STOPPED)
    assert s.deployer.get("junk").state_reason == (
        f"model: {not_gguf}: not a GGUF file (it does not begin with the GGUF magic)"
    )
    assert s.deployer.get("big").state_reason == (
        f"memory_gib: the model file {big} is 0.00 GiB, more than memory_gib 0.001 GiB: the engine could never fit"
    )
    assert s.deployer.get("junk").model_path is None  # (no engine may start on it)
    [fetched] = [e for e in s.events("tiny") if e.startswith("Fetched")]
    assert "llama.cpp will hold about" in fetched


async def test_an_edit_to_another_model_fetches_that_one_and_a_local_model_leaves_planned(s: Setup) -> None:
    s.create()
    await s.fetching()
    other = "hf://org/other@v2/m.gguf"
    s.deployer.reconfigure("a", {"model": other}, user="admin")
    await s.fetching(other)
    s.models.arrive(MODEL, "/old/model.gguf")  # the first model's pull ends: nothing of it is kept
    await asyncio.sleep(0.05)
    assert s.state() is State.PLANNED and s.deployer.get("a").model_path is None
    s.deployer.reconfigure("a", {"model": "/models/local.gguf"}, user="admin")
    assert s.state() is State.STOPPED and s.deployer.get("a").model_path is None


async def test_a_start_runs_on_the_path_the_store_gives_now(s: Setup) -> None:
    """A model pulled again onto a newer commit: the next start is given the new snapshot."""
    s.models.arrive(MODEL, "/snapshots/old/model.gguf")
    made = s.create()
    assert made.state is State.STOPPED and made.model_path == "/snapshots/old/model.gguf"  # here: not planned
    assert s.models.fetched == []
    s.models.arrive(MODEL, "/snapshots/new/model.gguf")
    s.deployer.restart("a", actor="api")
    await until(lambda: s.runtime.started == ["a"])
    assert s.runtime.launched["a"].local_model == "/snapshots/new/model.gguf"


async def test_a_restart_of_dgxmm_picks_up_every_planned_deployment(s: Setup) -> None:
    s.create()
    await s.fetching()
    await s.deployer.preparing.close()  # as a shutdown leaves it: planned
    s.models.fetched.clear()
    s.deployer.preparing.resume()
    s.models.arrive(MODEL, "/snap/model.gguf")
    await until(lambda: s.state() is State.STOPPED)
    assert s.models.fetched == []  # it was downloading: the store resumes it, nothing is asked again
