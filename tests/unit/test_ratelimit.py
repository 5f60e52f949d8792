"""Failed key checks per peer (dgxmm.gateway.ratelimit.FailureLimiter).

Spec (Gateway, check 4 and "Key rotation"): a peer with 20 failed key checks in a minute gets 429
for the rest of that minute; when the key changes, the failed-attempt counts are cleared.
"""

from __future__ import annotations

from dgxmm.gateway.ratelimit import FailureLimiter

LIMIT = 20
WINDOW = 60.0
PEER = "172.18.0.5"
OTHER = "172.18.0.6"


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def make() -> tuple[FailureLimiter, Clock]:
    clock = Clock()
    return FailureLimiter(LIMIT, WINDOW, clock=clock), clock


def fail(limiter: FailureLimiter, peer: str, times: int) -> None:
    for _ in range(times):
        limiter.failed(peer)


def test_new_peer_is_not_exhausted():
    limiter, _ = make()
    assert not limiter.exhausted(PEER)


def test_19_failures_do_not_exhaust():
    limiter, _ = make()
    fail(limiter, PEER, LIMIT - 1)
    assert not limiter.exhausted(PEER)


def test_20th_failure_exhausts():
    limiter, _ = make()
    fail(limiter, PEER, LIMIT)
    assert limiter.exhausted(PEER)


def test_exhausted_for_the_rest_of_the_window():
    limiter, clock = make()
    fail(limiter, PEER, LIMIT)
    clock.now += WINDOW - 0.001
    assert limiter.exhausted(PEER)


def test_window_is_fixed_from_the_first_failure():
    limiter, clock = make()
    limiter.failed(PEER)
    clock.now += 50
    fail(limiter, PEER, LIMIT - 1)  # the 20th failure comes 50 s into the window
    assert limiter.exhausted(PEER)
    clock.now += 10  # 60 s after the first failure, not after the 20th
    assert not limiter.exhausted(PEER)


def test_failures_of_an_expired_window_do_not_count():
    limiter, clock = make()
    fail(limiter, PEER, LIMIT - 1)
    clock.now += WINDOW
    limiter.failed(PEER)  # opens a new window
    assert not limiter.exhausted(PEER)
    fail(limiter, PEER, LIMIT - 2)
    assert not limiter.exhausted(PEER)
    limiter.failed(PEER)
    assert limiter.exhausted(PEER)


def test_allowed_again_after_the_window():
    limiter, clock = make()
    fail(limiter, PEER, LIMIT)
    clock.now += WINDOW
    assert not limiter.exhausted(PEER)


def test_failures_are_counted_per_peer():
    limiter, _ = make()
    fail(limiter, PEER, LIMIT)
    fail(limiter, OTHER, LIMIT - 1)
    assert limiter.exhausted(PEER)
    assert not limiter.exhausted(OTHER)


def test_clear_resets_all_peers():
    limiter, _ = make()
    fail(limiter, PEER, LIMIT)
    fail(limiter, OTHER, LIMIT)
    limiter.clear()
    assert not limiter.exhausted(PEER)
    assert not limiter.exhausted(OTHER)


def test_clear_starts_counting_from_zero():
    limiter, _ = make()
    fail(limiter, PEER, LIMIT)
    limiter.clear()
    fail(limiter, PEER, LIMIT - 1)
    assert not limiter.exhausted(PEER)
    limiter.failed(PEER)
    assert limiter.exhausted(PEER)


def test_many_peers_keep_their_own_counts_across_pruning():
    limiter, clock = make()
    fail(limiter, PEER, LIMIT)
    for i in range(10_001):  # enough distinct peers to trigger pruning of expired windows
        limiter.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")
    assert limiter.exhausted(PEER)
    clock.now += WINDOW
    assert not limiter.exhausted(PEER)


def test_retry_after_is_the_rest_of_the_window_in_whole_seconds():
    limiter, clock = make()
    fail(limiter, PEER, LIMIT)
    clock.now += 10.5
    assert limiter.retry_after(PEER) == 50
    clock.now += WINDOW - 10.5 - 0.2
    assert limiter.retry_after(PEER) == 1
    clock.now += 0.2
    assert limiter.retry_after(PEER) == 1  # the window is over: a retry at once would do, 1 s is the header's least
