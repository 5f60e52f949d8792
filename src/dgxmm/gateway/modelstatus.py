"""A model's load state in llama.cpp's vocabulary, for the model list's ``status``.

llama-server's router mode made ``status: {"value": ...}`` in each entry of ``GET /models`` the
convention that clients of many-model servers read (Open WebUI's llama.cpp connection, the
``pi`` agent, Letta Code; llama-swap copied it): ``unloaded``, ``loading``, ``loaded`` and
``sleeping``, and a failed instance as ``unloaded`` with ``failed: true``, as llama.cpp's own
``is_failed()`` tells it (no value of its own, so a client that knows only the four values
still reads it). dgxmm's phase ``sleeping`` is not llama.cpp's: it means a stopped on-demand
model, which llama.cpp calls ``unloaded``; an engine put to sleep is dgxmm's state ``asleep``.
"""

from __future__ import annotations

from typing import Any

from dgxmm.records.deployment import State

# The phases in which a request waits for this model's start: for the memory it needs (queued)
# or for the engine to come up. A client sees the model loading from the first such request.
WAITING_FOR_START = frozenset({"queued", "starting_for_request"})


def llamacpp_status(state: State, phase: str | None, downloaded: float | None = None) -> dict[str, Any]:
    """``status`` of a model list entry for a deployment in ``state`` (and, on demand, ``phase``);
    ``downloaded``: a hub model whose files the model store is still fetching, how much is here
    (0 to 1): ``downloading``, dgxmm's value beside llama.cpp's four, with its ``progress``."""
    if downloaded is not None:
        return {"value": "downloading", "progress": round(downloaded, 3)}
    if state is State.READY:
        return {"value": "loaded"}
    if state is State.ASLEEP:
        return {"value": "sleeping"}
    if state is State.STARTING or phase in WAITING_FOR_START:
        return {"value": "loading"}
    if state is State.FAILED:
        return {"value": "unloaded", "failed": True}
    return {"value": "unloaded"}
