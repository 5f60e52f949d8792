"""The peer policy: which raw TCP peers may call the on-demand gateway.

``allowed_cidrs = "auto"`` allows the subnets of the Docker networks dgxmm's own container is
attached to; an explicit list allows what it names. Either way the decider's network, each
attached network's gateway addresses and the first host address of each attached subnet are
refused: connections to a published host port arrive from those (docker-proxy, hairpin NAT), so
the host and the LAN never pass. Until the first refresh nobody is allowed.

Where the attached networks come from is a seam (``NetworkSource``): outside Docker there are
none, and ``auto`` then allows nobody.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

log = logging.getLogger(__name__)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class AttachedNetwork:
    name: str
    subnets: tuple[IPNetwork, ...]
    gateways: tuple[IPAddress, ...]


class NetworkSource(Protocol):
    async def attached(self) -> list[AttachedNetwork] | None:
        """The networks dgxmm's own container is attached to; None when not in a container."""


class NoContainer:
    """dgxmm runs directly on the host: no attached networks."""

    async def attached(self) -> list[AttachedNetwork] | None:
        return None


@dataclass(frozen=True)
class Policy:
    allowed: tuple[IPNetwork, ...]
    refused_networks: tuple[IPNetwork, ...]
    refused_addresses: frozenset[IPAddress]

    def allows(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if ip in self.refused_addresses or any(ip in net for net in self.refused_networks):
            return False
        return any(ip in net for net in self.allowed)

    def describe(self) -> str:
        allowed = ", ".join(map(str, self.allowed)) or "nobody"
        refused = sorted(map(str, self.refused_addresses)) + list(map(str, self.refused_networks))
        return f"allowed: {allowed}; refused: {', '.join(refused) or 'none'}"


MAX_REMEMBERED = 4096  # addresses whose verdict is remembered; more clears the memory

NOBODY = Policy((), (), frozenset())


def build_policy(
    setting: Literal["auto"] | Sequence[str],
    attached: list[AttachedNetwork] | None,
    decider_network: str | None,
) -> Policy:
    """The policy for ``setting`` given the attached networks (a pure function)."""
    networks = attached or []
    decider = [net for net in networks if decider_network and net.name == decider_network]
    others = [net for net in networks if net not in decider]
    refused_networks = tuple(subnet for net in decider for subnet in net.subnets)
    refused: set[IPAddress] = set()
    for net in networks:
        refused.update(net.gateways)
        for subnet in net.subnets:
            if subnet.num_addresses > 2:
                refused.add(subnet.network_address + 1)
    if setting == "auto":
        allowed = tuple(subnet for net in others for subnet in net.subnets)
    else:
        allowed = tuple(ipaddress.ip_network(cidr, strict=False) for cidr in setting)
    return Policy(allowed, refused_networks, frozenset(refused))


def _setting_text(setting: Literal["auto"] | Sequence[str]) -> str:
    return f"allowed_cidrs = {setting if setting == 'auto' else list(setting)}"


class PeerPolicy:
    """Holds the current policy and refreshes it; logs once per distinct policy. ``in_force``
    says in one line which setting and which networks the current policy comes from."""

    def __init__(
        self,
        setting: Literal["auto"] | Sequence[str],
        decider_network: str | None,
        source: NetworkSource,
        refresh_s: float,
        serves: str = "on-demand gateway",
    ) -> None:
        self._setting = setting
        self._serves = serves  # named in the log line: the gateway, or the unauthenticated scrape
        self._decider = decider_network
        self._source = source
        self._refresh_s = refresh_s
        self.policy = NOBODY
        self._verdicts_of = NOBODY
        self._verdicts: dict[str, bool] = {}
        self._described: str | None = None
        self.in_force = f"{_setting_text(setting)}: nobody until the first refresh"

    def allows(self, address: str) -> bool:
        """The policy's verdict, remembered per address until the policy changes (the gateway
        asks on every request, and parsing the address costs more than the rest of the check)."""
        policy = self.policy
        if self._verdicts_of is not policy:
            self._verdicts_of, self._verdicts = policy, {}
        verdict = self._verdicts.get(address)
        if verdict is None:
            if len(self._verdicts) >= MAX_REMEMBERED:
                self._verdicts.clear()
            verdict = self._verdicts[address] = policy.allows(address)
        return verdict

    async def refresh(self) -> Policy:
        try:
            attached = await self._source.attached()
        except Exception:
            log.exception("cannot read the attached networks; keeping the previous peer policy")
            return self.policy
        self.policy = build_policy(self._setting, attached, self._decider)
        described = self.policy.describe()
        where = "outside Docker" if attached is None else f"{len(attached)} attached networks"
        self.in_force = f"{_setting_text(self._setting)}, {where}: {described}"
        if described != self._described:
            self._described = described
            log.warning("%s peer policy (%s, %s): %s", self._serves, self._setting, where, described)
        return self.policy

    async def run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._refresh_s)
