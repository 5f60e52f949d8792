"""A request's priority at the gateway (gateway/reqpriority.py): lowered to its key's, never
raised; the body's ``priority`` stripped before forwarding, except for vLLM with
``--scheduling-policy priority``, which gets it negated (vLLM handles a lower number earlier)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dgxmm.gateway import reqpriority
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.scans import Scans
from dgxmm.records.deployment import Deployment


def dep(engine: str = "command", args: list[str] | None = None) -> Deployment:
    return Deployment(id="d", name="d", served_name="d", engine=engine, memory_gib=1, args=args or [])


PRIORITY_VLLM = dep("vllm", ["--max-model-len", "4096", "--scheduling-policy", "priority"])


@pytest.mark.parametrize(
    ("deployment", "takes"),
    [
        (PRIORITY_VLLM, True),
        (dep("vllm", ["--scheduling-policy=priority"]), True),
        (dep("vllm", ["--scheduling-policy", "fcfs"]), False),
        (dep("vllm", ["--scheduling-policy"]), False),
        (dep("vllm"), False),
        (dep("llamacpp", ["--scheduling-policy", "priority"]), False),
    ],
)
def test_which_engines_take_a_priority(deployment: Deployment, takes: bool) -> None:
    assert reqpriority.takes_priority(deployment) is takes


@pytest.mark.parametrize(("key", "request_", "expected"), [(10, None, 10), (10, 3, 3), (0, 5, 0), (0, -4, -4)])
def test_a_request_gets_at_most_its_keys_priority(key: int, request_: int | None, expected: int) -> None:
    assert reqpriority.granted(key, request_) == expected


@pytest.mark.parametrize("text", ["true", "1.5", '"3"', "1001", "-1001", "three", ""])
def test_a_priority_that_is_no_integer_in_bounds_is_refused(text: str) -> None:
    with pytest.raises(Refused) as refused:
        reqpriority.asked(text)
    assert (refused.value.status, refused.value.code) == (400, "invalid_request")


async def applied(deployment: Deployment, body: bytes, key: int, header: str | None = None) -> tuple[int, Any]:
    priority, changed = await reqpriority.applied(Scans(), deployment, "chat/completions", body, header, key)
    return priority, None if changed is None else json.loads(changed)


async def test_the_member_is_stripped_for_an_engine_that_takes_none() -> None:
    body = b'{"model":"d","priority":3,"messages":[]}'
    assert await applied(dep(), body, 10) == (3, {"model": "d", "messages": []})
    assert await applied(dep(), body, 0) == (0, {"model": "d", "messages": []})  # lowered to the key's
    assert await applied(dep("vllm"), b'{"priority":1,"priority":2}', 5) == (2, {})  # every copy; the last counts


async def test_vllm_with_priority_scheduling_gets_the_priority_negated() -> None:
    assert await applied(PRIORITY_VLLM, b'{"model":"d"}', 10) == (10, {"priority": -10, "model": "d"})
    assert await applied(PRIORITY_VLLM, b'{"model":"d","priority":4}', 10) == (4, {"model": "d", "priority": -4})
    assert await applied(PRIORITY_VLLM, b'{"model":"d","priority":0}', 10) == (0, {"model": "d", "priority": 0})
    assert await applied(PRIORITY_VLLM, b'{"model":"d"}', 0) == (0, None)  # nothing to say: as it came


async def test_the_header_asks_when_the_body_does_not() -> None:
    assert await applied(dep(), b'{"model":"d"}', 10, header="2") == (2, None)
    assert await applied(dep(), b'{"model":"d","priority":7}', 10, header="2") == (7, {"model": "d"})
    priority, changed = await reqpriority.applied(Scans(), dep(), "embeddings", b'{"priority":1}', "4", 10)
    assert (priority, changed) == (4, None)  # another endpoint: the header only, the body as it came


async def test_a_body_that_is_no_object_is_left_as_it_came() -> None:
    assert await applied(dep(), b'["priority", 3]', 10) == (10, None)
    assert await applied(dep(), b'{"messages":[{"content":"\\"priority\\": 99"}]}', 10) == (10, None)
