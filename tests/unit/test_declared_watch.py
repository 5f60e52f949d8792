"""The declared files watched (dgxmm.declared.watch): a change applied once the files are
stable, a rename followed, SIGHUP, and a bad file that changes nothing and says why until fixed."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import wait_until
from unit.test_declared_apply import Host, host  # noqa: F401 (the fixture)

from dgxmm.declared.parse import Sources
from dgxmm.declared.plan import declared_id
from dgxmm.declared.watch import Declared

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
            pytest.skip("the loop could not take SIGHUP here")
        (folder / "a.toml").write_text(table("a"))
        os.kill(os.getpid(), signal.SIGHUP)
        await wait_until(lambda: names(host) == ["a"], timeout=5)
    finally:
        task.cancel()
