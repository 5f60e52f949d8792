"""A real Docker engine for the docker runtime's tests: Debian's docker.io, our own dockerd.

The daemon gets its own socket, data and exec roots and its own default bridge, ``dgxt<pid>``
(created here on a free subnet, so another dockerd's ``docker0``, another helper's test run or the
host's own Docker, is never in the way nor touched), with iptables, masquerading and forwarding
off (test traffic stays on 127.0.0.1 and on the bridges this daemon makes). Images are made with
``docker import`` from local files: no registry.
"""

from __future__ import annotations

import io
import ipaddress
import os
import random
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dgxmm.demo.tiny_gguf import write_tiny_gguf

LLAMA_IMAGE = "dgxmm-test/llama:1"


@dataclass
class DockerEnv:
    host: str  # unix:///.../docker.sock
    network: str  # a user-defined network the engines join
    subnet: ipaddress.IPv4Network

    def cli(self, *args: str, check: bool = True, input: bytes | None = None) -> str:
        out = subprocess.run(
            ["docker", "-H", self.host, *args], capture_output=True, input=input, timeout=120, check=False
        )
        if check and out.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {out.stderr.decode()}")
        return out.stdout.decode().strip()

    def pause(self, container: str, tries: int = 5) -> None:
        """``docker pause``, again when runc's freezer gave up on a busy container (cgroup v1
        freezes by retrying for a moment, then says "unable to freeze"; a second try succeeds)."""
        for attempt in range(tries):
            out = subprocess.run(
                ["docker", "-H", self.host, "pause", container], capture_output=True, timeout=120, check=False
            )
            if out.returncode == 0:
                return
            if b"unable to freeze" not in out.stderr or attempt == tries - 1:
                raise AssertionError(f"docker pause {container}: {out.stderr.decode()}")

    def logs(self, container: str) -> str:
        """A container's whole output, stdout and stderr together."""
        out = subprocess.run(
            ["docker", "-H", self.host, "logs", container],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=True,
        )
        return out.stdout.decode("utf-8", "replace")


def _free_subnets(count: int) -> list[ipaddress.IPv4Network]:
    used = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True, check=True).stdout
    taken = [
        ipaddress.ip_network(word, strict=False)
        for line in used.splitlines()
        for word in line.split()[:1]
        if "/" in word
    ]
    rng = random.Random()
    out: list[ipaddress.IPv4Network] = []
    while len(out) < count:
        net = ipaddress.ip_network(f"10.{rng.randrange(100, 250)}.{rng.randrange(0, 250)}.0/24")
        if not any(net.overlaps(t) for t in taken + out):
            out.append(net)
    return out


BRIDGE_PREFIX = "dgxt"  # + the pid of the test process that made it (interface names: 15 chars)


def _remove_stale_bridges() -> None:
    """Bridges of this fixture whose test process is gone (a crashed run); live ones stay."""
    for path in Path("/sys/class/net").glob(f"{BRIDGE_PREFIX}[0-9]*"):
        pid = path.name.removeprefix(BRIDGE_PREFIX)
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["ip", "link", "del", path.name], capture_output=True, check=False)


def _make_bridge(name: str, subnet: ipaddress.IPv4Network) -> None:
    for args in (
        ["link", "add", name, "type", "bridge"],
        ["addr", "add", f"{subnet.network_address + 1}/{subnet.prefixlen}", "dev", name],
        ["link", "set", name, "up"],
    ):
        subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="session")
def docker_env() -> Iterator[DockerEnv]:
    if os.geteuid() != 0:
        pytest.skip("the docker tests start their own dockerd, which needs root (CI runs as root)")
    if not (shutil.which("dockerd") and shutil.which("docker")):
        pytest.skip("dockerd and docker are missing (apt-get install docker.io; .ci/run installs it)")
    _remove_stale_bridges()
    bridge = f"{BRIDGE_PREFIX}{os.getpid()}"
    bridge_net, engines_net = _free_subnets(2)
    _make_bridge(bridge, bridge_net)
    root = Path(tempfile.mkdtemp(prefix="dgxmm-dockerd-"))
    sock = f"unix://{root}/docker.sock"
    log = (root / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        [
            "dockerd",
            "--data-root",
            str(root / "data"),
            "--exec-root",
            str(root / "exec"),
            "--pidfile",
            str(root / "dockerd.pid"),
            "-H",
            sock,
            "--bridge",
            bridge,
            "--iptables=false",
            "--ip-masq=false",
            "--ip-forward=false",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    env = DockerEnv(sock, "dgxmm-engines", engines_net)
    try:
        deadline = time.monotonic() + 60
        while env.cli("version", check=False) == "" or "Server" not in env.cli("version", check=False):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"dockerd did not start: {(root / 'dockerd.log').read_text()[-2000:]}")
            time.sleep(0.2)
        env.cli("network", "create", "--subnet", str(engines_net), env.network)
        _import_llama_image(env)
        yield env
    finally:
        for cid in env.cli("ps", "-aq", check=False).split():
            env.cli("rm", "-f", cid, check=False)
        env.cli("network", "prune", "-f", check=False)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


def llama_server() -> str:
    path = os.environ.get("DGXMM_LLAMA_SERVER")
    if not path:
        pytest.skip("DGXMM_LLAMA_SERVER is not set: run through `make test`, which builds llama-server")
    return path


def _import_llama_image(env: DockerEnv) -> None:
    """llama-server, the libraries ldd lists and the tiny model, as an image whose entrypoint is
    llama-server (like llama.cpp's own server image)."""
    binary = llama_server()
    libs = [
        word
        for word in subprocess.run(["ldd", binary], capture_output=True, text=True, check=False).stdout.split()
        if word.startswith("/")
    ]
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_gguf(Path(tmp) / "tiny.gguf")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(binary, arcname="bin/llama-server")
            for lib in libs:
                tar.add(os.path.realpath(lib), arcname=lib.lstrip("/"))
            tar.add(model, arcname="models/tiny.gguf")
            for folder in ("tmp",):
                info = tarfile.TarInfo(folder)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777
                tar.addfile(info)
        env.cli("import", "--change", 'ENTRYPOINT ["/bin/llama-server"]', "-", LLAMA_IMAGE, input=buf.getvalue())
