"""What the soak runs: ``dgxmm serve`` as users run it (a child process, tests/dgxmm_process.py),
three llama-server deployments on the tiny model with memory for two of them, and two test-engine
deployments: ``busy``, whose health check takes 8 s while it answers (it must never be failed),
and ``faulty``, the one whose engine the chaos kills and stops."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from conftest import KEY, engine_command
from dgxmm_process import Dgxmm

from dgxmm.demo.tiny_gguf import write_tiny_gguf

CAPACITY_GIB = 4.0
LLAMA_GIB = 1.5  # three of them: two fit beside the test engines, the third makes room
ENGINE_GIB = 0.4
HEALTH_INTERVAL_S = 0.5
HEALTH_FAILURES = 3
STOP_GRACE_S = 3.0
# How long a hung engine can go unnoticed (docs/deployer.md, "Watchdog").
HANG_BOUND_S = (HEALTH_FAILURES + 1) * (HEALTH_INTERVAL_S + min(5.0, HEALTH_INTERVAL_S))
CALLER_ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
BUSY_REPLY = " ".join(f"busy{i}" for i in range(24))


@dataclass(frozen=True)
class Deployments:
    llamas: tuple[str, ...]
    busy: str
    faulty: str
    names: dict[str, str]  # id -> name

    @property
    def all(self) -> tuple[str, ...]:
        return (*self.llamas, self.busy, self.faulty)


class Fleet:
    def __init__(self, root: Path, llama_server: str) -> None:
        self.root = root
        self.model = write_tiny_gguf(root / "tiny.gguf")
        self.dgxmm = Dgxmm(
            root,
            server={"log_level": "info", "shutdown_grace_s": 5},
            memory={"capacity_gib": CAPACITY_GIB},
            deployer={
                "health_interval_s": HEALTH_INTERVAL_S,
                "health_failures": HEALTH_FAILURES,
                "stop_grace_s": STOP_GRACE_S,
                "start_timeout_s": 60,
                "metrics_interval_s": 1,
            },
            ondemand={
                "allowed_cidrs": ["127.0.0.2/31", "127.0.0.4/31"],
                "idle_timeout_min_s": 1,
                "idle_timeout_s": 6,
                "queue_timeout_s": 60,
                "key_check_interval_s": 0.2,
                "reaper_interval_s": 1,
                "stop_settle_s": 2,
            },
            engines={"llamacpp_bin": llama_server},
        )
        self.key = KEY
        self.rotations = 0

    @property
    def gateway(self) -> str:
        return self.dgxmm.gateway

    @property
    def pid(self) -> int:
        assert self.dgxmm.proc is not None
        return self.dgxmm.proc.pid

    def create(self) -> Deployments:
        """The five deployments, all on demand and stopped (their first requests start them)."""
        ids: dict[str, str] = {}
        for name in ("llama-a", "llama-b", "llama-c"):
            ids[name] = self.dgxmm.create(
                name=name,
                engine="llamacpp",
                model=str(self.model),
                memory_gib=LLAMA_GIB,
                mode="on_demand",
                args=["-c", "2048", "-np", "4"],
            )["id"]
        ids["busy"] = self.dgxmm.create(
            name="busy",
            engine="command",
            memory_gib=ENGINE_GIB,
            mode="on_demand",
            idle_timeout_s=3600,
            command=engine_command("--busy-health-delay", "8", "--chunk-delay", "0.1", "--reply", BUSY_REPLY),
        )["id"]
        ids["faulty"] = self.dgxmm.create(
            name="faulty",
            engine="command",
            memory_gib=ENGINE_GIB,
            mode="on_demand",
            command=engine_command("--chunk-delay", "0.05"),
        )["id"]
        return Deployments(
            tuple(ids[n] for n in ("llama-a", "llama-b", "llama-c")),
            ids["busy"],
            ids["faulty"],
            {dep_id: name for name, dep_id in ids.items()},
        )

    def rotate_key(self) -> str:
        """Write a new on-demand key (as an operator would: a new file moved into place)."""
        self.rotations += 1
        new = f"sk-soak-rotated-{self.rotations}"
        path = self.root / "ondemand.key"
        tmp = path.with_suffix(".new")
        tmp.write_text(new + "\n")
        tmp.chmod(0o600)
        os.replace(tmp, path)
        return new

    def admin(self, method: str, path: str, **kw: Any) -> httpx.Response:
        return self.dgxmm.call(method, path, **kw)
