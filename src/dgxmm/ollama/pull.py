"""Ollama's ``POST /api/pull`` of a Hugging Face GGUF (``hf.co/ORG/REPO[:QUANT]``), through
dgxmm's model store, with Ollama's progress lines (issue 49 item 6).

A pull is an administrator's act in dgxmm (the admin API's ``POST /api/models``), so it takes the
admin token, not a caller key: without it the answer is 403 in Ollama's shape and nothing is asked
of the hub. The name picks the repository's GGUF files whose names carry the quantisation, in any
case (``Q4_K_M`` when none is given, Ollama's default for ``hf.co`` names), as the store's globs
over the repository's paths; any other name is 501 (dgxmm serves deployments, not Ollama's
library). The answer is Ollama's: NDJSON lines ``{"status": "pulling manifest"}``, then ``{"status":
"pulling <id>", "digest", "total", "completed"}`` while the store downloads (every ``TICK_S``),
``verifying sha256 digest``, ``writing manifest``, ``success``; or one ``{"error"}`` line. With
``"stream": false``, only the last line. The body is read within ``BODY_BYTES``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from collections.abc import AsyncIterator
from typing import Any, Protocol

from dgxmm.errors import InvalidInput, NotFound
from dgxmm.front.body import BodyTimeout, ClientGone
from dgxmm.gateway.request import GatewayRequest
from dgxmm.modelstore.record import ModelRecord, Status
from dgxmm.ollama.answers import error_line

BODY_BYTES = 64 * 1024  # a pull names a model: nothing longer is one
TICK_S = 0.5  # how often a downloading pull says how far it is
DEFAULT_QUANT = "Q4_K_M"
HF_NAME = re.compile(r"^(?:https://)?(?:hf\.co|huggingface\.co)/([\w.-]+/[\w.-]+)(?::([\w.-]+))?$")
JSON = (b"content-type", b"application/json")
NDJSON = (b"content-type", b"application/x-ndjson")


class Pulls(Protocol):
    """The model store, as a pull uses it."""

    async def pull(
        self, repo: str, revision: str, include: list[str], user: str | None, actor: str = "api"
    ) -> tuple[ModelRecord, bool]: ...

    def get(self, model: str) -> ModelRecord: ...


def hub_name(name: str) -> tuple[str, str] | None:
    """``(ORG/REPO, QUANT)`` of an ``hf.co`` name; None for any other name."""
    found = HF_NAME.match(name)
    if found is None:
        return None
    quant = found.group(2)
    return found.group(1), DEFAULT_QUANT if quant in (None, "latest") else quant


def quant_glob(quant: str) -> str:
    """The store's glob for the GGUF files of ``quant``, its letters in either case."""
    letters = "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.sub(r"([*?\[\]])", r"[\1]", c) for c in quant)
    return f"*{letters}*.gguf"


def is_admin(headers: list[tuple[bytes, bytes]], token: str) -> bool:
    given = next((v for k, v in headers if k == b"authorization"), b"")
    scheme, _, value = given.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), token.encode())


async def pull(req: GatewayRequest, store: Pulls, admin_token: str, body_timeout_s: float, refusal: str) -> None:
    """Answer one ``/api/pull``; ``refusal``: the 501 message for a name dgxmm does not pull."""
    try:
        raw = await req.body(BODY_BYTES, timeout_s=body_timeout_s)
    except ClientGone:
        return
    except BodyTimeout:
        await req.respond(408, [JSON, (b"connection", b"close")], error_line("the body made no progress"))
        return
    try:
        body = json.loads(raw) if raw is not None else None
    except (ValueError, RecursionError):
        body = None
    name = (body.get("model") or body.get("name")) if isinstance(body, dict) else None
    if not isinstance(body, dict) or not isinstance(name, str) or not name:
        await req.respond(400, [JSON], error_line('pull takes a JSON body naming a model: {"model": NAME}'))
        return
    found = hub_name(name)
    if found is None:
        await req.respond(501, [JSON], error_line(refusal))
        return
    if not is_admin(req.headers, admin_token):
        await req.respond(403, [JSON], error_line("a pull into dgxmm's model store takes its admin token"))
        return
    repo, quant = found
    try:
        record, _ = await store.pull(repo, "main", [quant_glob(quant)], user="admin", actor="ollama")
    except InvalidInput as exc:
        await req.respond(404, [JSON], error_line(f"pull model manifest: {exc.message}"))
        return
    if body.get("stream", True) is False:
        last = b""
        async for line in _progress(store, record):
            last = line
        status = 500 if b'"error"' in last else 200
        await req.respond(status, [JSON], last)
        return
    await req.start(200, [NDJSON])
    async for line in _progress(store, record):
        await req.write(line)
        if req.disconnected:
            return  # the pull goes on in the store: a client's hang-up does not cancel it
    await req.end()


async def _progress(store: Pulls, record: ModelRecord) -> AsyncIterator[bytes]:
    """Ollama's lines for a pull the store began (or found done), until it ends."""
    yield _line({"status": "pulling manifest"})
    digest = f"sha256:{record.files[0].sha256}" if record.files and record.files[0].sha256 else record.id
    while record.status is Status.DOWNLOADING:
        total = record.bytes_total
        yield _line(
            {"status": f"pulling {record.id}", "digest": digest, "total": total, "completed": record.bytes_done}
        )
        await asyncio.sleep(TICK_S)
        try:
            record = store.get(record.id)
        except NotFound:  # deleted through the admin API meanwhile
            yield error_line("the pull was removed from dgxmm's model store")
            return
    if record.status is not Status.READY:
        yield error_line(f"pull of {record.repo}: {record.error or record.status.value}")
        return
    total = record.bytes_total
    yield _line({"status": f"pulling {record.id}", "digest": digest, "total": total, "completed": total})
    for status in ("verifying sha256 digest", "writing manifest", "success"):
        yield _line({"status": status})


def _line(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode() + b"\n"
