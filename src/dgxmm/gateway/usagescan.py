"""What an answer cost, read from the engine's bytes as they pass to the caller: the ``usage``
an OpenAI-compatible engine reports (prompt and completion tokens), and llama-server's
``timings`` (its own generation speed) where present.

Nothing of the answer is held for it, whatever its size: the bytes are searched for the keys
``"usage"`` and ``"timings"``, and only the object after each (at most ``CAP`` bytes; both are
a few hundred) is parsed. A key's closing quote in those bytes ends a JSON string (a quote
inside a string is escaped), so text a model wrote cannot pass for one: its strings are
values, never followed by ``:`` and ``{``. One reading for every shape: a JSON answer of any
size (vLLM puts ``usage`` after the choices, llama-server near the end), a stream's final
chunk (when ``stream_options.include_usage`` asked for it), a Responses API stream's
``response.usage``, Anthropic's ``message.usage`` then ``usage`` of ``message_delta``. Each
object found sets the counts it has, so a later one (a stream's last) wins. A stream's chunk
costs two searches; only the bytes after a key cut by a chunk's end are carried to the next.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

USAGE = b'"usage"'
TIMINGS = b'"timings"'
CAP = 4096  # bytes after a key read for its object (usage and timings objects are far smaller)
EDGE = len(TIMINGS) - 1  # the last bytes of a chunk that may begin a key cut by its end
WS = b" \t\r\n"
_DECODER = json.JSONDecoder()


class UsageReader:
    """Fed the answer's body bytes in order (``feed``), or the whole body at once (``whole``)."""

    __slots__ = ("_carry", "completion_tokens", "engine_tps", "prompt_tokens", "stream")

    def __init__(self, stream: bool) -> None:
        self.stream = stream  # an event stream (else one JSON answer)
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.engine_tps: float | None = None  # the engine's own generation speed (llama-server's timings)
        self._carry = b""  # the end of the bytes so far: a key cut by it, or an object not yet whole

    def whole(self, body: bytes) -> None:
        """The whole answer at once (an answer sent in one write)."""
        if self._carry:
            self.feed(body)
            self.end()
        elif USAGE in body or TIMINGS in body:
            self._read(body, final=True)

    def feed(self, chunk: bytes) -> None:
        carry = self._carry
        if carry:
            self._carry = self._read(carry + chunk, final=False)
        elif USAGE in chunk or TIMINGS in chunk:
            self._carry = self._read(chunk, final=False)
        else:
            self._carry = _edge(chunk)

    def end(self) -> None:
        """The answer ended: an object cut short by it is read as far as it came."""
        if self._carry:
            carry, self._carry = self._carry, b""
            self._read(carry, final=True)

    def _read(self, data: bytes, final: bool) -> bytes:
        """Take every key's object in ``data``; returns what to carry to the next chunk: from the
        first key whose object may still be coming, else the start of a key cut by the end."""
        at = 0
        while True:
            usage, timings = data.find(USAGE, at), data.find(TIMINGS, at)
            if usage < 0 and timings < 0:
                return b"" if final else _edge(data)
            found, mark = (timings, TIMINGS) if usage < 0 or 0 <= timings < usage else (usage, USAGE)
            value, settled = _object_after(data, found + len(mark))
            if value is None and not settled and not final and len(data) - found < CAP:
                return data[found:]  # the rest of its object may come with the next chunk
            if value is not None and mark is USAGE:
                self._take_usage(value)
            elif value is not None:
                self._take_timings(value)
            at = found + len(mark)

    def _take_usage(self, usage: dict[str, Any]) -> None:
        prompt = usage.get("prompt_tokens", usage.get("input_tokens"))  # OpenAI's, or Anthropic's names
        completion = usage.get("completion_tokens", usage.get("output_tokens"))
        if isinstance(prompt, int) and not isinstance(prompt, bool):
            self.prompt_tokens = prompt
        if isinstance(completion, int) and not isinstance(completion, bool):
            self.completion_tokens = completion

    def _take_timings(self, timings: dict[str, Any]) -> None:
        speed = timings.get("predicted_per_second")
        if isinstance(speed, int | float) and not isinstance(speed, bool) and speed > 0:
            self.engine_tps = float(speed)

    @property
    def reported(self) -> bool:
        """Whether the engine reported any usage."""
        return self.prompt_tokens is not None or self.completion_tokens is not None


def _object_after(data: bytes, at: int) -> tuple[dict[str, Any] | None, bool]:
    """The JSON object that is the value of the key ending at ``at`` (read from at most ``CAP``
    bytes), and whether that is settled: True when it was read or can never be one (the key is
    no member's, or its value no object); False when the bytes end before it does."""
    end = min(len(data), at + CAP)
    while at < end and data[at] in WS:
        at += 1
    if at == end:
        return None, False
    if data[at] != ord(":"):
        return None, True
    at += 1
    while at < end and data[at] in WS:
        at += 1
    if at == end:
        return None, False
    if data[at] != ord("{"):
        return None, True
    flat = data.find(b"}", at, end) + 1  # the end of an object with none inside it (the usual usage)
    if flat:
        try:
            value: dict[str, Any] = orjson.loads(data[at:flat])
        except orjson.JSONDecodeError:
            pass  # an object inside it, or none at all
        else:
            return value, True
    try:
        value = _DECODER.raw_decode(data[at:end].decode("utf-8", "replace"))[0]
    except (ValueError, RecursionError):
        return None, False
    return value, True


def _edge(data: bytes) -> bytes:
    """The start of a key cut by the end of ``data`` (its last quote, when a key begins so), else
    nothing: a chunk that ends in no such start is carried as nothing."""
    quote = data.rfind(b'"', -EDGE)
    if quote < 0:
        return b""
    tail = data[quote:]
    return tail if USAGE.startswith(tail) or TIMINGS.startswith(tail) else b""
