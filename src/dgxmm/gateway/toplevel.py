"""The top level of a JSON body, read without building the document: which members it has
(of the few the gateway asks about) and where their values lie in the bytes.

The gateway decides on a handful of top-level facts (``model``, ``stream``, which structured
output fields are set), yet a body is up to ``max_body_bytes``. Parsing it whole builds a tree
many times its size (16 MiB of ``[{},{},...]`` is 428 MiB of Python objects) in seconds of CPU
that hold the GIL. This scan reads the bytes in pieces of ``PIECE`` with numpy, a few vector
operations per piece: which quotes are escaped (by the length of the backslash run before them),
which bytes lie inside strings (the parity of the unescaped quotes), the nesting depth outside
strings (a running sum of brackets). The top level's own tokens (keys, colons, commas, where a
value begins) are then checked against JSON's grammar of an object, also as arrays. Nested
values are skipped by their brackets and strings, not checked: the engine parses them and
answers what it makes of them. Transient memory is a few times ``PIECE``; numpy's operations
let go of the GIL, so a scan in a worker thread leaves the event loop running.

Of the members asked for, the last of each name counts (as Python's json, orjson and
llama.cpp's nlohmann read a repeated key): its value's span is returned. Keys are compared as
JSON strings: ``"\\u006dodel"`` is ``model``. Bodies are UTF-8 (RFC 8259); a leading UTF-8
byte-order mark is skipped, as nlohmann and Python's json skip it.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

from dgxmm.front.body import Body
import numpy as np

PIECE = 128 * 1024  # bytes scanned at a time: the transient arrays are a few times this
MAX_DEPTH = 512  # deeper nesting is refused: Python engines (vLLM's json) fail past ~900
MAX_GUIDED = 8192  # distinct ``guided_*`` keys followed; past that the body counts as structured
MAX_SCALAR = 64  # a top level that is a bare number or literal longer than this is no JSON
WS = b" \t\n\r"
BOM = b"\xef\xbb\xbf"

# Token kinds of the top level of an object.
BEGIN, OPEN_QUOTE, CLOSE_QUOTE, COLON, COMMA, NESTED, SCALAR, END = range(8)
MAX_CARRY = 8  # tokens of one member at most (a longer unfinished member is not JSON)
MAX_REPEATS = 64  # members of one name listed with ``every`` (a body that repeats one more is refused)

_BRACKET = np.zeros(256, np.int8)
_BRACKET[[ord("{"), ord("[")]] = 1
_BRACKET[[ord("}"), ord("]")]] = -1
_SCALAR = np.ones(256, bool)  # a byte that may be part of a bare number or literal
_SCALAR[list(WS + b'"{}[],:')] = False
_SPACE = np.zeros(256, bool)
_SPACE[list(WS)] = True


class Shape(enum.Enum):
    OBJECT = "object"
    OTHER = "other"  # JSON whose top level is not an object
    NOT_JSON = "not_json"
    TOO_DEEP = "too_deep"  # nested past MAX_DEPTH (whatever follows)


@dataclass(frozen=True, slots=True)
class Member:
    """Where one top-level member lies: the separator before it (the object's ``{`` or a
    comma), its value's span, and the separator after it (a comma or the object's ``}``)."""

    before: int
    value: tuple[int, int]
    after: int


@dataclass
class TopLevel:
    """What a scan found: the body's shape; for an object, the spans of the last value of each
    name asked for (from its first byte to just past its last), and whether some ``guided_*``
    key's last value is not null. With ``every``, ``members`` lists each member of the names
    asked for, in order (``repeated``: one name came more than ``MAX_REPEATS`` times)."""

    shape: Shape
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    guided: bool = False
    members: dict[str, list[Member]] = field(default_factory=dict)
    repeated: bool = False


def scan(
    body: Body, names: frozenset[str], guided: bool = False, lo: int = 0, hi: int | None = None, every: bool = False
) -> TopLevel:
    """The top level of ``body[lo:hi]``: ``names``' value spans; with ``guided``, whether a
    ``guided_*`` member's last value is not null; with ``every``, each member of those names
    (``TopLevel.members``: what a rewrite of the body removes or replaces)."""
    hi = len(body) if hi is None else hi
    start = lo + 3 if lo == 0 and body[:3] == BOM else lo
    while start < hi and body[start] in WS:
        start += 1
    if start == hi:
        return TopLevel(Shape.NOT_JSON)
    first = body[start]
    if first not in b'{["':
        text = body[start:hi].rstrip(WS) if hi - start <= 4 * MAX_SCALAR else b""
        if not text or len(text) > MAX_SCALAR:
            return TopLevel(Shape.NOT_JSON)
        try:
            json.loads(text.decode())  # decoded here: json.loads would take bytes for UTF-16 too
        except ValueError:
            return TopLevel(Shape.NOT_JSON)
        return TopLevel(Shape.OTHER)
    return _Scan(body, start, hi, names, guided if first == ord("{") else False, every).run()


class _Scan:
    """One scan's state, carried from piece to piece."""

    def __init__(self, body: Body, start: int, hi: int, names: frozenset[str], guided: bool, every: bool) -> None:
        self.body, self.start, self.hi = body, start, hi
        self.whole = np.frombuffer(body, np.uint8)
        self.object = body[start] == ord("{")
        self.string = body[start] == ord('"')
        self.names = names
        self.exact = [np.frombuffer(name.encode(), np.uint8) for name in names]
        self.guided = guided
        self.every = every
        self.in_string = False
        self.backslashes = 0  # the run of backslashes that ended the previous piece
        self.depth = 0
        self.scalar = False  # the previous piece ended inside a bare value
        self.end = -1  # where the top-level value ends (its last byte)
        self.pos = np.zeros(0, np.int64)  # tokens of the unfinished member, carried on
        self.kinds = np.zeros(0, np.int8)
        self.found = TopLevel(Shape.OBJECT if self.object else Shape.OTHER)
        self.followed: dict[str, bool] = {}  # guided_* key: its last value is not null

    def run(self) -> TopLevel:
        at = self.start
        while at < self.hi:
            piece = self.whole[at : min(at + PIECE, self.hi)]
            if self.end >= 0:  # past the value: only whitespace may follow
                if not _SPACE[piece].all():
                    return TopLevel(Shape.NOT_JSON)
            else:
                verdict = self._piece(piece, at)
                if verdict is not None:
                    return TopLevel(verdict)
            at += len(piece)
        if self.end < 0:
            return TopLevel(Shape.NOT_JSON)  # unterminated
        self.found.guided = any(self.followed.values()) or len(self.followed) > MAX_GUIDED
        return self.found

    def _piece(self, a: np.ndarray, offset: int) -> Shape | None:
        """Scan one piece (``offset`` in the body); a verdict when it settles the body."""
        n = len(a)
        toggles = np.zeros(n, np.uint8)
        quotes = np.flatnonzero(a == 34)
        if len(quotes):
            toggles[quotes[~self._escaped(a, quotes)]] = 1
        ends_in_bs = a[-1] == 92
        if ends_in_bs:
            run = int(np.argmax(a[::-1] != 92)) if (a != 92).any() else n + self.backslashes
            self.backslashes = run
        else:
            self.backslashes = 0
        inside = np.bitwise_xor.accumulate(toggles)
        if self.in_string:
            inside ^= 1
        self.in_string = bool(inside[-1])
        if self.string:  # a top-level string: it ends at its closing quote
            closing = np.flatnonzero((toggles == 1) & (inside == 0))
            if len(closing):
                self.end = offset + int(closing[0])
                rest = a[closing[0] + 1 :]
                if not _SPACE[rest].all():
                    return Shape.NOT_JSON
            return None
        bracket = np.where(inside == 0, _BRACKET[a], 0).astype(np.int32)
        depth = np.cumsum(bracket, dtype=np.int32)
        depth += self.depth
        closed = np.flatnonzero(depth <= 0)
        stop = int(closed[0]) + 1 if len(closed) else n  # bytes of this piece within the value
        if int(depth[:stop].max()) > MAX_DEPTH:
            return Shape.TOO_DEEP
        if len(closed):
            self.end = offset + stop - 1
            if not _SPACE[a[stop:]].all():
                return Shape.NOT_JSON
            if self.object and a[stop - 1] != ord("}"):
                return Shape.NOT_JSON
        self.depth = int(depth[-1])
        if self.object:
            return self._members(a[:stop], toggles[:stop], inside[:stop], depth[:stop], bracket[:stop], offset)
        return None

    def _escaped(self, a: np.ndarray, quotes: np.ndarray) -> np.ndarray:
        """Which of the ``quotes`` (positions in the piece ``a``) follow an odd run of backslashes."""
        escaped = np.zeros(len(quotes), bool)
        before = np.empty(len(quotes), bool)
        inner = quotes > 0
        before[inner] = a[quotes[inner] - 1] == 92
        before[~inner] = self.backslashes > 0
        if not before.any():
            return escaped
        bs = a == 92
        starts = np.flatnonzero(bs & ~np.concatenate(([self.backslashes > 0], bs[:-1])))
        cand = quotes[before]
        k = np.searchsorted(starts, cand - 1, side="right") - 1
        runs = np.where(k >= 0, cand - starts[np.maximum(k, 0)], cand + self.backslashes)
        escaped[before] = runs % 2 == 1
        return escaped

    def _members(
        self,
        a: np.ndarray,
        toggles: np.ndarray,
        inside: np.ndarray,
        depth: np.ndarray,
        bracket: np.ndarray,
        offset: int,
    ) -> Shape | None:
        """The top level's tokens in this piece, the members they complete checked and read."""
        n = len(a)
        kinds = np.full(n, -1, np.int8)
        level1 = depth == 1
        outside = inside == 0
        quote = (toggles == 1) & level1
        kinds[quote & ~outside] = OPEN_QUOTE
        kinds[quote & outside] = CLOSE_QUOTE
        plain = outside & level1
        kinds[plain & (a == 58)] = COLON
        kinds[plain & (a == 44)] = COMMA
        kinds[(bracket == 1) & (depth == 2)] = NESTED
        bare = plain & _SCALAR[a]
        kinds[bare & ~np.concatenate(([self.scalar], bare[:-1]))] = SCALAR
        self.scalar = bool(bare[-1])
        if offset == self.start:
            kinds[0] = BEGIN
        if self.end >= 0:
            kinds[n - 1] = END
        at = np.flatnonzero(kinds >= 0)
        pos = np.concatenate((self.pos, at + offset))
        kind = np.concatenate((self.kinds, kinds[at]))
        seps = np.flatnonzero((kind == BEGIN) | (kind == COMMA) | (kind == END))
        if len(seps) == 0:
            self.pos, self.kinds = pos, kind
            return Shape.NOT_JSON if len(pos) > MAX_CARRY else None
        if seps[0] != 0:
            return Shape.NOT_JSON
        last = int(seps[-1])
        if kind[last] == END and last != len(kind) - 1:
            return Shape.NOT_JSON
        self.pos, self.kinds = pos[last:], kind[last:]
        if len(self.pos) > MAX_CARRY:
            return Shape.NOT_JSON
        return self._complete(pos, kind, seps)

    def _complete(self, pos: np.ndarray, kind: np.ndarray, seps: np.ndarray) -> Shape | None:
        """Check and read the members between consecutive separators ``seps`` (token indexes)."""
        first, size = seps[:-1], np.diff(seps)
        if len(first) == 0:
            return None
        if len(first) == 1 and size[0] == 1 and kind[first[0]] == BEGIN and kind[seps[-1]] == END:
            return None  # {}
        total = len(kind)

        def at(k: int) -> np.ndarray:
            return np.asarray(kind[np.minimum(first + k, total - 1)])

        string = at(4) == OPEN_QUOTE
        ok = (at(1) == OPEN_QUOTE) & (at(2) == CLOSE_QUOTE) & (at(3) == COLON)
        ok &= np.where(
            string, (size == 6) & (at(5) == CLOSE_QUOTE), (size == 5) & ((at(4) == NESTED) | (at(4) == SCALAR))
        )
        if not ok.all():
            return Shape.NOT_JSON
        key_lo, key_hi = pos[first + 1] + 1, pos[first + 2]
        value_lo = pos[first + 4]
        value_hi = np.where(string, pos[np.minimum(first + 5, total - 1)] + 1, pos[seps[1:]])
        return self._read(key_lo, key_hi, value_lo, value_hi, (pos[first], pos[seps[1:]]))

    def _read(
        self,
        key_lo: np.ndarray,
        key_hi: np.ndarray,
        value_lo: np.ndarray,
        value_hi: np.ndarray,
        separators: tuple[np.ndarray, np.ndarray],
    ) -> Shape | None:
        """Note the members whose keys are asked for, in order (the last of a name wins); a
        verdict when a key is no JSON string. ``separators``: where each member's separators
        before and after it lie."""
        whole, length = self.whole, key_hi - key_lo
        chosen: set[int] = set()
        for raw in self.exact:  # plain keys, compared as arrays: the last match of each name
            match = length == len(raw)
            for i, byte in enumerate(raw):
                idx = np.flatnonzero(match)
                if not len(idx):
                    break
                match[idx[whole[key_lo[idx] + i] != byte]] = False
            hits = np.flatnonzero(match)
            if len(hits):
                chosen.update(hits[-MAX_REPEATS - 1 :].tolist() if self.every else (int(hits[-1]),))
        if self.guided:
            match = length >= 7
            for i, byte in enumerate(b"guided_"):
                idx = np.flatnonzero(match)
                match[idx[whole[key_lo[idx] + i] != byte]] = False
            chosen.update(np.flatnonzero(match).tolist())
        escaped = np.flatnonzero(_has_backslash(whole, key_lo, key_hi))
        chosen.update(escaped.tolist())
        if not chosen:
            return None
        data, order = self.body, np.array(sorted(chosen))
        # Decoded in one call (a key with escapes is read as JSON reads it; invalid UTF-8 in one
        # becomes lone surrogates, which name nothing asked for): per key, Python would take
        # seconds for a body of a million short escaped keys.
        spans = zip((key_lo[order] - 1).tolist(), (key_hi[order] + 1).tolist(), strict=True)
        joined = b",".join([data[lo:hi] for lo, hi in spans])
        try:
            decoded = json.loads("[" + joined.decode("utf-8", "surrogateescape") + "]")
        except ValueError:
            return Shape.NOT_JSON  # a key with an invalid escape: no JSON document
        for i, key in zip(order.tolist(), decoded, strict=True):
            if key not in self.names and not (self.guided and key.startswith("guided_")):
                continue
            vlo, vhi = int(value_lo[i]), int(value_hi[i])
            while data[vhi - 1] in WS:
                vhi -= 1
            if key in self.names:
                self.found.spans[key] = (vlo, vhi)
                if self.every:
                    self._list(key, Member(int(separators[0][i]), (vlo, vhi), int(separators[1][i])))
            if self.guided and key.startswith("guided_") and (key in self.followed or len(self.followed) <= MAX_GUIDED):
                self.followed[key] = data[vlo:vhi] != b"null"
        return None

    def _list(self, key: str, member: Member) -> None:
        listed = self.found.members.setdefault(key, [])
        if len(listed) < MAX_REPEATS:
            listed.append(member)
        else:
            self.found.repeated = True


def _has_backslash(whole: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Which of the spans ``lo:hi`` of ``whole`` (keys) hold a backslash. All but the first
    lie in the piece being read, and are counted at once by a running count over it; the first
    may have begun pieces before (its member was carried on), and is looked at alone."""
    out = np.zeros(len(lo), bool)
    if not len(lo):
        return out
    out[0] = 92 in whole[int(lo[0]) : int(hi[0])]
    if len(lo) > 1:
        begin, finish = int(lo[1:].min()), int(hi[1:].max())
        count = np.concatenate(([0], np.cumsum(whole[begin:finish] == 92, dtype=np.int32)))
        out[1:] = count[hi[1:] - begin] > count[lo[1:] - begin]
    return out
