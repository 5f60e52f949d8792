"""The texts of the controller's events and audit rows, in one place (the UI's activity log
shows them; tests and docs quote them)."""

from __future__ import annotations

STARTED_FOR_REQUEST = "Started for a request"


def idle_stop(minutes: float) -> str:
    """The reaper stopped an idle deployment (its engine is stopped, not put to sleep)."""
    return f"Stopped after {minutes:g} min idle"


def make_room_stop(for_name: str) -> str:
    """Make-room stopped an idle deployment for the queue head ``for_name``."""
    return f"Stopped to make room for {for_name}"


def queue_timeout(timeout_s: float, name: str) -> str:
    return f"A request timed out after {timeout_s:g} s waiting for {name}"
