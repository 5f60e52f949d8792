"""The gateway's peer policy (dgxmm.gateway.peers).

Spec (Gateway, "Peer policy"): with ``auto`` the subnets of the attached Docker networks are
allowed except the decider's network, minus each network's gateway addresses and the first host
address of each subnet; an explicit list is allowed minus the same exclusions; outside Docker
``auto`` allows nobody; until the first refresh nobody is allowed; one warning per distinct policy.
"""

from __future__ import annotations

import ipaddress
import logging

import pytest

from dgxmm.gateway import peers
from dgxmm.gateway.peers import AttachedNetwork, PeerPolicy, build_policy


def net(name: str, *subnets: str, gateways: tuple[str, ...] = ()) -> AttachedNetwork:
    return AttachedNetwork(
        name,
        tuple(ipaddress.ip_network(s) for s in subnets),
        tuple(ipaddress.ip_address(g) for g in gateways),
    )


APP = net("dgxmm_app", "172.18.0.0/16", gateways=("172.18.0.254",))
LLM = net("litellm_net", "10.50.0.0/24", gateways=("10.50.0.1",))
DECIDER = net("decider_net", "172.30.0.0/24", gateways=("172.30.0.1",))
ATTACHED = [APP, LLM, DECIDER]


# --- build_policy: auto --------------------------------------------------------------------------


def test_auto_allows_hosts_of_attached_subnets():
    policy = build_policy("auto", ATTACHED, "decider_net")
    assert policy.allows("172.18.0.5")
    assert policy.allows("172.18.200.9")
    assert policy.allows("10.50.0.7")


def test_auto_refuses_addresses_outside_attached_subnets():
    policy = build_policy("auto", ATTACHED, "decider_net")
    assert not policy.allows("192.168.1.10")
    assert not policy.allows("127.0.0.1")
    assert not policy.allows("172.19.0.5")


def test_auto_refuses_the_decider_network():
    policy = build_policy("auto", ATTACHED, "decider_net")
    assert not policy.allows("172.30.0.5")
    assert not policy.allows("172.30.0.200")


def test_auto_refuses_gateway_addresses_of_every_network():
    policy = build_policy("auto", ATTACHED, "decider_net")
    assert not policy.allows("172.18.0.254")  # a gateway that is not the first host
    assert not policy.allows("10.50.0.1")


def test_auto_refuses_first_host_address_of_every_subnet():
    # APP's gateway is .254, so .1 is refused only for being the subnet's first host address.
    policy = build_policy("auto", ATTACHED, "decider_net")
    assert not policy.allows("172.18.0.1")
    assert policy.allows("172.18.0.2")


def test_auto_refuses_first_host_of_every_subnet_of_a_multi_subnet_network():
    dual = net("dual", "172.20.0.0/24", "172.21.0.0/24")
    policy = build_policy("auto", [dual], None)
    assert not policy.allows("172.20.0.1")
    assert not policy.allows("172.21.0.1")
    assert policy.allows("172.20.0.2")
    assert policy.allows("172.21.0.2")


def test_auto_without_decider_network_allows_all_attached():
    policy = build_policy("auto", [APP, DECIDER], None)
    assert policy.allows("172.18.0.5")
    assert policy.allows("172.30.0.5")


def test_auto_with_unattached_decider_network_name_changes_nothing():
    policy = build_policy("auto", [APP], "decider_net")
    assert policy.allows("172.18.0.5")


def test_auto_with_no_attached_networks_allows_nobody():
    policy = build_policy("auto", [], None)
    assert not policy.allows("172.18.0.5")
    assert not policy.allows("10.0.0.1")


# --- build_policy: outside Docker ----------------------------------------------------------------


def test_outside_docker_auto_allows_nobody():
    policy = build_policy("auto", None, "decider_net")
    for address in ("127.0.0.1", "172.18.0.5", "10.50.0.7", "192.168.1.10", "::1"):
        assert not policy.allows(address)


def test_outside_docker_explicit_list_is_allowed_as_is():
    policy = build_policy(["10.0.0.0/8"], None, "decider_net")
    assert policy.allows("10.0.0.1")  # no attached subnet: no first-host exclusion
    assert policy.allows("10.1.2.3")
    assert not policy.allows("11.0.0.1")


# --- build_policy: explicit list -----------------------------------------------------------------


def test_explicit_list_allows_listed_cidrs():
    policy = build_policy(["192.168.5.0/24", "10.9.9.9/32"], ATTACHED, "decider_net")
    assert policy.allows("192.168.5.20")
    assert policy.allows("10.9.9.9")
    assert not policy.allows("10.9.9.10")


def test_explicit_list_does_not_allow_unlisted_attached_subnets():
    policy = build_policy(["192.168.5.0/24"], ATTACHED, "decider_net")
    assert not policy.allows("172.18.0.5")
    assert not policy.allows("10.50.0.7")


def test_explicit_list_refuses_gateways_even_when_covered():
    policy = build_policy(["172.16.0.0/12", "10.0.0.0/8"], ATTACHED, "decider_net")
    assert not policy.allows("172.18.0.254")
    assert not policy.allows("10.50.0.1")
    assert policy.allows("172.18.0.5")


def test_explicit_list_refuses_first_host_addresses_even_when_covered():
    policy = build_policy(["172.16.0.0/12"], ATTACHED, "decider_net")
    assert not policy.allows("172.18.0.1")
    assert policy.allows("172.18.0.2")


def test_explicit_list_refuses_decider_subnets_even_if_listed():
    policy = build_policy(["172.30.0.0/24", "172.18.0.0/16"], ATTACHED, "decider_net")
    assert not policy.allows("172.30.0.5")
    assert not policy.allows("172.30.0.200")
    assert policy.allows("172.18.0.5")


def test_explicit_list_accepts_host_bits_in_cidr():
    policy = build_policy(["192.168.5.7/24"], None, None)
    assert policy.allows("192.168.5.200")


# --- IPv6 -------------------------------------------------------------------------------------


V6 = net("v6net", "fd00:1::/64", gateways=("fd00:1::ffff",))
V6_DECIDER = net("v6decider", "fd00:2::/64", gateways=("fd00:2::1",))


def test_ipv6_auto_allows_attached_subnet():
    policy = build_policy("auto", [V6, V6_DECIDER], "v6decider")
    assert policy.allows("fd00:1::5")


def test_ipv6_refuses_gateway_and_first_host():
    policy = build_policy("auto", [V6, V6_DECIDER], "v6decider")
    assert not policy.allows("fd00:1::ffff")
    assert not policy.allows("fd00:1::1")


def test_ipv6_refuses_decider_subnet():
    policy = build_policy("auto", [V6, V6_DECIDER], "v6decider")
    assert not policy.allows("fd00:2::5")


def test_ipv6_explicit_list_minus_exclusions():
    policy = build_policy(["fd00::/16"], [V6, V6_DECIDER], "v6decider")
    assert policy.allows("fd00:1::5")
    assert policy.allows("fd00:9::5")
    assert not policy.allows("fd00:1::1")
    assert not policy.allows("fd00:2::5")


def test_ipv4_and_ipv6_do_not_mix():
    policy = build_policy("auto", [APP, V6], None)
    assert not policy.allows("::ffff:172.18.0.5")  # IPv4-mapped: not in an IPv4 subnet
    assert policy.allows("fd00:1::5")
    assert policy.allows("172.18.0.5")


# --- invalid peers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "peer",
    ["", "not-an-ip", "172.18.0", "172.18.0.256", "172.18.0.5:1234", "172.18.0.0/16", " 172.18.0.5", "unix:/tmp/sock"],
)
def test_invalid_peer_strings_are_refused(peer):
    policy = build_policy("auto", ATTACHED, "decider_net")
    assert not policy.allows(peer)


# --- PeerPolicy --------------------------------------------------------------------------------


class Source:
    def __init__(self, attached):
        self.attached_value = attached
        self.error: Exception | None = None
        self.calls = 0

    async def attached(self):
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.attached_value


def warnings_of(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "dgxmm.gateway.peers" and r.levelno == logging.WARNING]


async def test_peer_policy_allows_nobody_before_first_refresh():
    policy = PeerPolicy("auto", "decider_net", Source(ATTACHED), refresh_s=30)
    assert not policy.allows("172.18.0.5")
    assert not policy.allows("10.50.0.7")


async def test_peer_policy_allows_after_first_refresh():
    policy = PeerPolicy("auto", "decider_net", Source(ATTACHED), refresh_s=30)
    await policy.refresh()
    assert policy.allows("172.18.0.5")
    assert not policy.allows("172.30.0.5")


async def test_peer_policy_verdict_remembered_before_a_refresh_is_not_kept_after_it():
    policy = PeerPolicy("auto", "decider_net", Source(ATTACHED), refresh_s=30)
    assert not policy.allows("172.18.0.5")
    await policy.refresh()
    assert policy.allows("172.18.0.5")


async def test_peer_policy_remembers_a_bounded_number_of_verdicts(monkeypatch):
    monkeypatch.setattr(peers, "MAX_REMEMBERED", 3)
    policy = PeerPolicy("auto", "decider_net", Source(ATTACHED), refresh_s=30)
    await policy.refresh()
    for last in range(2, 12):
        assert policy.allows(f"172.18.0.{last}")
        assert len(policy._verdicts) <= 3
    assert not policy.allows("172.30.0.5")


async def test_peer_policy_refresh_picks_up_changed_networks():
    source = Source([APP])
    policy = PeerPolicy("auto", None, source, refresh_s=30)
    await policy.refresh()
    assert policy.allows("172.18.0.5")
    assert not policy.allows("10.50.0.7")
    source.attached_value = [LLM]
    await policy.refresh()
    assert not policy.allows("172.18.0.5")
    assert policy.allows("10.50.0.7")


async def test_peer_policy_keeps_previous_policy_when_source_raises(caplog):
    source = Source([APP])
    policy = PeerPolicy("auto", None, source, refresh_s=30)
    await policy.refresh()
    source.error = RuntimeError("docker is gone")
    with caplog.at_level(logging.WARNING, logger="dgxmm.gateway.peers"):
        result = await policy.refresh()
    assert policy.allows("172.18.0.5")
    assert result.allows("172.18.0.5")


async def test_peer_policy_source_error_before_first_refresh_allows_nobody(caplog):
    source = Source([APP])
    source.error = RuntimeError("docker is gone")
    policy = PeerPolicy("auto", None, source, refresh_s=30)
    with caplog.at_level(logging.WARNING, logger="dgxmm.gateway.peers"):
        await policy.refresh()
    assert not policy.allows("172.18.0.5")


async def test_peer_policy_warns_once_per_distinct_policy(caplog):
    source = Source(ATTACHED)
    policy = PeerPolicy("auto", "decider_net", source, refresh_s=30)
    with caplog.at_level(logging.WARNING, logger="dgxmm.gateway.peers"):
        await policy.refresh()
        await policy.refresh()
    assert len(warnings_of(caplog)) == 1


async def test_peer_policy_warns_again_when_policy_changes(caplog):
    source = Source(ATTACHED)
    policy = PeerPolicy("auto", "decider_net", source, refresh_s=30)
    with caplog.at_level(logging.WARNING, logger="dgxmm.gateway.peers"):
        await policy.refresh()
        await policy.refresh()
        source.attached_value = [APP, DECIDER]
        await policy.refresh()
        await policy.refresh()
    assert len(warnings_of(caplog)) == 2


async def test_peer_policy_outside_docker_auto_allows_nobody():
    policy = PeerPolicy("auto", None, Source(None), refresh_s=30)
    await policy.refresh()
    assert not policy.allows("127.0.0.1")
    assert not policy.allows("172.18.0.5")


async def test_peer_policy_explicit_list_excludes_attached_gateways():
    policy = PeerPolicy(["172.16.0.0/12"], "decider_net", Source(ATTACHED), refresh_s=30)
    await policy.refresh()
    assert policy.allows("172.18.0.5")
    assert not policy.allows("172.18.0.254")
    assert not policy.allows("172.18.0.1")
    assert not policy.allows("172.30.0.5")
