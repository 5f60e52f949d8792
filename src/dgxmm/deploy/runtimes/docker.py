"""Engines as Docker containers, over the Docker Engine API (aiodocker).

Containers are named ``dgxmm-<id>`` and labelled ``dgxmm.managed`` / ``dgxmm.deployment`` /
``dgxmm.instance``, so after a dgxmm restart the runtime adopts the ones still running and
removes its own dead ones, and a name left by a crashed dgxmm never blocks the next start. It
touches only its own instance's containers (and unlabelled ones of a deployment it knows, which an
older dgxmm made): another dgxmm on the same Docker host, or one started on a copy or a new data
directory, never removes this one's engines. Engines join the configured network;
when dgxmm itself runs in a container it reaches them by their address on that network, else
through a port published on ``publish_host`` (127.0.0.1). Containers outlive dgxmm on purpose:
a restart of dgxmm does not restart the models. A model pulled by the model store
(``hf://``) is given to its container by binding the models directory read-only at the same
path, so the local path the engine is told is the same inside (``binds``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import aiodocker

from dgxmm.deploy.engines import EngineKind, engine_of
from dgxmm.records.deployment import Deployment, RuntimeHandle
from dgxmm.deploy.procmemory import Usage
from dgxmm.deploy import compilecache
from dgxmm.deploy.compilecache import CacheReport
from dgxmm.deploy.runtimes.base import LaunchError, Runtime
from dgxmm.deploy.runtimes.dockercache import LABEL_DEPLOYMENT, LABEL_INSTANCE, VolumeCaches
from dgxmm.settings import EngineSettings, RuntimeSettings

log = logging.getLogger(__name__)

LABEL_MANAGED = "dgxmm.managed"
NO_GPU_HINT = (
    "this Docker host has no NVIDIA container runtime, so it cannot give the engine a GPU: "
    'install the NVIDIA Container Toolkit, or set "gpus": false on the deployment'
)
PULL_EVENT_EVERY_S = 5.0

Notify = Callable[[str, str], None]  # (deployment id, event text)


def container_name(deployment_id: str) -> str:
    return f"dgxmm-{deployment_id}"


def binds(dep: Deployment, models_dir: Path | None) -> list[str]:
    """The deployment's ``volumes``, and for a hub model the models directory, read-only at the
    same path: its snapshot's files are links into the repository's ``blobs``, so the whole
    directory is bound, not the one file. Not when a volume already puts something at that path
    or above it (the user's own mapping wins)."""
    volumes = list(dep.volumes)
    if not dep.from_hub or models_dir is None:
        return volumes
    inside = PurePosixPath(models_dir)
    for volume in volumes:
        parts = volume.split(":")
        if len(parts) > 1 and inside.is_relative_to(PurePosixPath(parts[1])):
            return volumes
    return [*volumes, f"{models_dir}:{models_dir}:ro"]


class DockerRuntime(Runtime):
    name = "docker"
    engines_outlive_dgxmm = True

    def __init__(
        self,
        settings: RuntimeSettings,
        engines: EngineSettings,
        notify: Notify,
        in_container: Callable[[], bool],
        instance: str = "",
        models_dir: Path | None = None,
    ) -> None:
        self._settings = settings
        self._instance = instance
        self._engines = engines
        self._notify = notify
        self._in_container = in_container
        self._models_dir = models_dir  # the model store's directory, bound for hub models
        self._docker = aiodocker.Docker(url=settings.docker_host)
        self._exits: dict[str, str | None] = {}  # deployment id -> exit description (None: runs)
        self._waiters: dict[str, asyncio.Task[None]] = {}
        # Bytes the container has written, counted from its log stream: the readiness hint.
        self._output: dict[str, int] = {}
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._caches = VolumeCaches(self._docker, instance)

    @property
    def docker(self) -> aiodocker.Docker:
        return self._docker

    def _lock(self, deployment_id: str) -> asyncio.Lock:
        return self._locks.setdefault(deployment_id, asyncio.Lock())

    # --- start --------------------------------------------------------------------------------

    async def start(self, dep: Deployment, kind: EngineKind) -> RuntimeHandle:
        # Shielded like the process runtime: a cancelled caller must not lose a container.
        return await asyncio.shield(self._start(dep, kind))

    async def _start(self, dep: Deployment, kind: EngineKind) -> RuntimeHandle:
        async with self._lock(dep.id):
            await self._remove_ours(dep.id)
            image = dep.image or kind.image(self._engines)
            if not image:
                raise LaunchError(f'no image: the {kind.name} engine needs "image" for docker')
            await self._ensure_image(image, dep.id)
            cache = await self._compile_cache(dep, image)
            config = self._config(dep, kind, image, cache)
            try:
                container = await self._docker.containers.create(config, name=container_name(dep.id))
            except aiodocker.DockerError as exc:
                raise LaunchError(f"cannot create the container: {exc.message}") from exc
            try:
                await container.start()
            except aiodocker.DockerError as exc:
                await _delete(container)
                raise LaunchError(_start_error(exc)) from exc
            info = await container.show()
            handle = RuntimeHandle(ref=info["Id"], base_url=self._base_url(info, kind), port=kind.container_port)
            self._watch(dep.id, info["Id"])
            log.info("started container %s (%s) for %s at %s", info["Id"][:12], image, dep.id, handle.base_url)
            return handle

    async def _compile_cache(self, dep: Deployment, image: str) -> tuple[list[str], dict[str, str]]:
        """The volume bind and environment that keep a vLLM's compile work, keyed by the image's
        id; a volume Docker will not make is logged and the engine starts without it."""
        if not compilecache.kept(dep):
            return [], {}
        try:
            image_id = (await self._docker.images.inspect(image))["Id"]
            bind, env = await self._caches.prepare(dep, image_id)
        except aiodocker.DockerError as exc:
            log.warning("no compile cache for %s: %s", dep.id, exc.message)
            return [], {}
        return [bind], env

    async def compile_cache(self, dep: Deployment) -> CacheReport | None:
        return await self._caches.report(dep.id) if compilecache.kept(dep) else None

    async def clear_compile_cache(self, deployment_id: str) -> None:
        await self._caches.clear(deployment_id)

    def _config(
        self, dep: Deployment, kind: EngineKind, image: str, cache: tuple[list[str], dict[str, str]] | None = None
    ) -> dict[str, Any]:
        port = kind.container_port
        cache_binds, cache_env = cache or ([], {})
        env = {**cache_env, **kind.extra_env(dep), **dep.env}
        host: dict[str, Any] = {
            "NetworkMode": self._settings.network or "bridge",
            "Binds": binds(dep, self._models_dir) + cache_binds,
            "RestartPolicy": {"Name": "no"},
        }
        shm = dep.shm_size or kind.shm_size
        if shm:
            host["ShmSize"] = _bytes(shm)
        if dep.placed_on is not None:  # a host with devices: the ones the deployer placed it on
            if dep.placed_on:
                host["DeviceRequests"] = [
                    {"Driver": "", "DeviceIDs": [str(d) for d in dep.placed_on], "Capabilities": [["gpu"]]}
                ]
        elif dep.gpus if dep.gpus is not None else kind.gpus:  # a pooled host: all its GPUs, as before
            host["DeviceRequests"] = [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]
        if not self._in_container():
            host["PortBindings"] = {f"{port}/tcp": [{"HostIp": self._settings.publish_host, "HostPort": ""}]}
        return {
            "Image": image,
            "Cmd": kind.container_cmd(dep, port),
            "Env": [f"{k}={v}" for k, v in env.items()],
            "Labels": {LABEL_MANAGED: "true", LABEL_DEPLOYMENT: dep.id, LABEL_INSTANCE: self._instance},
            "ExposedPorts": {f"{port}/tcp": {}},
            "HostConfig": host,
        }

    def _base_url(self, info: dict[str, Any], kind: EngineKind) -> str:
        port = kind.container_port
        settings = info.get("NetworkSettings") or {}
        if self._in_container():
            networks: dict[str, dict[str, Any]] = settings.get("Networks") or {}
            net: dict[str, Any] = networks.get(self._settings.network or "bridge") or next(iter(networks.values()), {})
            address = net.get("IPAddress")
            if not address:
                raise LaunchError("the container has no address on the engine network")
            return f"http://{address}:{port}"
        bindings = (settings.get("Ports") or {}).get(f"{port}/tcp") or []
        if not bindings:
            raise LaunchError(f"port {port} of the container was not published")
        return f"http://{bindings[0]['HostIp'] or '127.0.0.1'}:{bindings[0]['HostPort']}"

    async def _ensure_image(self, image: str, deployment_id: str) -> None:
        """Pull a missing image, reporting progress as events; a failed pull fails the start."""
        try:
            await self._docker.images.inspect(image)
            return
        except aiodocker.DockerError as exc:
            if exc.status != 404:
                raise LaunchError(f"cannot inspect image {image}: {exc.message}") from exc
        self._notify(deployment_id, f"Pulling image {image}")
        last = 0.0
        try:
            async for progress in self._docker.images.pull(image, stream=True):
                if "error" in progress:
                    raise LaunchError(f"cannot pull {image}: {progress['error']}")
                now = time.monotonic()
                if now - last >= PULL_EVENT_EVERY_S and progress.get("status"):
                    last = now
                    detail = progress.get("progress") or ""
                    self._notify(deployment_id, f"Pulling {image}: {progress['status']} {detail}".strip())
        except aiodocker.DockerError as exc:
            raise LaunchError(f"cannot pull {image}: {exc.message}") from exc
        self._notify(deployment_id, f"Pulled image {image}")

    # --- watching, stopping -------------------------------------------------------------------

    def _watch(self, deployment_id: str, container_id: str) -> None:
        self._exits[deployment_id] = None
        for tasks in (self._waiters, self._followers):
            old = tasks.pop(deployment_id, None)
            if old is not None:
                old.cancel()
        self._waiters[deployment_id] = asyncio.create_task(self._wait(deployment_id, container_id))
        self._output[deployment_id] = 0
        self._followers[deployment_id] = asyncio.create_task(self._count_output(deployment_id, container_id))

    async def _count_output(self, deployment_id: str, container_id: str) -> None:
        """Follow the container's output and count its bytes: a line such as llama-server's
        "server is listening" makes the readiness wait probe at once (deploy/readiness.py)."""
        try:
            stream = self._docker.containers.container(container_id).log(stdout=True, stderr=True, follow=True)
            async for chunk in stream:
                self._output[deployment_id] = self._output.get(deployment_id, 0) + len(chunk)
        except (aiodocker.DockerError, TimeoutError, OSError) as exc:
            log.debug("no longer following the output of %s: %s", deployment_id, exc)

    def output_size(self, deployment_id: str) -> int | None:
        return self._output.get(deployment_id)

    async def _wait(self, deployment_id: str, container_id: str) -> None:
        try:
            result = await self._docker.containers.container(container_id).wait()
            reason = f"exit code {result.get('StatusCode')}"
        except aiodocker.DockerError as exc:
            reason = "container removed" if exc.status == 404 else f"lost the container: {exc.message}"
        except (TimeoutError, OSError) as exc:
            reason = f"lost the Docker connection: {exc}"
        self._exits[deployment_id] = reason

    async def wait_exit(self, deployment_id: str) -> str:
        task = self._waiters.get(deployment_id)
        if task is None:
            return "not running"
        await asyncio.shield(task)
        return self._exits.get(deployment_id) or "not running"

    def exit_reason(self, deployment_id: str) -> str | None:
        if deployment_id not in self._exits:
            return "not running"
        return self._exits[deployment_id]

    async def stop(self, deployment_id: str, grace_s: float) -> None:
        async with self._lock(deployment_id):
            await self._remove_ours(deployment_id, grace_s)

    async def _remove_ours(self, deployment_id: str, grace_s: float = 0.0) -> None:
        """Stop (SIGTERM, then SIGKILL after the grace) and remove this deployment's containers."""
        waiter = self._waiters.pop(deployment_id, None)
        if waiter is not None:
            waiter.cancel()
        follower = self._followers.pop(deployment_id, None)
        if follower is not None:
            follower.cancel()
        self._output.pop(deployment_id, None)
        self._exits.pop(deployment_id, None)
        for container in await self._ours(deployment_id):
            try:
                await container.stop(t=int(round(grace_s)))
            except aiodocker.DockerError as exc:
                if exc.status not in (304, 404):
                    log.warning("stopping container of %s: %s", deployment_id, exc.message)
            await _delete(container)

    async def _ours(self, deployment_id: str | None = None) -> list[aiodocker.containers.DockerContainer]:
        """This instance's containers (of one deployment): labelled with its instance, or with no
        instance at all (an older dgxmm's) when they are of a deployment this instance knows."""
        labels = [f"{LABEL_MANAGED}=true"]
        if deployment_id is not None:
            labels.append(f"{LABEL_DEPLOYMENT}={deployment_id}")
        found = [
            c
            for c in await self._docker.containers.list(all=True, filters={"label": labels})
            if self._mine(c["Labels"] or {}, deployment_id is not None)
        ]
        if deployment_id is not None:  # also a same-named container (left by a crash mid-create)
            try:
                named = await self._docker.containers.get(container_name(deployment_id))
                labels_of = (named["Config"] or {}).get("Labels") or {}
                if (
                    labels_of.get(LABEL_MANAGED) == "true"
                    and self._mine(labels_of, True)
                    and named.id not in {c.id for c in found}
                ):
                    found.append(named)
            except aiodocker.DockerError:
                pass
        return list(found)

    async def usage(self, deployment_id: str) -> Usage | None:
        """The container's cgroup memory (its usage less the page cache it may drop, as
        ``docker stats`` counts it) and its processes (host pids, for NVML's per-process GPU
        memory)."""
        if deployment_id not in self._waiters:  # not running (or not started by this dgxmm)
            return None
        containers = await self._ours(deployment_id)
        if not containers:
            return None
        container = containers[0]
        try:
            stats = await container.stats(stream=False)
            top = await container.top()
        except aiodocker.DockerError:
            return None
        memory = (stats[0] if isinstance(stats, list) else stats).get("memory_stats") or {}
        detail = memory.get("stats") or {}
        cache = detail.get("inactive_file", detail.get("total_inactive_file", 0))
        titles = top.get("Titles") or []
        column = titles.index("PID") if "PID" in titles else 1
        pids = tuple(int(row[column]) for row in top.get("Processes") or [] if str(row[column]).isdigit())
        return Usage(max(0, int(memory.get("usage", 0)) - int(cache)), pids)

    async def leftovers(self, deployment_id: str) -> list[str]:
        """Containers of the deployment still there after its stop: removed by force. Under the
        deployment's lock, so a new start waits rather than have its container taken for one."""
        async with self._lock(deployment_id):
            if deployment_id in self._waiters:
                return []  # it runs (again)
            ended = []
            for container in await self._ours(deployment_id):
                ended.append(f"container {container.id[:12]}")
                await _delete(container)
            return ended

    def _mine(self, labels: dict[str, str], known_deployment: bool) -> bool:
        instance = labels.get(LABEL_INSTANCE)
        return instance == self._instance or (instance in (None, "") and known_deployment)

    async def logs(self, deployment_id: str, tail: int) -> list[str]:
        containers = await self._ours(deployment_id)
        if not containers or tail <= 0:
            return []
        try:
            chunks = await containers[0].log(stdout=True, stderr=True, tail=tail)
        except aiodocker.DockerError:
            return []
        return "".join(chunks).splitlines()[-tail:]

    async def adopt(self, dep: Deployment) -> RuntimeHandle | None:
        """The handle of this deployment's running container, watched from now on; its dead
        containers, a second running one and one it cannot reach are removed. Whether the
        container is kept is the deployer's call (it stops it otherwise)."""
        kind = engine_of(dep)
        handle = None
        async with self._lock(dep.id):
            for container in await self._ours(dep.id):
                info = await container.show()
                if handle is None and (info.get("State") or {}).get("Running"):
                    try:
                        handle = RuntimeHandle(
                            ref=info["Id"],
                            base_url=self._base_url(info, kind),
                            port=kind.container_port,
                            api_key=_key_of(dep, info, kind),
                        )
                    except LaunchError as exc:
                        log.warning("removing the container of %s: %s", dep.id, exc)
                    else:
                        self._watch(dep.id, info["Id"])
                        continue
                await _delete(container)
        return handle

    async def forget_others(self, known: set[str]) -> None:
        """Remove this instance's containers of deployments that no longer exist (a crash
        mid-remove). An unlabelled one of an unknown deployment may be another dgxmm's: kept."""
        for container in await self._ours():
            labels = container["Labels"] or {}
            dep_id = labels.get(LABEL_DEPLOYMENT, "")
            if dep_id not in known and labels.get(LABEL_INSTANCE) == self._instance:
                log.warning("removing container %s of unknown deployment %r", container.id[:12], dep_id)
                await _delete(container)

    async def close(self) -> None:
        for task in [*self._waiters.values(), *self._followers.values()]:
            task.cancel()
        await self._docker.close()


def _key_of(dep: Deployment, info: dict[str, Any], kind: EngineKind) -> str | None:
    """The key an adopted container's engine demands: the one recorded, else its environment's."""
    if dep.runtime_handle is not None and dep.runtime_handle.api_key:
        return dep.runtime_handle.api_key
    if kind.api_key_env is None:
        return None
    prefix = kind.api_key_env + "="
    env = (info.get("Config") or {}).get("Env") or []
    return next((item[len(prefix) :] for item in env if item.startswith(prefix)), None)


async def _delete(container: aiodocker.containers.DockerContainer) -> None:
    try:
        await container.delete(force=True)
    except aiodocker.DockerError as exc:
        if exc.status != 404:
            log.warning("cannot remove container %s: %s", container.id[:12], exc.message)


def _start_error(exc: aiodocker.DockerError) -> str:
    if "could not select device driver" in exc.message and "gpu" in exc.message:
        return NO_GPU_HINT
    return f"cannot start the container: {exc.message}"


def _bytes(size: str) -> int:
    units = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    unit = size[-1].lower()
    return int(size[:-1]) * units[unit] if unit in units else int(size)
