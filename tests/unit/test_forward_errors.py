"""The gateway's 502 names the deployment and the kind of failure, never the engine's address."""

from __future__ import annotations

import json
import socket
from typing import Any

from dgxmm.deploy.models import Deployment, RuntimeHandle, State
from dgxmm.ondemand.forward import Forwarder
from dgxmm.ondemand.upstream import UpstreamClients
from dgxmm.settings import OndemandSettings
from dgxmm.telemetry.exchange import Exchange


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


async def test_unreachable_engine_502_does_not_show_its_address() -> None:
    port = closed_port()
    dep = Deployment(id="d1", name="tiny", served_name="tiny", engine="command", memory_gib=1, state=State.READY,
                     runtime_handle=RuntimeHandle(ref="1", base_url=f"http://127.0.0.1:{port}", port=port))  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    clients = UpstreamClients(OndemandSettings())
    scope = {"type": "http", "method": "POST", "headers": [], "query_string": b""}
    try:
        ex = Exchange(0.0, "r-1", "127.0.0.2")
        await Forwarder(clients).forward(scope, send, dep, "chat/completions", b"{}", ex)
    finally:
        await clients.close()
    assert sent[0]["status"] == 502 and (b"x-request-id", b"r-1") in sent[0]["headers"]
    assert (ex.status, ex.code) == (502, "ondemand_upstream_error")
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "ondemand_upstream_error"
    assert error["message"].startswith("engine unreachable: tiny (")
    assert "127.0.0.1" not in error["message"] and str(port) not in error["message"]
