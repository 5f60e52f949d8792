"""Engines as local child processes: the runtime for hosts without Docker, and for most tests.

Each engine runs in its own session (process group) so a stop reaches every process it spawned
(vLLM runs three), and in its own cgroup or followed by its process tree (``members``), so a
child that left the session is measured and stopped too; output goes to ``<data>/logs/<id>.log``,
never through a pipe only dgxmm holds; a vLLM's compile work to ``<data>/compile-cache/<id>/``
(``compilecache``).

By default (``[runtime] engines_outlive_dgxmm``) engines outlive dgxmm, as containers do: an exit,
a restart or a crash of dgxmm leaves them serving, and the next dgxmm adopts each one that is
provably the engine it started (``adopt``: the recorded pid with the same start time, the
deployment's id in its environment; reconcile then asks for its health and model list with the
run's own key). Set to false, they die with dgxmm: on a clean exit through ``close``, on a hard
kill through the parent-death signal. Either way, a process left with a deployment's id that is
not adopted is killed at the next start-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from dgxmm.datadir import make_private_dir, open_private
from dgxmm.deploy import compilecache
from dgxmm.deploy.compilecache import CacheReport, DirCaches
from dgxmm.deploy.engines import EngineKind
from dgxmm.deploy.gpus import visible_devices
from dgxmm.records.deployment import Deployment, RuntimeHandle
from dgxmm.deploy.runtimes.base import START_MARK, LaunchError, Runtime
from dgxmm.deploy.runtimes.engineproc import EngineProcess
from dgxmm.deploy.runtimes.members import Members, enter, own_cgroup, start_ticks
from dgxmm.deploy.runtimes.sockets import held_by_session
from dgxmm.deploy.procmemory import Usage
from dgxmm.settings import EngineSettings

log = logging.getLogger(__name__)

MARKER = "DGXMM_DEPLOYMENT_ID"
_PR_SET_PDEATHSIG = 1


def _before_exec(cgroup_fd: int | None, die_with_dgxmm: bool) -> Callable[[], None]:
    """What the child runs before exec: unless engines outlive dgxmm, SIGKILL it if dgxmm dies
    without cleaning up; join the engine's cgroup (before it can start anything that would be
    outside it)."""

    libc = ctypes.CDLL(None, use_errno=True) if die_with_dgxmm else None  # loaded before the fork

    def run() -> None:
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if cgroup_fd is not None:
            enter(cgroup_fd)

    return run


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _line_break(path: Path) -> str:
    """A newline when the log's last run ended mid-line (vLLM's last words often do), so the
    next start's mark begins a line, where ``current_run`` looks for it."""
    try:
        with path.open("rb") as log_file:
            if log_file.seek(0, os.SEEK_END) == 0:
                return ""
            log_file.seek(-1, os.SEEK_END)
            return "" if log_file.read(1) == b"\n" else "\n"
    except OSError:
        return ""


@dataclass
class _Child:
    process: EngineProcess
    log_path: Path
    members: Members


class ProcessRuntime(Runtime):
    name = "process"

    def __init__(
        self, data_dir: Path, engines: EngineSettings, stop_grace_s: float = 20.0, *, outlive: bool = False
    ) -> None:
        self.engines_outlive_dgxmm = outlive
        self._grace = stop_grace_s
        self._log_dir = data_dir / "logs"
        make_private_dir(self._log_dir)
        self._engines = engines
        self._children: dict[str, _Child] = {}
        self._ended_groups: dict[str, int] = {}  # deployment -> the process group its last stop killed
        self._ended_members: dict[str, Members] = {}  # deployment -> its last engine's, until the leftovers search
        self._locks: dict[str, asyncio.Lock] = {}
        self._cgroups = own_cgroup()  # where each engine's cgroup is made (None: by its tree)
        self._caches = DirCaches(data_dir)

    def _lock(self, deployment_id: str) -> asyncio.Lock:
        return self._locks.setdefault(deployment_id, asyncio.Lock())

    def log_path(self, deployment_id: str) -> Path:
        return self._log_dir / f"{deployment_id}.log"

    async def start(self, dep: Deployment, kind: EngineKind) -> RuntimeHandle:
        # Shielded: a caller cancelled mid-spawn must not lose a process it can no longer see;
        # the spawn finishes, registers the child, and a following stop() finds it.
        return await asyncio.shield(self._start(dep, kind))

    async def _start(self, dep: Deployment, kind: EngineKind) -> RuntimeHandle:
        async with self._lock(dep.id):
            await self._stop_locked(dep.id, grace_s=0)
            port = free_port()
            argv = kind.argv(dep, port, self._engines)
            if not argv:
                raise LaunchError("no command to run")
            # Its devices (a host with devices) and compile cache; a variable of its own env wins.
            cache = await self._compile_env(dep)
            env = {
                **os.environ,
                **visible_devices(dep.placed_on),
                **cache,
                **dep.env,
                **kind.extra_env(dep),
                MARKER: dep.id,
            }
            path = self.log_path(dep.id)
            with os.fdopen(open_private(path, os.O_WRONLY | os.O_APPEND), "ab", buffering=0) as out:
                try:  # (a full disk: no engine runs without its log)
                    out.write(f"{_line_break(path)}{START_MARK}{' '.join(argv)}\n".encode())
                except OSError as exc:
                    raise LaunchError(f"cannot write the engine's log {path}: {exc.strerror or exc}") from exc
                members = await asyncio.to_thread(Members, f"dgxmm-engine-{dep.id}", self._cgroups)
                cgroup_fd = members.join_fd()
                try:
                    popen = subprocess.Popen(  # (as asyncio's transport does it: on the loop, forking is quick)
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=out,
                        env=env,
                        start_new_session=True,
                        # The child makes two system calls and takes no lock (what threads make unsafe).
                        preexec_fn=_before_exec(cgroup_fd, die_with_dgxmm=not self.engines_outlive_dgxmm),  # noqa: PLW1509
                    )
                    process = EngineProcess.spawned(popen)
                except OSError as exc:
                    await asyncio.to_thread(members.close)
                    raise LaunchError(f"cannot run {argv[0]}: {exc.strerror or exc}") from exc
                finally:
                    if cgroup_fd is not None:
                        os.close(cgroup_fd)
            await asyncio.to_thread(members.started, process.pid)
            self._children[dep.id] = _Child(process, path, members)
            log.info("started %s (pid %d) for %s on port %d", argv[0], process.pid, dep.id, port)
            return RuntimeHandle(
                ref=str(process.pid),
                base_url=f"http://127.0.0.1:{port}",
                port=port,
                started_ticks=await asyncio.to_thread(start_ticks, process.pid),
            )

    async def _compile_env(self, dep: Deployment) -> dict[str, str]:
        """The environment that keeps a vLLM's compile work (its version asked at each start: a
        venv upgraded in place must not reuse the old build's entry). A cache that cannot be made
        (a full disk) is logged and the engine starts without it: it compiles, as it always did."""
        if not compilecache.kept(dep):
            return {}
        python = self._engines.vllm_python
        build = f"{python} {await asyncio.to_thread(compilecache.vllm_version, python)}"
        try:
            return await asyncio.to_thread(self._caches.prepare, dep, build)
        except OSError as exc:
            log.warning("no compile cache for %s: %s", dep.id, exc)
            return {}

    async def compile_cache(self, dep: Deployment) -> CacheReport | None:
        return await asyncio.to_thread(self._caches.report, dep.id) if compilecache.kept(dep) else None

    async def clear_compile_cache(self, deployment_id: str) -> None:
        await asyncio.to_thread(self._caches.clear, deployment_id)

    async def stop(self, deployment_id: str, grace_s: float) -> None:
        async with self._lock(deployment_id):
            await self._stop_locked(deployment_id, grace_s)

    async def _stop_locked(self, deployment_id: str, grace_s: float) -> None:
        child = self._children.pop(deployment_id, None)
        if child is None:
            return
        process, members = child.process, child.members
        if process.ended() is None:
            _signal_group(process.pid, signal.SIGTERM)
            _signal_group(process.pid, signal.SIGCONT)  # a stopped (SIGSTOP) engine must run to act on it
            await asyncio.to_thread(members.signal, signal.SIGTERM)  # those that left its session too
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), timeout=grace_s)
            except TimeoutError:
                log.warning("engine of %s ignored SIGTERM for %gs: killing it", deployment_id, grace_s)
        # The leader may be gone while others of its group still run: always finish the group,
        # and every process of the engine's outside it.
        _signal_group(process.pid, signal.SIGKILL)
        await asyncio.to_thread(members.signal, signal.SIGKILL)
        self._ended_groups[deployment_id] = process.pid
        self._ended_members[deployment_id] = members
        await process.wait()
        await asyncio.to_thread(members.close)

    def owns_listener(self, deployment_id: str, handle: RuntimeHandle) -> bool | None:
        """The socket on the engine's port is one of its session's (it was started in a session
        of its own), not another local process's that took the port first (sockets.py)."""
        child = self._children.get(deployment_id)
        if child is None or handle.port is None:
            return None
        return held_by_session(handle.port, child.process.pid) is True

    async def usage(self, deployment_id: str) -> Usage | None:
        """The memory of every process of the engine: its cgroup's, or its session's and their
        descendants' (``members``)."""
        child = self._children.get(deployment_id)
        if child is None or child.process.ended() is not None:
            return None
        return await asyncio.to_thread(child.members.usage)

    async def leftovers(self, deployment_id: str) -> list[str]:
        """Processes that still carry the deployment's marker after its stop ended the engine's
        processes: a child that left the group (setsid, a daemonizing server) and that the stop
        did not know as the engine's (``members``: a double fork between two readings of its
        tree). They are killed, each with its own group.

        Under the deployment's lock: a new start (a caller's retry of a failed one) waits for
        the search, which would otherwise find the new engine's processes and kill them."""
        async with self._lock(deployment_id):
            if deployment_id in self._children:
                return []  # it runs (again): nothing is left over
            ended = []
            own_group, killed = os.getpgid(0), self._ended_groups.get(deployment_id)
            for pid in await asyncio.to_thread(_marked, deployment_id):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    name = _command_name(pid)
                    group = os.getpgid(pid)
                    if group == killed:
                        continue  # of the group the stop killed: dying, not left over
                    if group != own_group:
                        _signal_group(group, signal.SIGKILL)
                    os.kill(pid, signal.SIGKILL)
                    ended.append(f"pid {pid} ({name})")
            members = self._ended_members.pop(deployment_id, None)
            if members is not None and ended:
                await asyncio.to_thread(members.close)  # its cgroup, which those kept from going
            return ended

    async def wait_exit(self, deployment_id: str) -> str:
        child = self._children.get(deployment_id)
        if child is None:
            return "not running"
        return await child.process.wait()

    def exit_reason(self, deployment_id: str) -> str | None:
        child = self._children.get(deployment_id)
        if child is None:
            return "not running"
        return child.process.ended()

    def output_size(self, deployment_id: str) -> int | None:
        try:
            return os.stat(self.log_path(deployment_id)).st_size
        except OSError:
            return None

    async def logs(self, deployment_id: str, tail: int) -> list[str]:
        return read_tail(self.log_path(deployment_id), tail)

    def log_position(self, deployment_id: str) -> int | None:
        """The log file's size: its lines up to here are the ones written so far."""
        return self.output_size(deployment_id)

    async def logs_before(self, deployment_id: str, tail: int, position: int) -> list[str]:
        return read_tail(self.log_path(deployment_id), tail, end=position)

    async def follow_logs(self, deployment_id: str, tail: int, poll_s: float = 0.25) -> AsyncIterator[list[str]]:
        """The log file followed by offset: exact, and across restarts of the engine (each run
        appends to the same file)."""
        async for lines in follow_file(self.log_path(deployment_id), tail, poll_s):
            yield lines

    async def adopt(self, dep: Deployment) -> RuntimeHandle | None:
        """The engine an earlier dgxmm started for ``dep``, when engines outlive dgxmm and it is
        provably that engine: the recorded pid, alive, with the recorded start time and the
        deployment's id in its environment (reconcile then checks its health and model list with
        the run's key, and stops it when they fail). Anything else an earlier dgxmm left for this
        deployment is killed: every process that carries its marker (children inherit it), each
        with its process group, since the parent-death signal reaches only an engine's first
        process."""
        marked = await asyncio.to_thread(_marked, dep.id)
        handle = dep.runtime_handle
        if self.engines_outlive_dgxmm and handle is not None and handle.started_ticks is not None:
            pid = int(handle.ref)
            if pid in marked and await asyncio.to_thread(start_ticks, pid) == handle.started_ticks:
                with contextlib.suppress(ProcessLookupError):  # (it ended just now: killed below)
                    process = EngineProcess(pid)
                    members = await asyncio.to_thread(Members, f"dgxmm-engine-{dep.id}", self._cgroups)
                    await asyncio.to_thread(members.started, pid)
                    self._children[dep.id] = _Child(process, self.log_path(dep.id), members)
                    log.info("adopted the engine of %s (pid %d) an earlier dgxmm started", dep.id, pid)
                    return handle
        own_group = os.getpgid(0)
        for pid in marked:
            log.warning("killing engine left by an earlier dgxmm for %s (pid %d)", dep.id, pid)
            with contextlib.suppress(ProcessLookupError):
                group = os.getpgid(pid)
                if group != own_group:  # engines run in their own session; never signal ours
                    _signal_group(group, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)
        return None

    async def close(self) -> None:
        """dgxmm exits: its engines go on when they outlive it (the next dgxmm adopts them),
        else each is stopped with its grace."""
        if self.engines_outlive_dgxmm:
            for child in self._children.values():
                child.process.detach()
            return
        await asyncio.gather(*(self.stop(dep_id, self._grace) for dep_id in list(self._children)))


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _marked(deployment_id: str) -> list[int]:
    """Processes whose environment carries ``DGXMM_DEPLOYMENT_ID=<id>`` (ids are random, so no
    other dgxmm's engines match)."""
    marker = f"{MARKER}={deployment_id}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def read_tail(path: Path, lines: int, max_bytes: int = 256 * 1024, end: int | None = None) -> list[str]:
    """The last lines of a log file (of its first ``end`` bytes, when given), reading at most
    ``max_bytes`` back from there."""
    if lines <= 0:
        return []
    try:
        with path.open("rb") as f:
            stop = f.seek(0, os.SEEK_END) if end is None else min(end, f.seek(0, os.SEEK_END))
            f.seek(max(0, stop - max_bytes))
            data = f.read(stop - f.tell())
    except FileNotFoundError:
        return []
    text = data.decode("utf-8", errors="replace")
    return list(deque(text.splitlines(), maxlen=lines))


async def follow_file(path: Path, tail: int, poll_s: float, max_bytes: int = 256 * 1024) -> AsyncIterator[list[str]]:
    """The last ``tail`` lines of a file, then every ``poll_s`` the complete lines added since
    (an empty list when there are none; a line still being written waits for its newline, up
    to ``max_bytes``). A file that shrank was replaced: it is read again from its start."""
    pos, partial = 0, b""
    try:
        with path.open("rb") as f:
            pos = f.seek(0, os.SEEK_END)
            f.seek(max(0, pos - max_bytes))
            partial = f.read(pos - f.tell())
    except FileNotFoundError:
        pass
    first = True
    while True:
        complete, newline, rest = partial.rpartition(b"\n")
        lines: list[str] = []
        if newline or len(partial) > max_bytes:
            lines = (complete if newline else rest).decode("utf-8", errors="replace").split("\n")
            partial = rest if newline else b""
        if first:
            lines, first = lines[-tail:] if tail > 0 else [], False
        yield lines
        await asyncio.sleep(poll_s)
        try:
            with path.open("rb") as f:
                end = f.seek(0, os.SEEK_END)
                if end < pos:
                    pos, partial = 0, b""
                f.seek(pos)
                data = f.read(min(end - pos, max_bytes))
        except FileNotFoundError:
            data = b""
        pos += len(data)
        partial += data
