"""Where dgxmm itself runs: its own container (if any) and the networks it is attached to.

Docker bind-mounts ``/etc/hostname``, ``/etc/hosts`` and ``/etc/resolv.conf`` from
``<data-root>/containers/<id>/`` into every container, so ``/proc/self/mountinfo`` names our
container id without guessing from the hostname (which users may set). The id is then confirmed
through the Docker API; a process on the host finds no such mount and is not in a container.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from functools import cache
from pathlib import Path

import aiodocker

from dgxmm.ondemand.peers import AttachedNetwork

log = logging.getLogger(__name__)

_MOUNT = re.compile(r"/containers/([0-9a-f]{64})/(?:hostname|hosts|resolv\.conf)\s")


def container_id_from(mountinfo: str) -> str | None:
    ids = {match.group(1) for match in _MOUNT.finditer(mountinfo)}
    return ids.pop() if len(ids) == 1 else None


@cache
def own_container_id(mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    try:
        return container_id_from(mountinfo.read_text())
    except OSError:
        return None


def in_container() -> bool:
    return own_container_id() is not None


class DockerNetworks:
    """The peer policy's network source when dgxmm can talk to Docker."""

    def __init__(self, docker: aiodocker.Docker, own_id: str | None = None) -> None:
        self._docker = docker
        self._own_id = own_id

    async def attached(self) -> list[AttachedNetwork] | None:
        own = self._own_id or own_container_id()
        if own is None:
            return None
        try:
            me = await self._docker.containers.get(own)
        except aiodocker.DockerError as exc:
            if exc.status == 404:  # a container of another Docker daemon: not one we can read
                log.warning("container %s is not known to this Docker daemon", own[:12])
                return None
            raise
        names = list(((me["NetworkSettings"] or {}).get("Networks") or {}).keys())
        networks = []
        for name in names:
            info = await self._docker.networks.get(name)
            data = await info.show()
            configs = (data.get("IPAM") or {}).get("Config") or []
            subnets = tuple(ipaddress.ip_network(c["Subnet"], strict=False) for c in configs if c.get("Subnet"))
            gateways = tuple(ipaddress.ip_address(c["Gateway"]) for c in configs if c.get("Gateway"))
            networks.append(AttachedNetwork(name, subnets, gateways))
        return networks
