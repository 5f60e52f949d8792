"""What the gateway reads of a JSON request body: its shape, the ``model`` it names, whether it
streams and whether it asks for structured output; never more, and nothing kept but these.

Two ways to the same facts. A small body (at most ``FAST_BYTES``, and too few brackets to nest
past ``toplevel.MAX_DEPTH``) is parsed by orjson, the fastest reading of the usual request (the
hot path of docs/performance.md), and the tree is dropped at once. Anything else, and whatever
orjson refuses (NaN, lone surrogates, invalid UTF-8 in a string, a byte-order mark, JSON that
is not), is read by the top-level scan (``toplevel``), which builds nothing. Where both apply
they agree (tests/unit/test_jsonbody.py holds them to it on generated bodies): the fast path is
only faster.

The facts are those of ``notice.wants_structured_output`` and of the router's lookup: ``model``
a string, ``stream`` exactly ``true``, a structured field present and not null, ``text.format``
an object whose ``type`` is not ``"text"``. A small body's ``structured`` is worked out when a
request first needs it (one that waits for a slot), so a ready model's request never pays for it.
"""

from __future__ import annotations

import json

import orjson

from dgxmm.front.body import Body
from dgxmm.gateway import notice, toplevel
from dgxmm.gateway.toplevel import MAX_DEPTH, Shape

FAST_BYTES = 64 * 1024  # bodies orjson may read (larger ones are scanned, in a worker thread)
KEEPS = ("keep_alive", "ttl")  # a caller's idle timer for its model (gateway/keepalive.py), never forwarded
NAMES = frozenset({"model", "stream", "text", *KEEPS, *notice.STRUCTURED_FIELDS})


class Facts:
    """A body's facts. ``model``: the last top-level ``model`` when it is a string, else None;
    ``structured``: None until worked out; ``span``: where the model's value lies in the body
    (None when it was not looked for); ``keeps``: a top-level ``keep_alive`` or ``ttl`` is there."""

    __slots__ = ("keeps", "model", "shape", "span", "stream", "structured")

    def __init__(
        self,
        shape: Shape,
        model: str | None = None,
        stream: bool = False,
        structured: bool | None = False,
        span: tuple[int, int] | None = None,
        keeps: bool = False,
    ) -> None:
        self.shape = shape
        self.model = model
        self.stream = stream
        self.structured = structured
        self.span = span
        self.keeps = keeps

    def __repr__(self) -> str:
        return f"Facts({self.shape.value}, model={self.model!r}, stream={self.stream}, structured={self.structured}, keeps={self.keeps})"


NOT_JSON = Facts(Shape.NOT_JSON)
OTHER = Facts(Shape.OTHER)


def fast(body: Body) -> bool:
    """Whether orjson may read ``body``: small, and it cannot nest past MAX_DEPTH (JSON nests at
    most half its length deep, and never deeper than it has brackets)."""
    size = len(body)
    return size <= FAST_BYTES and (size <= 2 * MAX_DEPTH or body.count(b"[") + body.count(b"{") <= MAX_DEPTH)


def read(body: Body) -> Facts:
    """The facts of ``body``: orjson's reading when it may and can, else the scan's."""
    if not body:
        return NOT_JSON
    if fast(body):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return scanned(body)
        if type(data) is not dict:
            return OTHER
        model = data.get("model")
        keeps = "keep_alive" in data or "ttl" in data
        return Facts(Shape.OBJECT, model if type(model) is str else None, data.get("stream") is True, None, None, keeps)
    return scanned(body)


def structured(body: Body, facts: Facts) -> bool:
    """Whether the request asks for structured output (facts read by the fast path leave it to
    here: the body is parsed again, which only a request that waits pays for)."""
    if facts.structured is None:
        facts.structured = notice.wants_structured_output(orjson.loads(body))
    return facts.structured


def model_span(body: Body, facts: Facts) -> tuple[int, int] | None:
    """Where the value of ``body``'s last top-level ``model`` lies (the scan's, when the fast
    path read the body)."""
    if facts.span is None and facts.model is not None:
        facts.span = toplevel.scan(body, frozenset({"model"})).spans.get("model")
    return facts.span


def scanned(body: Body) -> Facts:
    """The facts by the top-level scan: nothing but the values asked for is decoded."""
    top = toplevel.scan(body, NAMES, guided=True)
    if top.shape is not Shape.OBJECT:
        return NOT_JSON if top.shape is Shape.NOT_JSON else Facts(top.shape)
    spans = top.spans
    model: str | None = None
    span = spans.get("model")
    if span is not None:
        value = _string(body, span)
        model = value if isinstance(value, str) else None
    stream = "stream" in spans and _raw(body, spans["stream"]) == b"true"
    wanted = top.guided or any(
        name in spans and _raw(body, spans[name]) != b"null" for name in notice.STRUCTURED_FIELDS
    )
    keeps = "keep_alive" in spans or "ttl" in spans
    return Facts(Shape.OBJECT, model, stream, wanted or _text_format(body, spans.get("text")), span, keeps)


def _raw(body: Body, span: tuple[int, int]) -> bytes:
    """A value's bytes, at most 8 (enough to tell ``true`` and ``null``)."""
    return bytes(body[span[0] : min(span[1], span[0] + 8)]) if span[1] - span[0] <= 8 else b"<long>"


def _string(body: Body, span: tuple[int, int]) -> object:
    """The value at ``span`` when it is a JSON string (None when it is not, or is no valid one)."""
    if body[span[0]] != ord('"'):
        return None
    try:
        return json.loads(body[span[0] : span[1]])
    except ValueError:  # an invalid escape, or invalid UTF-8: names no model
        return None


def _text_format(body: Body, span: tuple[int, int] | None) -> bool:
    """``text.format`` is an object whose ``type`` is not ``"text"`` (the Responses API's
    structured output), read by scanning the two objects on the way."""
    if span is None or body[span[0]] != ord("{"):
        return False
    fmt = toplevel.scan(body, frozenset({"format"}), lo=span[0], hi=span[1]).spans.get("format")
    if fmt is None or body[fmt[0]] != ord("{"):
        return False
    kind = toplevel.scan(body, frozenset({"type"}), lo=fmt[0], hi=fmt[1]).spans.get("type")
    return kind is not None and _string(body, kind) != "text"
