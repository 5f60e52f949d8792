"""Mixed streaming and non-streaming chat completions, N at a time, every answer checked whole.

Shared by the gateway's connection tests (test engine), the real llama-server traffic tests and
their Docker twin. Request ``i`` carries the header ``x-test-seq: i`` and is streamed when ``i``
is even; a streamed answer counts as complete only when it ends with ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

import httpx

SEQ_HEADER = "x-test-seq"


@dataclass
class Outcome:
    seq: int
    stream: bool
    status: int = 0
    complete: bool = False
    completion_tokens: int | None = None  # from the answer's usage, when it has one
    error: str = ""


async def _one(client: httpx.AsyncClient, path: str, seq: int, body: dict[str, Any]) -> Outcome:
    stream = seq % 2 == 0
    out = Outcome(seq, stream)
    payload = {**body, "stream": stream}
    if stream:
        payload["stream_options"] = {"include_usage": True}
    headers = {SEQ_HEADER: str(seq)}
    try:
        if not stream:
            resp = await client.post(path, json=payload, headers=headers)
            out.status = resp.status_code
            if resp.status_code != 200:
                out.error = resp.text[:300]
                return out
            answer = resp.json()
            out.complete = bool(answer.get("choices"))
            out.completion_tokens = (answer.get("usage") or {}).get("completion_tokens")
            return out
        async with client.stream("POST", path, json=payload, headers=headers) as resp:
            out.status = resp.status_code
            if resp.status_code != 200:
                out.error = (await resp.aread()).decode("utf-8", "replace")[:300]
                return out
            lines = [line async for line in resp.aiter_lines() if line.startswith("data: ")]
        out.complete = bool(lines) and lines[-1] == "data: [DONE]"
        for line in lines[:-1]:
            usage = json.loads(line[6:]).get("usage")
            if usage:
                out.completion_tokens = usage.get("completion_tokens")
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    return out


async def drive(
    client: httpx.AsyncClient, path: str, count: int, concurrency: int, body: dict[str, Any], first: int = 0
) -> list[Outcome]:
    """Send requests ``first`` .. ``first + count - 1``, ``concurrency`` at a time."""
    queue = iter(range(first, first + count))
    outcomes: list[Outcome] = []

    async def worker() -> None:
        for seq in queue:
            outcomes.append(await _one(client, path, seq, body))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sorted(outcomes, key=lambda o: o.seq)


def failures(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.status != 200 or not o.complete]


def seen_once(outcomes: list[Outcome], seen_seqs: list[str]) -> dict[str, int]:
    """Requests the engine saw other than exactly once ({seq: times}); empty when all is well."""
    times = Counter(seen_seqs)
    wrong = {str(o.seq): times.get(str(o.seq), 0) for o in outcomes if times.get(str(o.seq), 0) != 1}
    sent = {str(o.seq) for o in outcomes}
    wrong.update({seq: n for seq, n in times.items() if seq not in sent})
    return wrong
