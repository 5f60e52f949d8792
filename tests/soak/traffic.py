"""The soak's callers: mixed streaming and non-streaming chat completions from several peers, some
hanging up on purpose, each request's end recorded as an ``Outcome``.

The llama models take turns in pairs (``hot``): on a box with memory for two of the three, a
model that gets steady traffic is never idle, so under the seed's make-room rule the third would
wait for ever (swap scheduling is issue 28's). A pair changes every ``TURN_S``; the model left
out idles out and makes room. ``busy`` and ``faulty`` are called all along.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from fleet import CALLER_ADDRESSES, Deployments

TURN_S = 20.0
STREAM_SHARE = 0.5
HANGUP_SHARE = 0.1  # of the requests: the caller goes away mid-answer (or mid-wait)


@dataclass
class Outcome:
    caller: int
    deployment: str
    stream: bool
    began: float  # time.monotonic()
    ended: float = 0.0
    status: int = 0  # 0: no answer head came
    code: str | None = None  # dgxmm's (or the engine's) error code: the JSON envelope's or the SSE error event's
    kind: str = "ok"  # ok, error (an error answer), stream_error (an SSE error event), cut, no_answer, hangup
    ttfb: float | None = None
    first_byte_at: float | None = None  # time.time() of the first body byte (for the cold-start overhead)
    detail: str = ""
    began_at: float = field(default_factory=time.time)

    @property
    def failed(self) -> bool:
        return self.kind not in ("ok", "hangup")


@dataclass
class Callers:
    gateway: str
    deps: Deployments
    key: Callable[[], str]  # the key callers send now (the soak switches it after a rotation)
    count: int
    seed: int = 1
    outcomes: list[Outcome] = field(default_factory=list)

    def hot(self, now: float, began: float) -> tuple[str, str]:
        """The pair of llama models in use now."""
        turn = int((now - began) // TURN_S) % len(self.deps.llamas)
        llamas = self.deps.llamas
        return llamas[turn], llamas[(turn + 1) % len(llamas)]

    async def run(self, stop: asyncio.Event) -> None:
        began = time.monotonic()
        await asyncio.gather(*(self._caller(i, stop, began) for i in range(self.count)))

    async def _caller(self, index: int, stop: asyncio.Event, began: float) -> None:
        rng = random.Random(self.seed * 1000 + index)
        transport = httpx.AsyncHTTPTransport(local_address=CALLER_ADDRESSES[index % len(CALLER_ADDRESSES)])
        async with httpx.AsyncClient(
            base_url=self.gateway, transport=transport, timeout=httpx.Timeout(120, connect=5)
        ) as client:
            while not stop.is_set():
                roll = rng.random()
                if roll < 0.6:
                    dep = rng.choice(self.hot(time.monotonic(), began))
                else:
                    dep = self.deps.busy if roll < 0.8 else self.deps.faulty
                stream = rng.random() < STREAM_SHARE
                hangup = rng.random() < HANGUP_SHARE
                out = Outcome(index, dep, stream, time.monotonic())
                self.outcomes.append(out)
                await self._one(client, out, rng.randint(8, 48), hangup)
                out.ended = time.monotonic()
                await asyncio.sleep(rng.uniform(0.02, 0.2))

    async def _one(self, client: httpx.AsyncClient, out: Outcome, max_tokens: int, hangup: bool) -> None:
        body: dict[str, Any] = {
            "model": self.deps.names[out.deployment],
            "stream": out.stream,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hello there"}],
        }
        headers = {"Authorization": f"Bearer {self.key()}"}
        path = f"/{out.deployment}/v1/chat/completions"
        try:
            if not out.stream:
                call = client.post(path, json=body, headers=headers)
                if hangup:  # the caller gives up after a moment (mid-wait or mid-generation)
                    try:
                        resp = await asyncio.wait_for(call, 0.05)
                    except TimeoutError:
                        out.kind = "hangup"
                        return
                else:
                    resp = await call
                out.status, out.ttfb = resp.status_code, time.monotonic() - out.began
                if resp.status_code != 200:
                    out.kind, out.code, out.detail = "error", _code(resp.content), resp.text[:200]
                elif not resp.json().get("choices"):
                    out.kind, out.detail = "error", "an answer without choices"
                return
            async with client.stream("POST", path, json=body, headers=headers) as resp:
                out.status, out.ttfb = resp.status_code, time.monotonic() - out.began
                if resp.status_code != 200:
                    body_bytes = await resp.aread()
                    out.kind, out.code, out.detail = (
                        "error",
                        _code(body_bytes),
                        body_bytes[:200].decode("utf-8", "replace"),
                    )
                    return
                last = ""
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    if out.first_byte_at is None:
                        out.first_byte_at = time.time()
                    last = line.removeprefix("data: ")
                    if hangup:
                        out.kind = "hangup"
                        return
                    if last != "[DONE]" and "error" in (event := json.loads(last)):
                        out.kind, out.code, out.detail = "stream_error", (event["error"] or {}).get("code"), last[:200]
                if out.kind == "ok" and last != "[DONE]":
                    out.kind, out.detail = "cut", f"the stream ended after {last[:80]!r}"
        except httpx.HTTPError as exc:
            out.kind = "cut" if out.status else "no_answer"
            out.detail = f"{type(exc).__name__}: {exc}"[:200]
        except (ValueError, KeyError) as exc:
            out.kind, out.detail = "error", f"an answer that is not JSON: {exc}"[:200]


def _code(body: bytes) -> str | None:
    try:
        return str(json.loads(body)["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return None
