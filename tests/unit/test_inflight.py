"""The caller keys' requests in flight (gateway/inflight.py): ended by key, by the names a
narrowing no longer allows, and at the key's expiry by one timer per key."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from dgxmm.gateway.refused import Refused
from dgxmm.gateway.inflight import OpenRequests

REVOKED = Refused(401, "key_revoked", "the key k was revoked")


@dataclass
class Key:
    id: str
    expires_at: float | None = None


class Cancels:
    """Stands for the requests' tasks: which were cancelled."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def of(self, name: str) -> object:
        return lambda: self.cancelled.append(name)


def test_end_ends_each_request_of_the_key_once_and_no_other() -> None:
    cancels, registry = Cancels(), OpenRequests()
    key, other = Key("k"), Key("o")
    first = registry.enter(key, ["a"], cancels.of("first"))
    registry.enter(key, ["b"], cancels.of("second"))
    registry.enter(other, ["a"], cancels.of("other"))
    assert registry.end(key, REVOKED) == 2
    assert sorted(cancels.cancelled) == ["first", "second"] and first.reason is REVOKED
    assert registry.end(key, Refused(503, "request_ended", "again")) == 0, "an ended request is not ended twice"
    assert first.reason is REVOKED
    registry.leave(key, first)
    assert registry.count("k") == 1 and registry.count("o") == 1


def test_a_narrowing_ends_only_the_requests_of_names_no_longer_allowed() -> None:
    cancels, registry = Cancels(), OpenRequests()
    key = Key("k")
    registry.enter(key, ["a-1"], cancels.of("a"))
    registry.enter(key, ["b-1", "b-alias"], cancels.of("b"))
    ended = registry.end(
        key, Refused(403, "model_not_allowed", "no"), lambda names: any(n.startswith("a-") for n in names)
    )
    assert ended == 1 and cancels.cancelled == ["b"]


async def test_the_expiry_ends_the_keys_requests_and_a_moved_expiry_moves_the_timer() -> None:
    now = [1000.0]
    registry = OpenRequests(lambda: now[0])
    key = Key("k", expires_at=1000.0 + 3600)
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    request = registry.enter(key, ["a"], lambda: ended.set_result(True))
    key.expires_at = 1000.0  # moved to now: due at once
    registry.arm(key)
    await asyncio.wait_for(ended, 10)
    assert request.reason is not None and request.reason.code == "key_expired"


async def test_leaving_clears_the_timer() -> None:
    cancels, registry = Cancels(), OpenRequests(lambda: 1000.0)
    key = Key("k", expires_at=1000.0 + 3600)
    request = registry.enter(key, ["a"], cancels.of("a"))
    assert registry._timers
    registry.leave(key, request)
    assert not registry._timers and registry.count("k") == 0
