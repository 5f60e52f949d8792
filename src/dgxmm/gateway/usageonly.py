"""A stream's usage-only chunk that the caller did not ask for, held out of what it gets.

The gateway asks the engine for a quota key's stream usage (``quota.with_usage``); when the
client did not ask for it, OpenAI's final chunk that carries only it (``"choices": []`` with
``usage``, as vLLM and llama-server send it) must not reach a client that expects none (some
read ``choices[0]`` of every chunk). The usage reader still reads it: it is fed the engine's
bytes, this only what passes on.

Events pass whole. The bytes after the last event's end in a chunk wait for the rest of their
event (engines write an event in one write, so in practice nothing waits), up to ``MAX_HELD``:
an event longer than that is no usage-only chunk and passes on as it comes, to its end. Only
an event with the word ``"usage"`` in it is parsed.
"""

from __future__ import annotations

import re

import orjson

USAGE = b'"usage"'
MAX_HELD = 64 * 1024  # an unfinished event held back at most this long (a usage chunk is a few hundred)
_EVENT = re.compile(rb".*?\n\r?\n", re.S)  # one event and the blank line that ends it
_END = re.compile(rb"\n\r?\n")


class UsageOnly:
    """Fed the stream's bytes in order (``pass_on``), it returns those to write; ``end`` the rest."""

    __slots__ = ("_held", "_passing")

    def __init__(self) -> None:
        self._held = b""  # the start of an event not yet ended
        self._passing = False  # inside an event too long to hold: it passes to its end

    def pass_on(self, chunk: bytes) -> bytes:
        data = self._held + chunk if self._held else chunk
        self._held = b""
        out = b""
        if self._passing:
            ended = _END.search(data)
            if ended is None:
                return data
            self._passing = False
            out, data = data[: ended.end()], data[ended.end() :]
        lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\n\r\n")
        cut = max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)
        whole, rest = data[:cut], data[cut:]
        if len(rest) > MAX_HELD:
            self._passing = True
            whole, rest = data, b""
        self._held = rest
        if USAGE not in whole:
            return out + whole if out else whole
        return out + b"".join(event for event in _EVENT.findall(whole) if not _usage_only(event)) + whole[cut:]

    def end(self) -> bytes:
        """The stream ended: what was held (an event it cut short) passes on."""
        held, self._held = self._held, b""
        return held


def _usage_only(event: bytes) -> bool:
    """Whether ``event`` is a chunk with ``usage`` and no choices."""
    if USAGE not in event:
        return False
    lines = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
    try:
        data = orjson.loads(b"\n".join(lines))
    except orjson.JSONDecodeError:
        return False
    return isinstance(data, dict) and data.get("choices") == [] and isinstance(data.get("usage"), dict)
