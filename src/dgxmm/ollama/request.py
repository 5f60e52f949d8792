"""An Ollama request as the gateway serves it: one of the router's (``/v1``), its body
translated as the gateway reads it and its answer translated as the gateway writes it.

The gateway runs every check on it as on any ``/v1`` request (peer guard, key or the keyless
caller key, rate limit, body limit, the caller key's models, its slot, cold start and queue,
usage, the activity log labelled ``ollama``): it is the same object to the gateway as the
caller's ``AsgiRequest``, which it wraps, but for ``path`` (the router's route it stands for) and
the ``Dialect``. What the body asks picks the endpoint (``translate``: a raw prompt is a
completion, an empty one a load or an unload), told to the gateway through ``ex.route``.

The answer: a stream is translated chunk by chunk (``answers.StreamTranslator``); anything else is
held whole and translated at its end; an error, dgxmm's or the engine's, becomes Ollama's
``{"error": "..."}`` with the same status, or the stream's last line once it began.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from dgxmm.front.body import BodyBudget
from dgxmm.gateway.exchange import KEPT_HEADER, Exchange
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.request import Dialect, GatewayRequest
from dgxmm.gateway.routes import LOAD, UNLOAD
from dgxmm.gateway.standin import StandIn
from dgxmm.ollama import answers, translate
from dgxmm.ollama.answers import StreamTranslator, Times

NDJSON = (b"content-type", b"application/x-ndjson")
JSON = (b"content-type", b"application/json")
_KEPT = frozenset({b"x-request-id", b"retry-after", b"connection", KEPT_HEADER})  # of the gateway's headers

# What a route does with a whole 200 answer: (answer, its request) -> Ollama's answer.
Whole = Callable[[dict[str, Any], "OllamaRequest"], Awaitable[dict[str, Any]]]


class NotListed(Exception):
    """A read route's model is not among those the caller may see: 404 with this message."""


class OllamaRequest(StandIn):
    def __init__(
        self,
        inner: GatewayRequest,
        kind: str,
        routed: str,
        dialect: Dialect,
        whole: Whole | None = None,
        early: bytearray | None = None,
        context: Callable[[str, Exchange], int | None] | None = None,
    ) -> None:
        method = "POST" if kind in ("chat", "generate", "embed", "embeddings") else "GET"
        super().__init__(inner, method, routed, dialect)
        self.kind = kind  # "chat", "generate", "embed", "embeddings", or a read route ("tags"...)
        self.model = ""  # the name the caller gave (answers repeat it)
        self.stream = False
        self._whole = whole
        self._early = early  # a body read before the gateway's checks (show's)
        self._context = context  # the engine's context of a model the caller may use, where known
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._held: list[bytes] = []
        self._stream: StreamTranslator | None = None

    async def body(
        self, limit: int, *, timeout_s: float | None = None, budget: BodyBudget | None = None
    ) -> bytearray | None:
        if self._early is not None:
            return bytearray()  # the body was read; the gateway is given none
        raw = await self.inner.body(limit, timeout_s=timeout_s, budget=budget)
        if raw is None or self.method == "GET":
            return raw
        try:
            body = translate.parse(raw)
            if self.kind in ("embed", "embeddings"):
                done = translate.embed(body, legacy=self.kind == "embeddings")
            else:
                model, ex = translate.model_of(body), self.exchange
                context = self._context(model, ex) if self._context is not None and ex is not None else None
                done = (translate.chat if self.kind == "chat" else translate.generate)(body, context)
        except translate.BadInput as exc:
            raise Refused(exc.status, "invalid_request", exc.message) from None
        self.model, self.stream = done.model, done.stream
        out = done.body
        if out is None:  # only a load, or with keep_alive 0 an unload
            out = {"model": done.model}
            endpoint = UNLOAD if done.keep_alive_s == 0 else LOAD
        else:
            endpoint = done.endpoint
        if self.exchange is not None:
            self.exchange.route = endpoint
            self.exchange.keep_alive = done.keep_alive_s  # (the gateway checks the key's right to it)
        new = bytearray(json.dumps(out).encode())
        if budget is not None:
            budget.resize(len(raw), len(new))
        return new

    def times(self) -> Times:
        ex = self.exchange
        now = time.monotonic()
        if ex is None:
            return Times(now, 0.0, 0.0, now)
        return Times(ex.arrival, ex.slot_at if ex.cold else 0.0, ex.engine_byte, now)

    def _streams(self, status: int) -> bool:
        return self.stream and status == 200 and self.kind in ("chat", "generate")

    async def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.response_started = True
        await self._answer(status, headers, body)

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.response_started = True
        self._status = status
        if self._streams(status):
            self._stream = StreamTranslator(self.kind, self.model)
            await self.inner.start(200, [NDJSON, *self._kept(headers)])
        else:
            self._headers = headers

    async def write(self, chunk: bytes) -> None:
        if self._stream is not None:
            await self.inner.write(self._stream.feed(chunk))
        elif chunk:
            self._held.append(chunk)

    async def end(self, last: bytes = b"") -> None:
        if self._stream is not None:
            lines = self._stream.feed(last)
            await self.inner.end(lines + self._stream.final(self.times()))
            return
        self._held.append(last)
        await self._answer(self._status, self._headers, b"".join(self._held))

    def cut(self) -> None:
        self.inner.cut()

    @staticmethod
    def _kept(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        return [(k, v) for k, v in headers if k in _KEPT]

    async def _answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole answer, translated: an error's message, or the route's answer."""
        kept = self._kept(headers)
        if status != 200:
            await self.inner.respond(status, [JSON, *kept], answers.error_line(answers.error_text(body)))
            return
        if self._streams(status) and not body.lstrip().startswith(b"{"):  # an event stream sent whole, in one read
            stream = StreamTranslator(self.kind, self.model)
            await self.inner.respond(200, [NDJSON, *kept], stream.feed(body) + stream.final(self.times()))
            return
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict):
            await self.inner.respond(502, [JSON, *kept], answers.error_line("the engine's answer is not a JSON object"))
            return
        try:
            out = await self._translated(answer)
        except NotListed as exc:
            await self.inner.respond(404, [JSON, *kept], answers.error_line(str(exc)))
            return
        framing = NDJSON if self.stream and self.kind in ("chat", "generate") else JSON
        await self.inner.respond(200, [framing, *kept], json.dumps(out).encode() + b"\n")

    async def _translated(self, answer: dict[str, Any]) -> dict[str, Any]:
        if self._whole is not None:
            return await self._whole(answer, self)
        if self.kind in ("embed", "embeddings"):
            return answers.embed_answer(answer, self.model, self.times(), legacy=self.kind == "embeddings")
        if "done_reason" in answer and "choices" not in answer:  # a load or an unload (``gateway.loading``)
            return answers.loaded_answer(self.kind, self.model, str(answer["done_reason"]))
        return answers.chat_answer(answer, self.kind, self.model, self.times())
