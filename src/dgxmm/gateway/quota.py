"""A caller key's tokens of the day at the gateway: what a request reserves of them from its
admission, the engine's count asked for whatever the client asked, and what it is charged.

Only keys with ``tokens_per_day`` pay for any of this (the key file and the other keys keep
the hot path as it was). A request reserves a bound on its prompt (the length of its JSON body
in bytes: a text prompt never has more tokens than bytes) and on its answer (its own
``max_tokens``, ``max_completion_tokens`` or ``max_output_tokens``, which the engine holds to,
else ``quota_reservation_tokens``); ``CallerKeys.admit`` admits it while the day's count plus
the reservations in flight is below the quota, and the reservation is replaced by what it
cost when it ends. So requests in any number, at once, pass the quota by at most one
request's reservation, as long as none costs more than it reserved (one without its own limit
may, and an image's tokens are not bounded by its bytes: docs/gateway.md says so).

A streamed chat or text completion is sent to the engine with ``stream_options.include_usage``
set (``with_usage``): the engine's count comes in the stream's last chunk, which the client
does not get when it did not ask for it (``usageonly``). An answer without the engine's count
(a caller that hung up before it, an engine that reports none) is charged its reservation:
the most it could have cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from dgxmm.front.body import Body
from dgxmm.gateway import jsonbody, toplevel
from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.toplevel import Shape

LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
NAMES = frozenset({*LIMITS, "stream", "stream_options"})
USAGE_STREAMS = frozenset({"chat/completions", "completions"})  # where include_usage asks for it
NOT_GENERATING = frozenset({"embeddings"})  # their cost is their prompt's
MAX_DIGITS = 12  # a longer limit is no number of tokens an engine holds to
LIMIT_BOUND = 10**MAX_DIGITS
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
ABSENT, ASKED, OTHER = "absent", "asked", "other"  # a body's stream_options: none, asking for usage, else
_MISSING = object()


@dataclass(frozen=True, slots=True)
class Asked:
    """What a request's body says for its quota: its reservation, whether it streams, its
    ``stream_options`` (``ABSENT``, ``ASKED``: an object whose ``include_usage`` is true, else
    ``OTHER``) and where they lie when the scan read the body (None: not looked for)."""

    reservation: Reservation
    stream: bool = False
    options: str = ABSENT
    span: tuple[int, int] | None = None


def asked(body: Body, endpoint: str, default: int) -> Asked:
    """What a request for ``endpoint`` with ``body`` asks (``default``: the answer's bound when
    the body gives none). A small body is read by orjson, as ``jsonbody`` reads it; another by
    the top-level scan, in a worker thread for a large body (``scans.Scans.reading``)."""
    if jsonbody.fast(body):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass  # what orjson refuses, the scan reads
        else:
            if type(data) is not dict:
                return Asked(Reservation(0, default))
            limits = [v for v in (data.get(name) for name in LIMITS) if type(v) is int and 0 <= v < LIMIT_BOUND]
            options = data.get("stream_options", _MISSING)
            kind = ABSENT if options is _MISSING else ASKED if _asks(options) else OTHER
            return Asked(_reserve(body, endpoint, limits, default), data.get("stream") is True, kind)
    top = toplevel.scan(body, NAMES)
    if top.shape is not Shape.OBJECT:
        return Asked(Reservation(0, default))
    spans = top.spans
    limits = [int(raw) for raw in (_raw(body, spans.get(name)) for name in LIMITS) if raw.isdigit()]
    span = spans.get("stream_options")
    kind = ABSENT if span is None else ASKED if _scanned_asks(body, span) else OTHER
    return Asked(_reserve(body, endpoint, limits, default), _raw(body, spans.get("stream")) == b"true", kind, span)


def _reserve(body: Body, endpoint: str, limits: list[int], default: int) -> Reservation:
    """The body's bytes for its prompt, the smallest of its limits (else ``default``) for its answer."""
    return Reservation(len(body), 0 if endpoint in NOT_GENERATING else min(limits, default=default))


def _asks(options: object) -> bool:
    return type(options) is dict and options.get("include_usage") is True


def _scanned_asks(body: Body, span: tuple[int, int]) -> bool:
    if body[span[0]] != ord("{"):
        return False
    inner = toplevel.scan(body, frozenset({"include_usage"}), lo=span[0], hi=span[1]).spans.get("include_usage")
    return _raw(body, inner) == b"true"


def _raw(body: Body, span: tuple[int, int] | None) -> bytes:
    """A value's bytes when they are few (a number of ``MAX_DIGITS`` at most, a literal), else b""."""
    if span is None or span[1] - span[0] > MAX_DIGITS:
        return b""
    return bytes(body[span[0] : span[1]])


def with_usage(body: Body, endpoint: str, asked: Asked) -> Body | None:
    """``body`` asking the engine for the stream's usage (None: no need, it is no streamed
    completion, or the client asked for it itself). Only ``stream_options`` changes: added
    after the object's ``{`` when absent; else ``"include_usage":true`` appended as its last
    member (the last of a repeated key counts, for every engine's parser), or, when it is no
    object, in its place. One copy, as ``modelname.renamed`` makes."""
    if endpoint not in USAGE_STREAMS or not asked.stream or asked.options == ASKED:
        return None
    view = memoryview(body)
    if asked.options == ABSENT:
        at = _first_brace(body) + 1
        return b"".join((view[:at], b'"stream_options":', OPTIONS, b",", view[at:]))
    span = asked.span or toplevel.scan(body, frozenset({"stream_options"})).spans.get("stream_options")
    if span is None:  # (the two readings agree: not reached)
        return None
    start, end = span
    if body[start] != ord("{"):
        return b"".join((view[:start], OPTIONS, view[end:]))
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
