"""The deliberate bugs of ``make mutants`` in a start's one retry for memory (controller/oomretry.py
and where the controller applies it; scripts/mutants.py runs them)."""

from __future__ import annotations

from mutant import ATTEMPTS, DECIDE, ONCHANGE, OOMRETRY, Mutant

MUTANTS = [
    Mutant(
        "oom_retried_forever",
        "a start that ran out of memory is retried however often it did (never a failed start, no backoff)",
        (
            (
                OOMRETRY,
                "    if track.started_for_request and track.oom is OomRetry.NONE and out_of_memory(output) is not None:",
                "    if track.started_for_request and out_of_memory(output) is not None:",
            ),
        ),
    ),
    Mutant(
        "oom_never_retried",
        "a start that ran out of memory is a failed start at once, as before issue 52",
        (
            (
                ONCHANGE,
                "            if old is State.STARTING and oomretry.after_failed_start(",
                "            if False and oomretry.after_failed_start(",
            ),
        ),
    ),
    Mutant(
        "oom_retry_makes_no_room",
        "the retry sees the devices as the budget does: it starts again beside the same idle models",
        (
            (
                OOMRETRY,
                "max(0.0, room.free_gib - need.per_device)",
                "max(0.0, room.free_gib)",
            ),
        ),
    ),
    Mutant(
        "oom_retry_beside_its_own_engine",
        "its waiters start the retry while the failed engine is still being ended",
        (
            (
                DECIDE,
                "    if track.oom is OomRetry.ENDING:\n        return Action.WAIT",
                "    if track.oom is OomRetry.ENDING and False:\n        return Action.WAIT",
            ),
        ),
    ),
    Mutant(
        "oom_retry_unsaid",
        "the retry's start is recorded as any start: the console never says it ran out of memory",
        (
            (
                ATTEMPTS,
                "            text = texts.OOM_RETRY\n",
                "",
            ),
        ),
    ),
]
