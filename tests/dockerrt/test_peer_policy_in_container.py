"""dgxmm itself in a container attached to two networks (one the decider's), with peer policy
``auto``: who may call the on-demand gateway, seen from real containers and from the host.

The dgxmm container is an imported empty image with the interpreter, the virtual environment
and the source bind-mounted read-only at their own paths, so it runs exactly this checkout.
"""

from __future__ import annotations

import io
import ipaddress
import json
import sys
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import dgxmm
from dockerrt.dockerd import DockerEnv, _free_subnets

pytestmark = [pytest.mark.timeout(180), pytest.mark.docker]

BASE_IMAGE = "dgxmm-test/base:1"
KEY = "sk-in-container"


def _binds(extra: list[str]) -> list[str]:
    paths = {sys.base_prefix, sys.prefix, str(Path(dgxmm.__file__).resolve().parents[1])}
    system = ["/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc/ssl"]
    args = []
    for path in [*system, *sorted(paths)]:
        if Path(path).exists():
            args += ["-v", f"{path}:{path}:ro"]
    for bind in extra:
        args += ["-v", bind]
    return args


def _import_base(env: DockerEnv) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for folder in ("tmp", "root", "etc", "proc", "sys", "dev"):
            info = tarfile.TarInfo(folder)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "tmp" else 0o755
            tar.addfile(info)
    env.cli("import", "-", BASE_IMAGE, input=buf.getvalue())


CALL = """
import sys, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], headers=dict(h.split(": ", 1) for h in sys.argv[2:]))
try:
    print(urllib.request.urlopen(req, timeout=10).status)
except urllib.error.HTTPError as exc:
    print(exc.code)
"""


class World:
    def __init__(
        self,
        env: DockerEnv,
        shared_net: ipaddress.IPv4Network,
        addresses: dict[str, str],
        deployment_id: str,
        token: str,
    ) -> None:
        self.env, self.shared, self.decider = env, "dgxmm-shared", "dgxmm-decider"
        self.token = token
        self.shared_net, self.addresses, self.deployment_id = shared_net, addresses, deployment_id
        self.dgxmm_ip = addresses[self.shared]

    def call_from(self, network: str, ip: str | None = None, *headers: str) -> int:
        """Call the gateway at its address on ``network`` from a container on that network."""
        url = f"http://{self.addresses[network]}:8090/dgxmm/ondemand/{self.deployment_id}/v1/models"
        args = [
            "run",
            "--rm",
            "--network",
            network,
            *(["--ip", ip] if ip else []),
            *_binds([]),
            BASE_IMAGE,
            sys.executable,
            "-c",
            CALL,
            url,
            f"Authorization: Bearer {KEY}",
            *headers,
        ]
        return int(self.env.cli(*args).splitlines()[-1])


@pytest.fixture(scope="module")
def world(docker_env: DockerEnv) -> Iterator[World]:
    env = docker_env
    _import_base(env)
    shared_net, decider_net = _free_subnets(2)
    gateway = shared_net.network_address + 254  # so that the first host address is a free one
    env.cli("network", "create", "--subnet", str(shared_net), "--gateway", str(gateway), "dgxmm-shared")
    env.cli("network", "create", "--subnet", str(decider_net), "dgxmm-decider")
    data = Path(tempfile.mkdtemp(prefix="dgxmm-in-docker-"))
    (data / "ondemand.key").write_text(KEY + "\n")
    (data / "dgxmm.toml").write_text(f"""
[server]
host = "0.0.0.0"
port = 8090
data_dir = "{data}/data"
[ondemand]
key_file = "{data}/ondemand.key"
allowed_cidrs = "auto"
decider_network = "dgxmm-decider"
[runtime]
kind = "docker"
docker_host = "unix:///var/run/docker.sock"
network = "dgxmm-shared"
[memory]
capacity_gib = 10
""")
    sock = env.host.removeprefix("unix://")
    own_ip = str(shared_net.network_address + 10)  # leave the first host address to a caller
    env.cli(
        "create",
        "--name",
        "dgxmm-under-test",
        "--network",
        "dgxmm-shared",
        "--ip",
        own_ip,
        *_binds([f"{data}:{data}", f"{sock}:/var/run/docker.sock"]),
        BASE_IMAGE,
        f"{sys.prefix}/bin/dgxmm",
        "serve",
        "--config",
        f"{data}/dgxmm.toml",
    )
    env.cli("network", "connect", "dgxmm-decider", "dgxmm-under-test")
    env.cli("start", "dgxmm-under-test")
    try:
        info = json.loads(env.cli("inspect", "dgxmm-under-test"))[0]
        addresses = {name: net["IPAddress"] for name, net in info["NetworkSettings"]["Networks"].items()}
        api = f"http://{addresses['dgxmm-shared']}:8090/dgxmm/api"
        deadline = time.monotonic() + 60
        while not (data / "data" / "admin-token").exists() or not _up(api):
            assert time.monotonic() < deadline, env.cli("logs", "dgxmm-under-test", check=False)
            time.sleep(0.2)
        token = (data / "data" / "admin-token").read_text().strip()
        body = json.dumps(
            {"name": "m", "engine": "command", "command": ["x", "{port}"], "memory_gib": 1, "mode": "on_demand"}
        ).encode()
        req = urllib.request.Request(
            f"{api}/deployments",
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        dep_id = json.loads(urllib.request.urlopen(req, timeout=10).read())["id"]
        yield World(env, shared_net, addresses, dep_id, token)
    finally:
        env.cli("rm", "-f", "dgxmm-under-test", check=False)
        env.cli("network", "rm", "dgxmm-shared", "dgxmm-decider", check=False)


def _up(api: str) -> bool:
    try:
        urllib.request.urlopen(f"{api}/openapi.json", timeout=2)
        return True
    except OSError:
        return False


def test_a_caller_on_the_shared_network_passes(world: World) -> None:
    assert world.call_from(world.shared, str(world.shared_net.network_address + 20)) == 200


def test_a_caller_on_the_decider_network_is_refused(world: World) -> None:
    assert world.call_from(world.decider) == 404


def test_the_first_host_address_of_the_subnet_is_refused(world: World) -> None:
    """Connections to a published host port arrive from there (docker-proxy, hairpin NAT)."""
    first = str(world.shared_net.network_address + 1)
    assert world.call_from(world.shared, first) == 404


def test_the_network_gateway_and_the_host_are_refused(world: World) -> None:
    """From the host, packets to the container come from the bridge: the gateway address."""
    url = f"http://{world.dgxmm_ip}:8090/dgxmm/ondemand/{world.deployment_id}/v1/models"
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 404


def test_forwarding_headers_are_refused_even_on_the_shared_network(world: World) -> None:
    caller = str(world.shared_net.network_address + 21)
    assert world.call_from(world.shared, caller) == 200
    assert world.call_from(world.shared, caller, "X-Forwarded-For: 10.0.0.1") == 404


def test_engines_are_reached_at_their_address_on_the_network(world: World) -> None:
    """dgxmm in a container publishes no port: it calls the engine on the shared network."""
    api = f"http://{world.dgxmm_ip}:8090/dgxmm/api"
    token = world.token
    body = json.dumps(
        {
            "name": "net",
            "engine": "llamacpp",
            "image": "dgxmm-test/llama:1",
            "model": "/models/tiny.gguf",
            "memory_gib": 1,
        }
    ).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    req = urllib.request.Request(f"{api}/deployments", data=body, method="POST", headers=headers)
    dep = json.loads(urllib.request.urlopen(req, timeout=10).read())
    deadline = time.monotonic() + 60
    while dep["state"] != "ready":
        assert dep["state"] == "starting" and time.monotonic() < deadline, dep
        time.sleep(0.3)
        req = urllib.request.Request(f"{api}/deployments/{dep['id']}", headers=headers)
        dep = json.loads(urllib.request.urlopen(req, timeout=10).read())
    host = dep["base_url"].removeprefix("http://").split(":")[0]
    assert ipaddress.ip_address(host) in world.shared_net
    assert world.env.cli("port", f"dgxmm-{dep['id']}") == ""  # nothing published
