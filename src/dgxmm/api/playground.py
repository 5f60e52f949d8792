"""``POST /api/deployments/{id}/playground``: try a model from the console. The chat goes through
the on-demand gateway exactly as a caller's would (the slot, a cold start, the memory queue with
its notice, the activity log), streamed back as the engine writes it; the on-demand key is added
here, on the server, so the browser never holds it.

The request is handed in-process to the gateway's one entrance (gateway/entrance.py), as the
console's kind of caller (``CONSOLE``: counted in the gateway's share like any request, and
exempt from the peer guard, for which the admin token stands in): an ``AsgiRequest`` over this
request's own ``send`` and ``receive``, so the answer's bytes go straight to the browser and the
browser leaving is a hang-up the gateway sees. What it calls it takes as Protocols (``DeploymentReader``,
``Keys``, ``Door``), not the deployer or the gateway themselves.
"""

from __future__ import annotations

import json
import secrets
from typing import Literal, Protocol

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from dgxmm.api.auth import require_admin
from dgxmm.api.ports import reader_of
from dgxmm.context import Context, ctx_of
from dgxmm.errors import Conflict
from dgxmm.gateway.asgirequest import AsgiRequest
from dgxmm.gateway.entrance import CONSOLE, Caller
from dgxmm.gateway.request import GatewayRequest
from dgxmm.records.deployment import DeploymentReader

router = APIRouter(prefix="/deployments", tags=["deployments"])
PEER = "console"  # the caller the gateway's log, metrics and activity name


class Keys(Protocol):
    """The on-demand key the server adds (the gateway's key file)."""

    def current(self) -> str | None: ...


class Door(Protocol):
    """The gateway's entrance, which the chat goes through as the console's kind of caller."""

    @property
    def prefix(self) -> str:
        """The gateway's path, ``{base}/ondemand``."""

    async def serve(self, req: GatewayRequest, caller: Caller = ...) -> None: ...


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=100_000)


class PlaygroundChat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: list[ChatMessage] = Field(min_length=1, max_length=200)
    max_tokens: int | None = Field(None, ge=1, le=32_768)
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)  # OpenAI's range; absent: the engine's


@router.post("/{deployment_id}/playground")
async def playground(
    deployment_id: str,
    body: PlaygroundChat,
    ctx: Context = Depends(ctx_of),
    deployments: DeploymentReader = Depends(reader_of),
    user: str = Depends(require_admin),
) -> Response:
    """A streamed chat completion (with its usage) from the deployment, through the gateway."""
    return chat(deployment_id, body, deployments, ctx.keys, ctx.entrance)


def chat(deployment_id: str, body: PlaygroundChat, records: DeploymentReader, keys: Keys, door: Door) -> Response:
    """The gateway's answer to the chat, as a request of the console's (the key added here)."""
    dep = records.get(deployment_id)
    key = keys.current()
    if key is None:
        raise Conflict("the on-demand gateway has no key configured ([ondemand] key_file): nothing can be sent")
    sent = {
        "model": dep.served_name,
        "messages": [m.model_dump() for m in body.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if body.max_tokens is not None:
        sent["max_tokens"] = body.max_tokens
    if body.temperature is not None:
        sent["temperature"] = body.temperature
    raw = json.dumps(sent).encode()
    path = f"{door.prefix}/{dep.id}/v1/chat/completions"
    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "client": (PEER, 0),
        "headers": [
            (b"authorization", b"Bearer " + key.encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
            (b"x-request-id", f"playground-{secrets.token_hex(6)}".encode()),
        ],
    }
    return ThroughGateway(door, scope, raw)


class ThroughGateway(Response):
    """The gateway's own answer, sent as it comes."""

    def __init__(self, door: Door, scope: Scope, body: bytes) -> None:
        super().__init__()
        self._door, self._scope, self._body = door, scope, body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        given = False

        async def inner_receive() -> Message:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": self._body, "more_body": False}
            return await receive()  # this request's own: http.disconnect when the browser leaves

        req = AsgiRequest(self._scope, inner_receive, send)
        try:
            await self._door.serve(req, CONSOLE)
        finally:
            req.close()
