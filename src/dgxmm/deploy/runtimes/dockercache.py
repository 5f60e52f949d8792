"""The docker runtime's kept compile work: a named volume per vLLM deployment (deploy/compilecache.py).

A volume, not a directory of dgxmm's data: when dgxmm runs in a container its data directory is
its own volume, and a path in it names nothing on the Docker host. Each volume is named
``dgxmm-compile-<deployment id>-<key>``, keyed by the model, the image's id (not its tag:
``latest`` moves) and the deployment's arguments, labelled with the deployment and this dgxmm's
instance, and mounted at ``/var/cache/dgxmm-compile`` where ``VLLM_CACHE_ROOT`` points. A start
with a new key removes the deployment's older volumes (its container is gone by then).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import aiodocker

from dgxmm.deploy.compilecache import CacheReport, Entry, cache_env, cache_key
from dgxmm.errors import DgxmmError
from dgxmm.records.deployment import Deployment

log = logging.getLogger(__name__)

MOUNT = "/var/cache/dgxmm-compile"
LABEL_CACHE = "dgxmm.compile-cache"  # the entry's key
# The labels of everything the docker runtime makes for a deployment (its containers too).
LABEL_DEPLOYMENT = "dgxmm.deployment"
LABEL_INSTANCE = "dgxmm.instance"
JSON = {"Content-Type": "application/json"}


class DockerUnavailable(DgxmmError):
    """Docker did not answer a question about the compile cache volumes (503)."""

    status = 503
    code = "docker_unavailable"


def volume_name(deployment_id: str, key: str) -> str:
    return f"dgxmm-compile-{deployment_id}-{key}"


class VolumeCaches:
    def __init__(self, docker: aiodocker.Docker, instance: str) -> None:
        self._docker = docker
        self._instance = instance

    async def _volumes(self, deployment_id: str) -> list[dict[str, Any]]:
        labels = [LABEL_CACHE, f"{LABEL_DEPLOYMENT}={deployment_id}", f"{LABEL_INSTANCE}={self._instance}"]
        found: dict[str, Any] = await self._ask("volumes", {"filters": json.dumps({"label": labels})})
        return list(found.get("Volumes") or [])

    async def _ask(self, path: str, params: dict[str, Any]) -> Any:
        try:
            return await self._docker._query_json(path, params=params)
        except (aiodocker.DockerError, OSError, TimeoutError) as exc:
            raise DockerUnavailable(f"Docker did not answer about the compile cache volumes: {exc}") from exc

    async def prepare(self, dep: Deployment, image_id: str) -> tuple[str, dict[str, str]]:
        """The volume for this start (made if new; the deployment's stale ones removed) as a bind,
        and the environment that points the engine at it."""
        key = cache_key(dep, image_id)
        name = volume_name(dep.id, key)
        for volume in await self._volumes(dep.id):
            if volume["Name"] != name:
                await self._delete(volume["Name"])
        labels = {LABEL_CACHE: key, LABEL_DEPLOYMENT: dep.id, LABEL_INSTANCE: self._instance}
        await self._docker._query_json(
            "volumes/create", "POST", data=json.dumps({"Name": name, "Labels": labels}), headers=JSON
        )
        return f"{name}:{MOUNT}", cache_env(MOUNT)

    async def report(self, deployment_id: str) -> CacheReport:
        """The deployment's volumes and their sizes as Docker counts them (``docker system df``);
        a size Docker has not counted reads 0."""
        names = {v["Name"]: v["Labels"].get(LABEL_CACHE, "") for v in await self._volumes(deployment_id)}
        usage: dict[str, Any] = await self._ask("system/df", {"type": "volume"})
        sizes = {v["Name"]: (v.get("UsageData") or {}).get("Size", 0) for v in usage.get("Volumes") or []}
        entries = tuple(Entry(key, max(int(sizes.get(name, 0)), 0)) for name, key in sorted(names.items()))
        where = ", ".join(sorted(names)) or volume_name(deployment_id, "<key>")
        return CacheReport(where, entries)

    async def clear(self, deployment_id: str) -> None:
        for volume in await self._volumes(deployment_id):
            await self._delete(volume["Name"])

    async def _delete(self, name: str) -> None:
        try:
            async with self._docker._query(f"volumes/{name}", "DELETE"):
                pass
        except aiodocker.DockerError as exc:  # in use by a container not removed yet: kept
            log.warning("cannot remove compile cache volume %s: %s", name, exc.message)
