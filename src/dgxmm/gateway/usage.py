"""What an answer cost, read from the engine's bytes as they pass to the caller: the ``usage``
an OpenAI-compatible engine reports (prompt and completion tokens), and llama-server's
``timings`` (its own generation speed) where present.

Nothing is held back or copied for it: a JSON answer's ``usage`` is read from the whole answer
once it has been sent (an answer that came in one read, which most non-streaming ones do), and a
stream's from the events that carry one (the final chunk, when the caller asked for
``stream_options.include_usage``; llama-server also sends ``timings`` there). Each chunk is
searched for the word ``"usage"`` and nothing else is parsed, so a long stream costs one search
per chunk. An answer longer than ``MAX_JSON`` read in pieces is not parsed at all.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

MARK = b'"usage"'
TIMINGS = b'"timings"'
MAX_JSON = 4 * 1024 * 1024  # a JSON answer read in pieces is gathered up to this for its usage
MAX_LINE = 1024 * 1024  # a stream's unfinished line is carried over up to this


class UsageReader:
    """Fed the answer's body bytes in order (``feed``), or the whole body at once (``whole``)."""

    __slots__ = ("_carry", "_json", "_size", "completion_tokens", "engine_tps", "prompt_tokens", "stream")

    def __init__(self, stream: bool) -> None:
        self.stream = stream  # an event stream (else one JSON answer)
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.engine_tps: float | None = None  # the engine's own generation speed (llama-server's timings)
        self._carry = b""
        self._json: list[bytes] | None = [] if not stream else None
        self._size = 0

    def whole(self, body: bytes) -> None:
        """The whole answer at once (a JSON answer sent in one write)."""
        if self.stream:
            self.feed(body)
        elif MARK in body or TIMINGS in body:
            self._take(_loads(body))

    def feed(self, chunk: bytes) -> None:
        if not self.stream:
            if self._json is not None:
                self._json.append(chunk)
                self._size += len(chunk)
                if self._size > MAX_JSON:
                    self._json = None  # too long to be worth parsing
            return
        if self._carry:
            chunk, self._carry = self._carry + chunk, b""
        cut = chunk.rfind(b"\n") + 1
        if cut < len(chunk):
            rest = chunk[cut:]
            self._carry = rest if len(rest) <= MAX_LINE else b""
            chunk = chunk[:cut]
        if MARK not in chunk and TIMINGS not in chunk:
            return
        for line in chunk.split(b"\n"):
            if line.startswith(b"data:") and (MARK in line or TIMINGS in line):
                self._take(_loads(line[5:].strip()))

    def end(self) -> None:
        """The answer ended: a JSON answer read in pieces is read now."""
        if not self.stream and self._json:
            body = b"".join(self._json)
            self._json = None
            if MARK in body or TIMINGS in body:
                self._take(_loads(body))
        elif self._carry:
            carry, self._carry = self._carry, b""
            self.feed(carry + b"\n")

    def _take(self, data: Any) -> None:
        if not isinstance(data, dict):
            return
        usage = data.get("usage")
        if isinstance(usage, dict):
            prompt = usage.get("prompt_tokens", usage.get("input_tokens"))  # OpenAI's, or Anthropic's names
            completion = usage.get("completion_tokens", usage.get("output_tokens"))
            if isinstance(prompt, int) and not isinstance(prompt, bool):
                self.prompt_tokens = prompt
            if isinstance(completion, int) and not isinstance(completion, bool):
                self.completion_tokens = completion
        timings = data.get("timings")
        if isinstance(timings, dict):
            speed = timings.get("predicted_per_second")
            if isinstance(speed, int | float) and not isinstance(speed, bool) and speed > 0:
                self.engine_tps = float(speed)


def _loads(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):
            return None
