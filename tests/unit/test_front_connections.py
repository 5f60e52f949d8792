"""The connection budget: who gives way when connections or unfinished heads run out."""

from __future__ import annotations

from dgxmm.front.connections import ConnectionBudget


class Conn:
    def __init__(self, name: str) -> None:
        self.name = name
        self.in_head = True
        self.evicted = False

    def evict(self) -> None:
        self.evicted = True

    def __repr__(self) -> str:
        return self.name


def conns(budget: ConnectionBudget, n: int) -> list[Conn]:
    out = [Conn(f"c{i}") for i in range(n)]
    for conn in out:
        assert budget.admit(conn)
    return out


def test_at_the_cap_a_closing_then_the_longest_spare_connection_gives_way() -> None:
    budget = ConnectionBudget(max_connections=4, max_head_bytes=1 << 20)
    a, b, c, d = conns(budget, 4)
    for conn in (a, b, c):
        budget.busy(conn)
    budget.spare(c)  # c's answer ended first: spare the longest (after d, which never was busy)
    budget.spare(b)
    budget.closing(d)
    e = Conn("e")
    assert budget.admit(e) and d.evicted  # closing first
    f = Conn("f")
    assert budget.admit(f) and c.evicted and not b.evicted
    g = Conn("g")
    assert budget.admit(g) and b.evicted
    h = Conn("h")
    assert budget.admit(h) and e.evicted and not f.evicted  # then the new ones, oldest first
    assert not a.evicted and budget.open == 4


def test_when_every_connection_is_busy_the_new_one_is_refused() -> None:
    budget = ConnectionBudget(max_connections=2, max_head_bytes=1 << 20)
    for conn in conns(budget, 2):
        budget.busy(conn)
    late = Conn("late")
    assert not budget.admit(late)
    assert budget.refused == 1 and budget.stats()["closing"] == 1
    budget.leave(late)
    assert budget.open == 2 and budget.stats()["busy"] == 2


def test_too_many_head_bytes_drop_the_reader_holding_the_most() -> None:
    budget = ConnectionBudget(max_connections=100, max_head_bytes=1000)
    small, big, medium = conns(budget, 3)
    budget.reading(small, 100)
    budget.reading(big, 600)
    budget.reading(medium, 250)
    assert budget.head_bytes == 950 and not big.evicted
    budget.reading(small, 200)  # 1050 > 1000: the biggest goes, not the one that pushed it over
    assert big.evicted and not small.evicted and budget.head_bytes == 450
    budget.reading(small, 0)  # its head is complete
    assert budget.head_bytes == 250
    budget.leave(medium)
    assert budget.head_bytes == 0


def test_an_evicted_connection_that_leaves_later_is_not_counted_twice() -> None:
    budget = ConnectionBudget(max_connections=1, max_head_bytes=1 << 20)
    [old] = conns(budget, 1)
    new = Conn("new")
    assert budget.admit(new) and old.evicted
    budget.leave(old)  # its connection_lost arrives afterwards
    assert budget.open == 1 and budget.evicted == 1


def test_stats_tell_readers_from_idle_connections() -> None:
    budget = ConnectionBudget(max_connections=10, max_head_bytes=1 << 20)
    a, b, c = conns(budget, 3)
    budget.busy(a)
    b.in_head = False
    stats = budget.stats()
    assert (stats["connections"], stats["busy"], stats["idle"], stats["reading"]) == (3, 1, 1, 1)
    assert c.in_head
