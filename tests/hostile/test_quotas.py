"""Issue 47's findings 1 and 2 replayed against the served dgxmm: a day's token quota bypassed by
streams that do not ask for usage and by a non-streamed answer over 4 MiB, and overrun 6.4x by
parallel requests. Now each request of the key is counted with the engine's own count, and
requests at once pass the quota by at most one request's reservation."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from hostile.harness import Front

pytestmark = pytest.mark.hostile

QUOTA = 100
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def engine_tokens(front: Front) -> int:
    """Prompt and generation tokens the engine counted (its /metrics), all callers together."""
    text = front.engine_client.get(front.engine + "/metrics").text
    return sum(
        int(float(v)) for v in re.findall(r"^vllm:(?:prompt|generation)_tokens_total\{[^}]*\} (\S+)$", text, re.M)
    )


def engine_config(front: Front, **change: Any) -> None:
    assert front.engine_client.post(front.engine + "/_test/config", json=change).status_code == 200


@pytest.fixture
def key(front: Front, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A new caller key with ``QUOTA`` tokens of the day, revoked after the test."""
    with front.served.admin() as admin:
        made = admin.post("/keys", json={"name": request.node.name[:100], "tokens_per_day": QUOTA})
        assert made.status_code == 201, made.text
        yield dict(made.json())
        admin.delete(f"/keys/{made.json()['id']}")


def today(front: Front, key: dict[str, Any]) -> dict[str, Any]:
    with front.served.admin() as admin:
        return dict(admin.get(f"/keys/{key['id']}").json()["usage"]["today"])


def keyed(front: Front, key: dict[str, Any]) -> httpx.Client:
    """The gateway, called with ``key``."""
    return httpx.Client(
        base_url=front.served.base + "/ondemand",
        headers={"Authorization": f"Bearer {key['key']}"},
        transport=httpx.HTTPTransport(local_address="127.0.0.2"),
        timeout=60,
    )


def chat_path(front: Front) -> str:
    return f"/{front.deployment['id']}/v1/chat/completions"


def test_streams_that_do_not_ask_for_usage_are_counted(front: Front, key: dict[str, Any]) -> None:
    """200 streamed requests without ``include_usage``: all were served, usage 0. Now the
    ones past the quota are refused, and the key's usage is the engine's count."""
    before = engine_tokens(front)
    statuses = []
    with keyed(front, key) as g:
        for _ in range(200):
            resp = g.post(chat_path(front), json={**CHAT, "stream": True})
            statuses.append(resp.status_code)
            if resp.status_code == 200:
                assert b'"usage"' not in resp.content, "a usage chunk the client did not ask for"
            else:
                assert resp.json()["error"]["code"] == "quota_exceeded"
    served = statuses.count(200)
    used = today(front, key)
    assert statuses == [200] * served + [429] * (200 - served)
    assert used["prompt_tokens"] + used["completion_tokens"] == engine_tokens(front) - before
    assert used["requests"] == 200 and QUOTA <= used["prompt_tokens"] + used["completion_tokens"] < 2 * QUOTA


def test_parallel_requests_pass_the_quota_by_at_most_one_reservation(front: Front, key: dict[str, Any]) -> None:
    """50 requests at once: 20 were admitted and 640 tokens counted (6.4x the quota). Now the
    day's count passes the quota by at most one request's reservation (its body's bytes and
    its max_tokens), whatever the order they arrive and end in."""
    raw = json.dumps({**CHAT, "stream": True, "max_tokens": 3}).encode()
    before = engine_tokens(front)
    engine_config(front, chunk_delay=0.05)  # they are in flight together

    async def all_at_once() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=front.served.base + "/ondemand",
            headers={"Authorization": f"Bearer {key['key']}"},
            transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"),
            limits=httpx.Limits(max_connections=50),
            timeout=60,
        ) as g:
            return await asyncio.gather(*(g.post(chat_path(front), content=raw) for _ in range(50)))

    try:
        answers = asyncio.run(all_at_once())
    finally:
        engine_config(front, chunk_delay=0.0)
    refused = [r for r in answers if r.status_code == 429]
    assert all(r.json()["error"]["code"] == "quota_exceeded" for r in refused)
    assert refused and len(refused) + sum(r.status_code == 200 for r in answers) == 50
    used = today(front, key)
    tokens = used["prompt_tokens"] + used["completion_tokens"]
    assert tokens == engine_tokens(front) - before
    assert tokens < QUOTA + len(raw) + 3


def test_a_non_streamed_answer_over_4_mib_is_counted(front: Front, key: dict[str, Any]) -> None:
    """An answer over 4 MiB was not read for its usage. Now it is, and the next is refused."""
    engine_config(front, reply=" ".join(["w" * 99] * 50_000))  # 5 MB of content, 50,000 tokens
    before = engine_tokens(front)
    try:
        with keyed(front, key) as g:
            big = g.post(chat_path(front), json=CHAT)
            assert big.status_code == 200 and len(big.content) > 4 * 1024 * 1024
            after = g.post(chat_path(front), json=CHAT)
            assert after.status_code == 429 and after.json()["error"]["code"] == "quota_exceeded"
    finally:
        engine_config(front, reply="Hello from the test engine")
    used = today(front, key)
    assert used["completion_tokens"] == 50_000
    assert used["prompt_tokens"] + used["completion_tokens"] == engine_tokens(front) - before
