"""A request's priority: its caller key's, or less if the request asks for less.

A request may ask with a top-level ``priority`` (an integer) in a chat, completions or responses
JSON body, or with the ``x-dgxmm-priority`` header on any request (the body's wins when both
come). What it gets is at most its key's priority (``CallerKey.priority``; the key file's is 0):
a caller can lower its own requests, never raise them. It orders the controller's lines
(controller/priority.py): higher goes first.

The body's ``priority`` is dgxmm's: it is removed before the body is forwarded, as a
deployment's ``strip_params`` would remove it, except where the engine takes one, vLLM started
with ``--scheduling-policy priority``: then the body carries the request's priority there too,
written in vLLM's sense. **vLLM reads a lower number as earlier handling** (its ``priority``
field: "lower means earlier handling; default: 0"; any value but 0 is an error without
priority scheduling), dgxmm a higher one, so vLLM gets the negated value: a key of priority 10
sends ``"priority": -10``, ahead of a request with 0. A request with nothing to say (priority 0
and no member) is forwarded as it came.
"""

from __future__ import annotations

import json

from dgxmm.front.body import Body
from dgxmm.gateway import bodyparams, toplevel
from dgxmm.gateway.keyrecord import PRIORITY_MAX, PRIORITY_MIN
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.scans import Scans
from dgxmm.records.deployment import Deployment

MEMBER = b'"priority"'  # (a body without these bytes has no such member: nothing to scan)
NAME = "priority"
_NAMES = frozenset({NAME})


def takes_priority(dep: Deployment) -> bool:
    """Whether ``dep``'s engine takes a request's priority: vLLM with ``--scheduling-policy
    priority`` (or ``--scheduling-policy=priority``) in its arguments."""
    if dep.engine != "vllm":
        return False
    args = dep.args
    for at, arg in enumerate(args):
        if arg == "--scheduling-policy=priority":
            return True
        if arg == "--scheduling-policy" and at + 1 < len(args) and args[at + 1] == "priority":
            return True
    return False


def asked(text: str | bytes) -> int:
    """A priority a request asked for (the header's value, a member's JSON text): an integer
    within the bounds, else 400."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, int) or isinstance(value, bool) or not PRIORITY_MIN <= value <= PRIORITY_MAX:
        shown = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise Refused(
            400,
            "invalid_request",
            f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}, got {shown[:40]!r}",
        )
    return value


def granted(key_priority: int, request: int | None) -> int:
    """The request's priority: what it asked for, lowered to its key's; its key's when it asked
    for nothing."""
    return key_priority if request is None else min(request, key_priority)


async def applied(
    scans: Scans, dep: Deployment, endpoint: str, body: Body, header: str | None, key_priority: int
) -> tuple[int, Body | None]:
    """The request's priority, and the body its engine gets (None: the same). Called only when
    there is something to do: the header or the member came, or the key's priority is not 0."""
    request = None if header is None else asked(header)
    if endpoint not in bodyparams.ENDPOINTS:
        return granted(key_priority, request), None
    return await scans.reading(body, lambda: _rewritten(dep, body, request, key_priority))


def _rewritten(dep: Deployment, body: Body, request: int | None, key_priority: int) -> tuple[int, Body | None]:
    members: list[toplevel.Member] = []
    if MEMBER in body:
        top = toplevel.scan(body, _NAMES, every=True)
        if top.shape is not toplevel.Shape.OBJECT:
            return granted(key_priority, request), None
        members = top.members.get(NAME, [])
        if members:
            start, end = members[-1].value  # the last member counts, as a JSON parser reads it
            request = asked(bytes(body[start:end]))
    priority = granted(key_priority, request)
    if takes_priority(dep) and (priority or members):
        params = bodyparams.Params({}, {NAME: bodyparams.encoded(-priority)}, frozenset())
    elif members:
        params = bodyparams.Params({}, {}, _NAMES)
    else:
        return priority, None
    return priority, bodyparams.rewritten(body, params)
