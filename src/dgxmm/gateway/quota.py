"""A caller key's tokens of the day at the gateway: what a request reserves of them from its
admission, the engine's count asked for whatever the client asked, and what it is charged.

Only keys with ``tokens_per_day`` pay for any of this (the key file and the other keys keep
the hot path as it was). A request reserves a bound on its prompt (the length of its JSON body
in bytes: a text prompt never has more tokens than bytes) and on its answer (its own
``max_tokens``, ``max_completion_tokens`` or ``max_output_tokens``, which the engine holds to,
else ``quota_reservation_tokens``); ``CallerKeys.admit`` admits it while the day's count plus
the reservations in flight is below the quota, and the reservation is replaced by what it
cost when it ends. So requests in any number, at once, pass the quota by at most one
request's reservation.

A streamed chat or text completion is sent to the engine with ``stream_options.include_usage``
set (``with_usage``): the engine's count comes in the stream's last chunk, which the client
does not get when it did not ask for it (``usageonly``). An answer without the engine's count
(a caller that hung up before it, an engine that reports none) is charged its reservation:
the most it could have cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from dgxmm.front.body import Body
from dgxmm.gateway import toplevel
from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.toplevel import Shape, TopLevel

LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
NAMES = frozenset({*LIMITS, "stream", "stream_options"})
USAGE_STREAMS = frozenset({"chat/completions", "completions"})  # where include_usage asks for it
NOT_GENERATING = frozenset({"embeddings"})  # their cost is their prompt's
MAX_DIGITS = 12  # a longer limit is no number of tokens an engine holds to
OPTIONS = b'{"include_usage":true}'
MEMBER = b'"include_usage":true'


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a request holds of its key's quota while in flight: bounds on its prompt's and its
    answer's tokens."""

    prompt: int
    completion: int

    @property
    def tokens(self) -> int:
        return self.prompt + self.completion


NONE = Reservation(0, 0)


@dataclass(frozen=True, slots=True)
class Asked:
    """What a request's body says for its quota: its reservation, and its top level (None: no
    JSON object) for ``with_usage``."""

    reservation: Reservation
    top: TopLevel | None


def asked(body: Body, endpoint: str, default: int) -> Asked:
    """The reservation of a request for ``endpoint`` with ``body`` (``default``: the answer's
    bound when the body gives none). Reads the body's top level: in a worker thread for a large
    body (the gateway's ``_off_loop``)."""
    top = toplevel.scan(body, NAMES)
    if top.shape is not Shape.OBJECT:
        return Asked(Reservation(0, default), None)
    completion = 0 if endpoint in NOT_GENERATING else _limit(body, top) or default
    return Asked(Reservation(len(body), completion), top)


def _limit(body: Body, top: TopLevel) -> int | None:
    """The request's own bound on its answer: the smallest of its limits that is a whole number."""
    found = []
    for name in LIMITS:
        span = top.spans.get(name)
        if span is not None and span[1] - span[0] <= MAX_DIGITS:
            raw = bytes(body[span[0] : span[1]])
            if raw.isdigit():
                found.append(int(raw))
    return min(found, default=None)


def with_usage(body: Body, endpoint: str, top: TopLevel | None) -> Body | None:
    """``body`` asking the engine for the stream's usage (None: no need, it is no streamed
    completion, or the client asked for it itself). Only ``stream_options`` changes: added
    after the object's ``{`` when absent; else ``"include_usage":true`` appended as its last
    member (the last of a repeated key counts, for every engine's parser), or, when it is no
    object, in its place. One copy, as ``modelname.renamed`` makes."""
    if top is None or endpoint not in USAGE_STREAMS:
        return None
    stream = top.spans.get("stream")
    if stream is None or bytes(body[stream[0] : stream[1]]) != b"true":
        return None
    view = memoryview(body)
    span = top.spans.get("stream_options")
    if span is None:
        at = _first_brace(body) + 1
        return b"".join((view[:at], b'"stream_options":', OPTIONS, b",", view[at:]))
    start, end = span
    if body[start] != ord("{"):
        return b"".join((view[:start], OPTIONS, view[end:]))
    asked_for = toplevel.scan(body, frozenset({"include_usage"}), lo=start, hi=end).spans.get("include_usage")
    if asked_for is not None and bytes(body[asked_for[0] : asked_for[1]]) == b"true":
        return None
    empty = not bytes(body[start + 1 : end - 1]).strip()
    return b"".join((view[: end - 1], MEMBER if empty else b"," + MEMBER, view[end - 1 :]))


def _first_brace(body: Body) -> int:
    """Where a JSON object's ``{`` is (only a byte-order mark and white space come before it)."""
    at = 0
    while body[at] != ord("{"):
        at += 1
    return at


def charged(ex: Exchange, reservation: Reservation) -> tuple[int, int]:
    """What a request with a quota costs its key: the engine's count; without one, its
    reservation when the engine's answer began (it may have cost that much), else nothing."""
    usage = ex.usage
    if usage is not None and usage.reported:
        return usage.prompt_tokens or 0, usage.completion_tokens or 0
    if ex.engine_byte and 200 <= ex.status < 300 and ex.code is None:
        return reservation.prompt, reservation.completion
    return 0, 0
