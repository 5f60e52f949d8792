"""Who goes first: pure rules of priority (no I/O, no clock: every time is a number passed in).

A waiting request has a priority (its caller key's, or lower if the request asked for less; 0
without a key). It orders two lines: a deployment's ``max_concurrent`` line (which waiter gets
the next slot) and the memory queue (which waiting model starts next). A waiter's priority rises
by one per ``[ondemand] priority_aging_s`` it has waited, so a low one is not starved by a steady
stream of high ones; ties keep arrival order. With equal priorities the effective priorities fall
in arrival order (the older has waited at least as long), so both lines stay first come, first
served exactly, as they were before priorities.

**The bound.** A waiter of priority ``p`` is ahead of every request of priority at most ``p_max``
that arrived more than ``(p_max - p + 1) * aging_s`` after it: it waits behind at most the
requests that were waiting when it came and those that arrived within that window after it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def effective(priority: int, waited_s: float, aging_s: float) -> int:
    """``priority`` raised by one per ``aging_s`` waited (``aging_s`` 0: no aging)."""
    if aging_s <= 0 or waited_s <= 0:
        return priority
    return priority + math.floor(waited_s / aging_s)


def line(waiters: Sequence[tuple[int, float]], now: float, aging_s: float) -> list[int]:
    """The serving order of ``waiters`` (each its priority and when it began to wait, in arrival
    order): their indices, the highest effective priority first, ties in arrival order."""
    return sorted(range(len(waiters)), key=lambda i: -effective(waiters[i][0], now - waiters[i][1], aging_s))


def queue_order(entries: Sequence[tuple[int, float, bool]], now: float, aging_s: float) -> list[int]:
    """The memory queue's order, head first: ``entries`` (each the best priority of its model's
    waiters, when it joined the queue, and whether it holds a reservation, in order of joining)
    as indices. An entry holding a reservation (its victims are stopping, their memory is its) is
    the head: a start making room is not overtaken half-way. The others follow by the effective
    priority of their best waiter aged from when the entry joined, ties in order of joining."""
    order = line([(best, joined) for best, joined, _ in entries], now, aging_s)
    reserving = [i for i in order if entries[i][2]]
    return reserving[:1] + [i for i in order if i not in reserving[:1]]
