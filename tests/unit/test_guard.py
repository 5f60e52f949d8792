"""The peer guard (dgxmm.gateway.guard): refused callers get the spec's plain 404, and the
operator gets the reason in the log, at most once a minute per peer."""

from __future__ import annotations

import logging

import pytest

from dgxmm.gateway.guard import PeerGuard, RefusalLog
from dgxmm.gateway.peers import NoContainer, PeerPolicy
from unit.recorded import Recorded

PREFIX = "/dgxmm/ondemand"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Inner:
    """What the guard lets through answers 200."""

    async def serve(self, req: Recorded, heads: object) -> None:
        await req.respond(200, [], b"passed")


inner_app = Inner()


async def call(guard: PeerGuard, peer: str, headers: list[tuple[bytes, bytes]] | None = None) -> int:
    req = Recorded(method="GET", path=f"{PREFIX}/x/v1/models", headers=headers or [], client=(peer, 40000))
    await guard.serve(req)  # type: ignore[arg-type]
    return req.status


@pytest.fixture
async def guarded() -> tuple[PeerGuard, Clock]:
    policy = PeerPolicy(["127.0.0.1/32"], None, NoContainer(), refresh_s=30)
    await policy.refresh()
    clock = Clock()
    return PeerGuard(inner_app, policy, RefusalLog(60.0, max_peers=3, clock=clock)), clock


def refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    lines = [r.getMessage() for r in caplog.records if r.name == "dgxmm.gateway.guard"]
    caplog.clear()
    return lines


async def test_a_refused_peer_is_logged_with_the_policy_at_most_once_a_minute(
    guarded: tuple[PeerGuard, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    guard, clock = guarded
    caplog.set_level(logging.WARNING, logger="dgxmm.gateway.guard")
    assert await call(guard, "127.0.0.1") == 200
    assert refusals(caplog) == []

    assert await call(guard, "10.1.2.3") == 404
    assert refusals(caplog) == [
        (
            "on-demand gateway refused 10.1.2.3 with 404: the peer is not allowed (peer policy "
            "allowed_cidrs = ['127.0.0.1/32'], outside Docker: allowed: 127.0.0.1/32; refused: none)"
        )
    ]
    clock.now += 59
    assert await call(guard, "10.1.2.3") == 404
    assert refusals(caplog) == []
    assert await call(guard, "10.9.9.9") == 404  # another peer has its own minute
    assert len(refusals(caplog)) == 1
    clock.now += 1
    assert await call(guard, "10.1.2.3") == 404
    assert len(refusals(caplog)) == 1


async def test_a_forwarded_request_from_an_allowed_peer_is_logged_with_the_header(
    guarded: tuple[PeerGuard, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    guard, _ = guarded
    caplog.set_level(logging.WARNING, logger="dgxmm.gateway.guard")
    assert await call(guard, "127.0.0.1", [(b"x-real-ip", b"1.2.3.4")]) == 404
    [line] = refusals(caplog)
    assert "refused 127.0.0.1 with 404: the request carries X-Real-IP" in line


async def test_the_remembered_peers_are_bounded(
    guarded: tuple[PeerGuard, Clock], caplog: pytest.LogCaptureFixture
) -> None:
    """Many refused addresses in one minute (a scan) cannot grow memory or flood the log: past
    max_peers new peers go unlogged until the remembered ones are a minute old."""
    guard, clock = guarded
    caplog.set_level(logging.WARNING, logger="dgxmm.gateway.guard")
    for i in range(5):
        assert await call(guard, f"10.0.0.{i}") == 404
    assert len(refusals(caplog)) == 3
    assert len(guard.refusals._logged_at) == 3
    clock.now += 60
    assert await call(guard, "10.0.0.4") == 404
    assert len(refusals(caplog)) == 1 and len(guard.refusals._logged_at) == 1


async def test_before_the_first_refresh_the_log_says_nobody_is_allowed(caplog: pytest.LogCaptureFixture) -> None:
    policy = PeerPolicy("auto", None, NoContainer(), refresh_s=30)
    guard = PeerGuard(inner_app, policy)
    caplog.set_level(logging.WARNING, logger="dgxmm.gateway.guard")
    assert await call(guard, "127.0.0.1") == 404
    assert "(peer policy allowed_cidrs = auto: nobody until the first refresh)" in refusals(caplog)[0]
