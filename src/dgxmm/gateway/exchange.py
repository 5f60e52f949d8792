"""One gateway request as the metrics and the access log see it, and its request id.

The gateway fills an ``Exchange`` as the request goes (which deployment, which route, the status,
when the first byte left) and hands it to ``Metrics.exchange_done`` and the access log once at
the end: the hot path only sets a few attributes. ``__slots__`` keeps that cheap.

A request id is the caller's ``x-request-id`` when it looks like one (1 to 128 characters of
letters, digits and ``._:/+=@-``: ids of this shape cannot break a log line or a header), else
one generated here: a random prefix drawn at start-up and a counter, unique within this process
and cheaper than a UUID per request.
"""

from __future__ import annotations

import itertools
import re
import secrets
from typing import Protocol

from dgxmm.gateway.keyrecord import CallerKey
from dgxmm.gateway.usagescan import UsageReader
from dgxmm.gateway.usageonly import UsageOnly


HEADER = b"x-request-id"
KEPT_HEADER = b"x-dgxmm-keep-alive"  # what was kept of a caller's keep_alive or ttl (gateway/keepalive.py)
_SANE = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")
_PREFIX = secrets.token_hex(4)
_COUNTER = itertools.count(1)

# Routes, as metric label values: the traffic endpoints, "models", "model", and these two.
HEALTH_CHECK = "health_check"
OTHER = "other"
GONE = 499  # nginx's code for a client that hung up before it got an answer


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The caller's sane ``x-request-id`` (of the request's ``headers``), else a new one."""
    for name, value in headers:
        if name == HEADER:
            return request_id_of(value)
    return request_id_of(None)


def request_id_of(given: bytes | None) -> str:
    """``given`` (the caller's first ``x-request-id``) when it is sane, else a new id."""
    if given is not None:
        text = given.decode("latin-1")
        if _SANE.fullmatch(text):
            return text
    return f"{_PREFIX}{next(_COUNTER):08x}"


MAX_MODEL = 200  # characters of the model a caller named that the record and the log keep


def model_given(name: str) -> str:
    """The name a caller gave the router, as the record and the log keep it: at most
    ``MAX_MODEL`` characters, anything unprintable (a control character) as ``?``."""
    return "".join(c if c.isprintable() else "?" for c in name[:MAX_MODEL])


class Exchange:
    """A request's facts; times are ``time.monotonic()``, 0.0 for "did not happen"."""

    __slots__ = (
        "api",
        "arrival",
        "between_events",
        "bytes",
        "caller",
        "code",
        "cold",
        "deployment_id",
        "engine_byte",
        "first_byte",
        "held",
        "keep_alive",
        "kept_note",
        "keyed",
        "model",
        "observed",
        "peer",
        "priority",
        "request_id",
        "route",
        "served_name",
        "slot_at",
        "status",
        "unasked",
        "usage",
    )

    def __init__(self, arrival: float, request_id: str, peer: str) -> None:
        self.arrival = arrival
        self.request_id = request_id
        self.peer = peer
        self.route = OTHER
        self.api = "openai"  # the API it came in by (``request.Dialect``): "openai" or "ollama"
        self.deployment_id: str | None = None  # set once the deployment is known
        self.served_name: str | None = None
        self.model: str | None = None  # the model the caller named (the router's), ``model_given``
        self.status = 0  # 0 until an answer began
        self.code: str | None = None  # the error code when dgxmm refused or failed the request
        self.first_byte = 0.0  # the first body byte to the caller (the queued notice counts)
        self.engine_byte = 0.0  # the first body byte from the engine passed on
        self.bytes = 0  # body bytes from the engine passed on
        self.cold = False  # it waited for its model to start (no slot at once)
        self.held = 0  # bytes of its body counted in the gateway's body budget
        self.keep_alive: float | None = None  # seconds its caller asked the model to stay once idle (keepalive.py)
        self.kept_note: bytes | None = None  # what was kept of it, the answer's ``keepalive.HEADER``
        self.keyed = False  # it passed the key check: recorded one by one (else summarised)
        self.observed = False  # the traffic observer (the history) was told of it, and is told of its end
        self.caller: CallerKey | None = None  # whose key it showed (callerkeys.KEY_FILE: the key file's)
        self.priority = 0  # its priority (reqpriority.py): its key's, or less if it asked for less
        self.slot_at = 0.0  # when it got its slot, after waiting for one (a start, memory)
        self.usage: UsageReader | None = None  # what the answer cost, read as it passed
        # Its answer is an event stream whose bytes so far end between two events (an error
        # event appended is read as one): told when a request is ended under way (``refusal.ended``).
        self.between_events = False
        self.unasked: UsageOnly | None = None  # holds out the usage chunk dgxmm asked for (quota.with_usage)

    def tokens_per_s(self, now: float) -> float | None:
        """The answer's generation speed, ended at ``now``: generation tokens over generation
        time. The engine's own figure where it reports one (llama-server's ``timings``), else,
        for a stream, its completion tokens from the engine's first byte (its first token) to
        ``now`` (its last): the wait for a slot, a cold start and the queued notice are the
        record's ``queued_s`` and ``ttft_s``, never inside the rate. None where it cannot be
        known: no completion tokens, too little time to divide by, or an answer sent whole
        without the engine's figure (its bytes came at once: when generation began is unknown)."""
        usage = self.usage
        if usage is None or not usage.completion_tokens:
            return None
        if usage.engine_tps is not None:
            return usage.engine_tps
        if not usage.stream or not self.engine_byte:
            return None
        took = now - self.engine_byte
        return usage.completion_tokens / took if took > 1e-3 else None

    @property
    def failed(self) -> bool:
        """It ended with an error answer: dgxmm refused or failed it (``code``), or the engine
        answered an error status. A caller that hung up got no answer, which is no error of the
        model's or the key's (its status is 0 here, or ``GONE`` once finished)."""
        return self.code is not None or 400 <= self.status != GONE

    @property
    def key(self) -> str | None:
        """The name of the key it showed (``"key-file"`` for the key file's), None before the check."""
        caller = self.caller
        return None if caller is None else caller.name

    @property
    def header(self) -> tuple[bytes, bytes]:
        """The ``x-request-id`` header of every answer."""
        return (HEADER, self.request_id.encode())

    def own_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """``headers`` (an engine's answer's, passed on) with dgxmm's own for this request added:
        what was kept of the caller's keep_alive, where it asked for one."""
        if self.kept_note is not None:
            headers.append((KEPT_HEADER, self.kept_note))
        return headers


class Finish(Protocol):
    """How a gateway request's end is recorded, once: its metrics and its access line (dgxmm's
    telemetry implements it, ``telemetry.access.Finisher``); a request that was not ``keyed``
    is counted and summarised, not recorded one by one. A request that got no answer is
    recorded with the status ``GONE``."""

    def __call__(self, method: str, path: str, ex: Exchange) -> None: ...


def unrecorded(method: str, path: str, ex: Exchange) -> None:
    """The finish of a gateway built without one (tests): nothing is kept."""
    if not ex.status:
        ex.status = GONE
