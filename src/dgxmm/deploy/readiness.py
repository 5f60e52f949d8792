"""When a starting engine can answer: probed soon after launch, at once when it writes something.

A user of an on-demand model waits for this. A fixed poll every ``start_poll_s`` (0.5 s) left
on average a quarter of a second, and up to half a second, between the moment the engine could
answer and the moment dgxmm noticed: more than the whole load time of a small llama.cpp model.
Probing much faster all the way would be a stream of requests at an engine busy loading.

So the probes (health, then the model list, as the start-up gate requires) follow a schedule
that starts fast and backs off: ``FIRST_PROBE_S`` after launch (or at once for a wake), then
doubling up to ``start_poll_s``, so a 60 s vLLM load sees about 120 probes in all. And the
engine's own output is the hint that something changed: an engine writes a line when it starts
listening or has loaded its model (llama-server's "server is listening", uvicorn's "Application
startup complete" in vLLM), so when the runtime sees new output (``Runtime.output_size``, the
log file's size for local processes, a ``stat`` every ``HINT_CHECK_S``; for containers the bytes
counted from the log stream the docker runtime follows: nothing the engine sees)
the probe runs at once, at most once per ``HINT_GAP_S`` for an engine that writes a lot while it
loads. Without a hint (a runtime that cannot say, an engine that writes nothing) the schedule
alone decides.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

FIRST_PROBE_S = 0.01  # the first interval after a launch; then doubling up to start_poll_s
HINT_CHECK_S = 0.005  # how often the engine's output is looked at for a hint
HINT_GAP_S = 0.02  # the shortest time between two probes prompted by output


async def wait_ready(
    probe: Callable[[], Awaitable[bool]],
    output_size: Callable[[], int | None],
    check_exit: Callable[[], None],
    *,
    max_interval_s: float,
    deadline: float,
    first_at_once: bool = False,
) -> bool:
    """Probe until ``probe()`` is true (True) or ``deadline`` (monotonic) passes (False).
    ``check_exit`` raises when the engine ended; ``output_size`` is the size of its output so
    far (None when unknown); ``first_at_once``: probe before waiting at all (a wake)."""
    now = time.monotonic()
    interval = FIRST_PROBE_S
    next_probe = now if first_at_once else now + interval
    last_probe = -1.0
    seen = output_size()
    while True:
        check_exit()
        now = time.monotonic()
        size = output_size()
        hinted = size is not None and size != seen and now - last_probe >= HINT_GAP_S
        if now >= next_probe or hinted:
            seen = size
            last_probe = now
            if await probe():
                return True
            now = time.monotonic()
            interval = min(interval * 2, max_interval_s)
            next_probe = now + interval
        if now >= deadline:
            return False
        wake = min(next_probe, deadline) - now
        await asyncio.sleep(max(0.0, min(wake, HINT_CHECK_S) if size is not None else wake))
