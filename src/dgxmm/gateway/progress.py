"""A wait's progress as reasoning (issue 59): what a streamed chat that must wait is told, and how.

A caller whose key has ``progress = "reasoning"`` (``[ondemand] progress`` for the key file's)
and whose streamed ``chat/completions`` request cannot have a slot at once (the model starts,
wakes, waits for memory or for its turn under ``max_concurrent``) gets its SSE answer at once
and, before the engine's first byte, ``chat.completion.chunk`` chunks whose delta holds only
``reasoning_content`` (no ``role``: the engine's first chunk has it, and a second one is
concatenated by clients that put a stream together, the OpenAI SDK's helper giving
"assistantassistant", which a tool loop would send back): what dgxmm does and how long it expects, a line whenever what the
request waits for changes, one every ``PROGRESS_EVERY_S`` while it lasts, and "Ready after N s."
Then the engine's bytes, unchanged. Chat UIs (Open WebUI, LibreChat, llama.cpp's) show that
field folded as the model's thinking, apart from the answer; clients that read only
``content`` and ``tool_calls`` get exactly the engine's (docs/clients.md). Tools in the body do
not matter: no line ever becomes the answer's text or a tool call, unlike the queued notice
(notice.py), which is withheld from such requests.

The lines are worked out from the deployment's honest status (``dgxmm.status.honest``, the one
the console shows), read through ``collaborators.WaitStatus`` (``Looks``: once per deployment
for all its waiting requests); this module only words it.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Hashable
from typing import Any

from dgxmm.controller.slots import Slot
from dgxmm.gateway.collaborators import DeploymentPeek, WaitStatus
from dgxmm.gateway.request import GatewayRequest
from dgxmm.records.deployment import Deployment

# While a wait lasts, a line at least this often: a chat UI that shows nothing new for longer
# looks hung, and a line a second would bury the ones that say something.
PROGRESS_EVERY_S = 5.0
# How often the wait's status is looked at, for a change of what it waits for.
LOOK_EVERY_S = 0.5
KEPT_LOOKS = 256  # deployments whose last look is kept before the stale ones are let go


class Looks:
    """The statuses the waits' lines are worded from, one look per deployment shared by all its
    waiting requests: a queued deployment's status reads every deployment's (3.9 ms with 202
    deployments, 0.06 ms for one not queued), so it is read at most once per ``LOOK_EVERY_S``
    however many requests are told of it."""

    def __init__(self, waits: WaitStatus, deployer: DeploymentPeek) -> None:
        self._waits = waits
        self._deployer = deployer
        self._seen: dict[str, tuple[float, dict[str, Any]]] = {}  # id -> (when, its status)

    def look(self, dep: Deployment) -> dict[str, Any]:
        """``dep``'s status, read now unless it was within ``LOOK_EVERY_S``."""
        now = time.monotonic()
        seen = self._seen.get(dep.id)
        if seen is not None and now - seen[0] < LOOK_EVERY_S:
            return seen[1]
        status = self._waits.status(self._deployer.peek(dep.id) or dep)
        if len(self._seen) >= KEPT_LOOKS:
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < LOOK_EVERY_S}
        self._seen[dep.id] = (now, status)
        return status


class Chunks:
    """One request's progress chunks, shaped as the engine's own stream's would be: a
    ``chatcmpl-`` id, the time the answer began, the model as the caller named it."""

    def __init__(self, model: str) -> None:
        self._head = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

    def chunk(self, line: str) -> bytes:
        """One SSE event whose delta holds ``line`` as ``reasoning_content``, alone."""
        choice = {"index": 0, "delta": {"reasoning_content": line + "\n"}, "logprobs": None, "finish_reason": None}
        return b"data: " + json.dumps({**self._head, "choices": [choice]}).encode() + b"\n\n"


class Told:
    """One request's wait, told as it goes: ``look`` reads its deployment's status now."""

    def __init__(self, model: str, look: Callable[[], dict[str, Any]]) -> None:
        self._model = model
        self._look = look
        self._chunks = Chunks(model)

    async def until(self, req: GatewayRequest, acquiring: asyncio.Task[Slot], arrival: float) -> None:
        """The lines, from the first (at once) until ``acquiring`` is done, then "Ready after
        N s." (``arrival``: the request's, monotonic) when it got a slot; a refusal is the
        caller's to write, after these lines."""
        said, text = line(self._model, self._look(), time.time())
        await req.write(self._chunks.chunk(text))
        last = time.monotonic()
        while not acquiring.done():
            await asyncio.wait([acquiring], timeout=LOOK_EVERY_S)
            if acquiring.done():
                break
            now = time.monotonic()
            what, text = line(self._model, self._look(), time.time())
            if what != said:
                await req.write(self._chunks.chunk(text))
            elif now - last >= PROGRESS_EVERY_S:
                await req.write(self._chunks.chunk(f"Still waiting after {now - arrival:.0f} s. {text}"))
            else:
                continue
            said, last = what, now
        if not acquiring.cancelled() and acquiring.exception() is None:
            await req.write(self._chunks.chunk(f"Ready after {time.monotonic() - arrival:.1f} s."))


def line(model: str, status: dict[str, Any], now: float) -> tuple[Hashable, str]:
    """What a request for ``model`` waits for, as ``status`` (its deployment's honest status at
    Unix time ``now``) says: a key that changes only when what it waits for does, and the line."""
    code = status["code"]
    took = status.get("last_cold_start_s")
    expect = f"its last start took {took:.1f} s" if took is not None else "no start of it was timed yet"
    if code == "queued":
        wait = status.get("waits_for")
        return ("queued", _chain(wait)), f"Waiting for memory: {_memory(wait, now)}."
    if code == "loading" and status.get("waiting_for_gate"):
        return "gate", f"Loading {model} once another engine has finished loading; {expect}."
    said = {
        "cold": f"Starting {model} on demand; {expect}.",
        "asleep": f"Waking {model}; {expect}.",
        "loading": f"Loading {model}; {expect}.",
        "serving": f"Waiting for a turn: {model} is answering {status.get('count') or 0} requests.",
        "idle": f"Waiting for a turn at {model}.",
        "ready": f"Waiting for a turn at {model}.",
        "stopping": f"Waiting for {model} to stop; it starts again for this request.",
        "planned": f"Waiting for {model} to be prepared (a download or an image pull).",
        "switching": f"Waiting for {model} to switch to always on.",
        "failed": f"{model} failed to start.",
    }
    return code, said.get(code, f"Waiting for {model} ({status.get('label') or code}).")


def _chain(wait: dict[str, Any] | None) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """A memory wait's kinds and deployments along its chain (``then``), without its times."""
    found = []
    while wait:
        found.append((str(wait["kind"]), tuple(d["name"] for d in wait["deployments"])))
        wait = wait.get("then")
    return tuple(found)


def _memory(wait: dict[str, Any] | None, now: float) -> str:
    """A memory wait (``honest.waits_for``) in words, with what comes after it."""
    if not wait:
        return "room is being made"
    names = [d["name"] for d in wait["deployments"]]
    who = ", ".join(names)
    one = len(names) == 1
    words = {
        "queue": f"behind {who} in the memory queue",
        "free": "the memory is free; it starts next",
        "release": f"{who} stopped to make room; waiting for the memory to be freed",
        "stop": f"{who} {'is' if one else 'are'} stopping",
        "drain": f"{who} {'finishes what it serves' if one else 'finish what they serve'}, then stop{'s' if one else ''}",
        "start": f"{who} {'is' if one else 'are'} starting",
        "busy": f"{who} {'is' if one else 'are'} answering requests; room is made once idle",
        "nothing": "nothing dgxmm may stop frees enough yet",
    }
    kind = wait["kind"]
    if kind == "victim":
        at = wait.get("at")
        when = f", in {max(at - now, 0):.0f} s" if at is not None else ""
        text = f"{who} {'stops' if one else 'stop'} when idle{when}"
    else:
        text = words.get(kind, kind)
    after = wait.get("then")
    return f"{text}; then {_memory(after, now)}" if after else text
