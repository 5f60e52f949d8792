"""The texts of the controller's events and audit rows, in one place (the UI's activity log
shows them; tests and docs quote them)."""

from __future__ import annotations

STARTED_FOR_REQUEST = "Started for a request"
# A start that ran out of memory, started once more after make-room (controller/oomretry.py).
OOM_RETRY = "Out of memory at start: made room, retrying"
PRELOADED = "Preloaded: started with dgxmm, before any request"
UNLOADED = "Stopped at a caller's request (keep_alive 0 on the Ollama API), with nothing in flight"


def not_preloaded(need_gib: float, free_gib: float) -> str:
    """A preload that does not fit: it makes no room, the first request starts it."""
    return f"Not preloaded: it needs {need_gib:g} GiB and {free_gib:.1f} GiB is free; its first request starts it"


def does_not_fit(name: str, need_gib: float, capacity_gib: float, several_devices: bool) -> str:
    """A model larger than the capacity (of any device it may use) can never fit."""
    if several_devices:
        return (
            f"{name} needs {need_gib:g} GiB on each device it spans, more than the {capacity_gib:.1f} GiB "
            "on-demand models can get on any device it may use"
        )
    return f"{name} needs {need_gib:g} GiB, more than the {capacity_gib:.1f} GiB on-demand models can get on this host"


def idle_stop(seconds: float) -> str:
    """The reaper stopped an idle deployment (its engine is stopped, not put to sleep)."""
    return f"Stopped after {duration(seconds)} idle"


def duration(seconds: float) -> str:
    """A span as a person writes it: ``45 s``, ``10 min``, ``1 h 30 min`` (not ``0.75 min``)."""
    if seconds < 120 and seconds % 60:
        return f"{seconds:.3g} s" if seconds < 10 else f"{round(seconds)} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, rest = divmod(minutes, 60)
    return f"{hours} h {rest} min" if rest else f"{hours} h"


def make_room_stop(for_name: str) -> str:
    """Make-room stopped an idle deployment for the queue head ``for_name``."""
    return f"Stopped to make room for {for_name}"


def drain_stop(for_name: str) -> str:
    """A busy model was drained (no new requests, the running ones finished) for ``for_name``."""
    return f"Drained and stopped to make room for {for_name}, which waited its turn"


def queue_timeout(timeout_s: float, name: str) -> str:
    return f"A request timed out after {timeout_s:g} s waiting for {name}"
