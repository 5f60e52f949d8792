"""The peer policy's network source when dgxmm can talk to Docker: the networks dgxmm's own
container is attached to, with their subnets and gateways, read through the Docker API."""

from __future__ import annotations

import ipaddress
import logging

import aiodocker

from dgxmm.deploy.runtimes.dockerself import own_container_id
from dgxmm.gateway.peers import AttachedNetwork

log = logging.getLogger(__name__)


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
