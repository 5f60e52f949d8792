"""The declared files watched (dgxmm.declared.watch): a change applied once the files are
stable, a rename followed, SIGHUP, and a bad file that changes nothing and says why until fixed."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_until
from unit.test_declared_apply import Host, host  # noqa: F401 (the fixture)

from dgxmm.api import modelcheck
from dgxmm.declared.parse import Sources
from dgxmm.declared.plan import declared_id
from dgxmm.declared.watch import Declared
from dgxmm.records.deployment import Deployment

TABLE = (
    '[[deployments]]\nname = "{name}"\nengine = "command"\ncommand = ["x"]\nmemory_gib = {gib}\nmode = "on_demand"\n'
)


def table(name: str, gib: float = 4) -> str:
    return TABLE.format(name=name, gib=gib)


@pytest.fixture
async def files(tmp_path: Path, host: Host) -> AsyncIterator[tuple[Declared, Path]]:  # noqa: F811
    folder = tmp_path / "deployments.d"
    folder.mkdir()
    config = tmp_path / "dgxmm.toml"
    config.write_text("[server]\nport = 8090\n")
    yield Declared(Sources(config, folder), host.applier, poll_s=0.05), folder


def names(host: Host) -> list[str]:  # noqa: F811
    return sorted(dep.name for dep in host.deployer.all())


async def test_a_bad_file_changes_nothing_and_is_shown_until_fixed(
    files: tuple[Declared, Path],
    host: Host,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    declared, folder = files
    (folder / "a.toml").write_text(table("a") + table("b"))
    assert await declared.reload() and names(host) == ["a", "b"]
    (folder / "a.toml").write_text(table("a", 6) + table("b").replace("mode =", "mood ="))
    caplog.set_level(logging.ERROR, logger="dgxmm.declared.watch")
    assert not await declared.reload() and not await declared.reload()
    assert names(host) == ["a", "b"] and host.deployer.get(declared_id("a")).memory_gib == 4
    error = declared.status()["error"]
    assert error is not None
    assert (error["file"], error["line"], error["table"], error["name"], error["field"]) == (
        str(folder / "a.toml"),
        12,
        2,
        "b",
        "mood",
    )
    assert len([r for r in caplog.records if "nothing changed" in r.getMessage()]) == 1  # logged once
    (folder / "a.toml").write_text(table("a", 6))
    assert await declared.reload()
    assert declared.status()["error"] is None and names(host) == ["a"]
    assert host.deployer.get(declared_id("a")).memory_gib == 6


async def test_changes_are_applied_while_it_watches_renames_included(
    files: tuple[Declared, Path],
    host: Host,  # noqa: F811
) -> None:
    declared, folder = files
    await declared.reload()
    task = asyncio.create_task(declared.run())
    try:
        (folder / "a.toml").write_text(table("a"))
        await wait_until(lambda: names(host) == ["a"], timeout=5)
        first = host.deployer.get(declared_id("a"))
        (folder / "new.tmp").write_text(table("a", 7) + table("b"))
        os.replace(folder / "new.tmp", folder / "a.toml")  # an editor's save by rename
        await wait_until(lambda: names(host) == ["a", "b"], timeout=5)
        assert host.deployer.get(declared_id("a")).memory_gib == 7
        assert host.deployer.get(declared_id("a")).created_at == first.created_at  # the same deployment
        (folder / "a.toml").unlink()
        await wait_until(lambda: names(host) == [], timeout=5)
    finally:
        task.cancel()


async def test_a_file_is_read_once_it_stopped_changing(files: tuple[Declared, Path], host: Host) -> None:  # noqa: F811
    """A file is read once two looks saw it the same: one still being written (it differs at
    each look) is never read half-way."""
    declared, folder = files
    await declared.reload()
    path = folder / "a.toml"
    seen = await declared.poll(None)
    for part in range(3):  # a slow writer: more of the file at each look
        with path.open("a") as f:
            f.write(table(f"p{part}"))
        seen = await declared.poll(seen)
        assert names(host) == []
    seen = await declared.poll(seen)
    assert names(host) == ["p0", "p1", "p2"]


async def test_sighup_reads_the_files_at_once(files: tuple[Declared, Path], host: Host) -> None:  # noqa: F811
    declared, folder = files
    slow = Declared(declared.sources, declared._applier, poll_s=3600)
    await slow.reload()
    task = asyncio.create_task(slow.run())
    try:
        await asyncio.sleep(0)
        if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
            pytest.skip(
                "the loop could not take SIGHUP here (run pytest in the main thread, without a plugin that holds the signal)"
            )
        (folder / "a.toml").write_text(table("a"))
        os.kill(os.getpid(), signal.SIGHUP)
        await wait_until(lambda: names(host) == ["a"], timeout=5)
    finally:
        task.cancel()


def llamacpp(name: str, model: Path) -> str:
    return f'[[deployments]]\nname = "{name}"\nengine = "llamacpp"\nmemory_gib = 1\nmodel = "{model}"\n'


async def test_a_missing_model_file_refuses_the_change_until_it_is_there(
    files: tuple[Declared, Path],
    host: Host,  # noqa: F811
    tmp_path: Path,
) -> None:
    """As POST /api/deployments would refuse it, naming the file, its line, table and field; the
    model file is looked at again at each poll (nothing else changed) and the whole change is
    applied once it is a GGUF."""
    given, folder = files
    said: list[dict[str, Any]] = []
    declared = Declared(given.sources, given._applier, poll_s=0.05, on_status=said.append)
    (folder / "a.toml").write_text(table("a"))
    assert await declared.reload() and names(host) == ["a"]
    gguf = tmp_path / "b.gguf"
    (folder / "a.toml").write_text(table("a", 6) + llamacpp("b", gguf))
    assert not await declared.reload()
    assert names(host) == ["a"] and host.deployer.get(declared_id("a")).memory_gib == 4  # nothing applied
    error = declared.status()["error"]
    assert error is not None
    assert (error["file"], error["line"], error["table"], error["name"], error["field"], error["recheck"]) == (
        str(folder / "a.toml"),
        11,
        2,
        "b",
        "model",
        True,
    )
    assert error["message"] == f"{gguf}: no such file on this host"
    gguf.write_text("not a model")
    seen = await declared.poll(None)  # the declared files did not change: the model file is looked at
    assert declared.status()["error"]["message"] == f"{gguf}: not a GGUF file (it does not begin with the GGUF magic)"
    assert names(host) == ["a"]
    seen = await declared.poll(seen)
    assert [s["error"]["message"] for s in said] == [  # each error said once, as it came
        f"{gguf}: no such file on this host",
        f"{gguf}: not a GGUF file (it does not begin with the GGUF magic)",
    ]
    gguf.write_bytes(b"GGUF")
    await declared.poll(seen)
    assert names(host) == ["a", "b"] and host.deployer.get(declared_id("a")).memory_gib == 6
    assert declared.status()["error"] is None and said[-1]["error"] is None


async def test_only_a_new_engine_or_model_is_checked_and_a_hung_file_is_waited_for_at_most_the_deadline(
    files: tuple[Declared, Path],
    host: Host,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    declared, folder = files
    opened: list[Path] = []
    release = threading.Event()
    real = modelcheck.why_not_gguf

    def why_not_gguf(path: Path) -> str | None:
        opened.append(path)
        if path.name == "hung.gguf":  # a file on a mount that does not answer
            release.wait(10)
        return real(path)

    monkeypatch.setattr(modelcheck, "why_not_gguf", why_not_gguf)
    monkeypatch.setattr(modelcheck, "DEADLINE_S", 0.3)
    one, two = tmp_path / "one.gguf", tmp_path / "two.gguf"
    for path in (one, two):
        path.write_bytes(b"GGUF")
    (folder / "a.toml").write_text(llamacpp("one", one) + llamacpp("two", two))
    assert await declared.reload() and opened == [one, two]
    opened.clear()
    assert await declared.reload() and opened == []  # as declared: nothing opened
    (folder / "a.toml").write_text(
        llamacpp("one", one).replace("memory_gib = 1", "memory_gib = 2") + llamacpp("two", two)
    )
    assert await declared.reload() and opened == []  # memory_gib: no file to look at
    hung = tmp_path / "hung.gguf"
    hung.write_bytes(b"GGUF")
    (folder / "a.toml").write_text(llamacpp("one", one) + llamacpp("two", hung))
    try:
        assert not await declared.reload()
        error = declared.status()["error"]
        assert (error["name"], error["field"]) == ("two", "model")
        assert error["message"] == f"{hung}: its file did not answer within 0.3 s"
        assert host.deployer.get(declared_id("two")).model == str(two)  # nothing applied
    finally:
        release.set()
        await wait_until(lambda: modelcheck._running == 0, timeout=5)  # its thread ended, counted out


async def test_a_name_an_api_deployment_holds_is_applied_once_that_one_is_removed(
    files: tuple[Declared, Path],
    host: Host,  # noqa: F811
) -> None:
    """Not a take-over: the file's error until the deployment made through the API is removed
    (an edit of the file is not needed then: it is tried again at each poll)."""
    declared, folder = files
    made = Deployment(id="api1", name="b", served_name="b", engine="command", command=["x"], memory_gib=1)
    host.deployer.create(made, user=None, start=False)
    (folder / "a.toml").write_text(table("a") + table("b"))
    assert not await declared.reload()
    error = declared.status()["error"]
    assert (error["name"], error["field"], error["recheck"]) == ("b", "name", True)
    seen = await declared.poll(None)
    assert names(host) == ["b"] and host.deployer.get("api1").managed_by == "api"  # untouched
    await host.deployer.remove("api1", actor="api")
    await declared.poll(seen)
    assert names(host) == ["a", "b"] and host.deployer.get(declared_id("b")).managed_by == "config"
    assert declared.status()["error"] is None
