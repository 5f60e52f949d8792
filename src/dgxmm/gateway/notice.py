"""The queued notice: what a request that must wait for memory is told, and where.

Streaming chat/completions and completions get one SSE chunk (``id: "ondemand-queued"``) at
once; non-streaming chat, completions and Responses answers get the notice prepended to their
text, with the rest of the engine's bytes left exactly as they were. Requests that ask for
structured output never get a notice, so their clients can parse what they asked for.
"""

from __future__ import annotations

import json
import time
from typing import Any

NOTICE = "(The model is being loaded on demand; it had to wait for memory. The answer follows.)\n\n"

STRUCTURED_FIELDS = ("response_format", "tools", "tool_choice", "functions", "function_call", "structured_outputs")


def wants_structured_output(body: Any) -> bool:
    if not isinstance(body, dict):
        return False
    if any(body.get(name) is not None for name in STRUCTURED_FIELDS):
        return True
    if any(name.startswith("guided_") and value is not None for name, value in body.items()):
        return True
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    return isinstance(fmt, dict) and fmt.get("type", "text") != "text"


def stream_chunk(endpoint: str, model: str) -> bytes:
    """The one SSE chunk a queued streaming chat/completions or completions request gets."""
    created = int(time.time())
    if endpoint == "chat/completions":
        chunk: dict[str, Any] = {
            "id": "ondemand-queued",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": NOTICE}, "logprobs": None, "finish_reason": None}
            ],
        }
    else:
        chunk = {
            "id": "ondemand-queued",
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "text": NOTICE, "logprobs": None, "finish_reason": None}],
        }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


# Where the notice goes in a non-streaming answer, as a path of keys and list indexes.
_TARGETS: dict[str, list[tuple[Any, ...]]] = {
    "chat/completions": [("choices", 0, "message", "content")],
    "completions": [("choices", 0, "text")],
}


def prepend(endpoint: str, raw: bytes) -> bytes:
    """The engine's JSON answer with the notice prepended to its text; unchanged when there is
    no such text (a tool-call answer with null content, an error, another endpoint)."""
    try:
        text = raw.decode("utf-8")
        body = json.loads(text)  # only a whole, valid document is touched
        if not isinstance(body, dict):
            return raw
        if endpoint == "responses":
            path = _responses_target(body)
        else:
            path = next(iter(_TARGETS.get(endpoint, [])), None)
        if path is None:
            return raw
        start = _string_start(text, path)
    except (UnicodeDecodeError, ValueError, LookupError, TypeError, RecursionError):
        return raw
    if start is None:
        return raw
    escaped = json.dumps(NOTICE)[1:-1]
    return (text[: start + 1] + escaped + text[start + 1 :]).encode("utf-8")


def _responses_target(body: dict[str, Any]) -> tuple[Any, ...] | None:
    """The first output_text part of the first message item of a Responses answer."""
    for i, item in enumerate(body.get("output") or []):
        if isinstance(item, dict) and item.get("type") == "message":
            for j, part in enumerate(item.get("content") or []):
                if isinstance(part, dict) and part.get("type") == "output_text":
                    return ("output", i, "content", j, "text")
            return None
    return None


_decoder = json.JSONDecoder()


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _string_start(text: str, path: tuple[Any, ...]) -> int | None:
    """Index of the opening quote of the string value at ``path``, walking the raw JSON text
    (so everything around it keeps its exact bytes); None if that value is not a string."""
    i = _skip_ws(text, 0)
    for step in path:
        if isinstance(step, str):
            if text[i] != "{":
                return None
            i = _skip_ws(text, i + 1)
            while True:
                if text[i] == "}":
                    return None
                key, i = _decoder.raw_decode(text, i)
                i = _skip_ws(text, i)
                i = _skip_ws(text, i + 1)  # past ':'
                if key == step:
                    break
                _, i = _decoder.raw_decode(text, i)
                i = _skip_ws(text, i)
                if text[i] == ",":
                    i = _skip_ws(text, i + 1)
        else:
            if text[i] != "[":
                return None
            i = _skip_ws(text, i + 1)
            for _ in range(step):
                if text[i] == "]":
                    return None
                _, i = _decoder.raw_decode(text, i)
                i = _skip_ws(text, i)
                if text[i] == ",":
                    i = _skip_ws(text, i + 1)
            if text[i] == "]":
                return None
    return i if text[i] == '"' else None
