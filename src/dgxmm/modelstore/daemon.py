"""A blocking call of the model store's on a daemon thread of its own (a pull's bytes).

A read blocked on a silent hub must neither hold up the default executor's other work nor, at
exit, the process: the default executor's threads are joined at exit, for as long as the hub's
read timeout and the client's retries take.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any


async def in_daemon_thread(fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` on a daemon thread of its own: a read blocked on a silent hub neither holds
    up the executor's other work nor, at exit, the process (the default executor's threads are
    joined at exit, for as long as the hub's read timeout and the client's retries take)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(exc: BaseException | None) -> None:
        if done.cancelled():
            return
        if exc is None:
            done.set_result(None)
        else:
            done.set_exception(exc)

    def run() -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task, which decides what it means
            with contextlib.suppress(RuntimeError):  # (the loop is closed: nobody waits any more)
                loop.call_soon_threadsafe(settle, exc)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, None)

    threading.Thread(target=run, name="model-pull", daemon=True).start()
    await done
