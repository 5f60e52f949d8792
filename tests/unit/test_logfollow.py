"""Following an engine's log: the process runtime's file follower (by offset, on a real file) and
the generic follower other runtimes use (reading the tail again and finding where it grew)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes import FakeRuntime

from dgxmm.deploy.runtimes.base import START_MARK, appended, current_run
from dgxmm.deploy.runtimes.process import follow_file


@pytest.mark.parametrize(
    ("old", "new", "added"),
    [
        ([], ["a", "b"], ["a", "b"]),
        (["a", "b"], ["a", "b"], []),
        (["a", "b"], ["a", "b", "c"], ["c"]),
        (["a", "b", "c"], ["b", "c", "d", "e"], ["d", "e"]),  # the window slid
        (["x", "x"], ["x", "x", "x"], ["x"]),  # repeated lines: the latest match wins
        (["a", "b"], ["c", "d"], ["c", "d"]),  # replaced: everything is new
    ],
)
def test_appended(old: list[str], new: list[str], added: list[str]) -> None:
    assert appended(old, new) == added


def test_current_run_is_what_follows_the_last_start_mark() -> None:
    log = [f"{START_MARK}engine a", "one", f"{START_MARK}engine b", "two", "three"]
    assert current_run(log) == ["two", "three"]
    assert current_run(["no marks", "at all"]) == ["no marks", "at all"]
    assert current_run([f"{START_MARK}x"]) == []


async def test_follow_file_gives_the_tail_then_whole_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "engine.log"
    path.write_text("one\ntwo\nthree\n")
    follow = follow_file(path, tail=2, poll_s=0.01)
    assert await anext(follow) == ["two", "three"]
    assert await anext(follow) == []
    with path.open("a") as f:
        f.write("four\nfi")  # a line still being written
    assert await anext(follow) == ["four"]
    with path.open("a") as f:
        f.write("ve\nsix\n")
    assert await anext(follow) == ["five", "six"]
    path.write_text("new run\n")  # replaced by a shorter file: read from its start
    assert await anext(follow) == ["new run"]
    await follow.aclose()


async def test_follow_file_waits_for_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "later.log"
    follow = follow_file(path, tail=5, poll_s=0.01)
    assert await anext(follow) == []
    path.write_text("hello\n")
    assert await anext(follow) == ["hello"]
    await follow.aclose()


async def test_generic_follow_reads_the_tail_again() -> None:
    lines = ["a", "b", "c"]

    class Growing(FakeRuntime):
        async def logs(self, deployment_id: str, tail: int) -> list[str]:
            return lines[-tail:]

    follow = Growing().follow_logs("d", 2, poll_s=0.01)
    assert await anext(follow) == ["b", "c"]
    lines.extend(["d", "e"])
    assert await anext(follow) == ["d", "e"]
    assert await asyncio.wait_for(anext(follow), 1) == []
    await follow.aclose()


async def test_a_start_mark_begins_a_line_after_a_run_that_ended_mid_line(tmp_path: Path) -> None:
    """vLLM's last words often lack a newline; the next start's mark must still begin a line, or
    ``current_run`` takes both runs for one."""
    from dgxmm.deploy.engines import engine_of
    from dgxmm.deploy.runtimes.process import ProcessRuntime
    from dgxmm.records.deployment import Deployment
    from dgxmm.settings import EngineSettings

    runtime = ProcessRuntime(tmp_path, EngineSettings())
    dep = Deployment(
        id="midline", name="m", served_name="m", engine="command", command=["printf", "last words"], memory_gib=1
    )
    try:
        for _ in range(2):
            await runtime.start(dep, engine_of(dep))
            assert await asyncio.wait_for(runtime.wait_exit(dep.id), 10) == "exit code 0"
        lines = runtime.log_path(dep.id).read_text().splitlines()
        assert [line.startswith(START_MARK) for line in lines] == [True, False, True, False]
        assert current_run(lines) == ["last words"]
    finally:
        await runtime.close()
