"""The engine's OpenAI answers as Ollama's: pure functions and one stream translator.

A streamed answer is NDJSON: one object a line per piece of text (``message.content`` for chat,
``response`` for generate; the engine's reasoning as ``thinking``), the tool calls once complete
(arguments as objects, as Ollama sends them), then the final object with ``done: true``,
``done_reason`` and the counts and durations (nanoseconds) of ``Times``. An error, whether
dgxmm's envelope or the engine's, is ``{"error": "..."}``; inside a stream that began, it is the
last line. The queued notice of the OpenAI routes (``gateway.notice``) never shows: Ollama's
format has no place for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dgxmm.gateway.notice import NOTICE

NOTICE_ID = "ondemand-queued"
_REASONS = frozenset({"tool_calls", "function_call"})


def now_iso() -> str:
    """Ollama's ``created_at``: RFC 3339 in UTC."""
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def error_line(message: str) -> bytes:
    return json.dumps({"error": message}).encode() + b"\n"


def error_text(raw: bytes | bytearray) -> str:
    """The message of an error answer, dgxmm's envelope or an engine's (OpenAI's or another)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return raw.decode("utf-8", "replace")[:500] or "the engine answered an error"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    detail = body.get("detail") if isinstance(body, dict) else None  # FastAPI's (vLLM's) shape
    return str(detail if detail is not None else body)[:500]


@dataclass(frozen=True)
class Times:
    """When the request came (``arrival``), got its slot after a cold start (``loaded``: 0.0
    when it waited for none), got the engine's first byte and ended, in ``time.monotonic()``
    seconds, and the engine's own figures (llama-server's ``timings``) where it gave them."""

    arrival: float
    loaded: float
    engine_byte: float
    end: float

    def fields(self, usage: dict[str, Any] | None, timings: dict[str, Any] | None) -> dict[str, Any]:
        """The final object's counts and durations."""
        usage = _dict(usage)
        start = self.loaded or self.arrival
        first = self.engine_byte or self.end
        prompt_ns = _ns(first - start)
        eval_ns = _ns(self.end - first)
        if isinstance(timings, dict):
            prompt_ns = _ms_ns(timings.get("prompt_ms"), prompt_ns)
            eval_ns = _ms_ns(timings.get("predicted_ms"), eval_ns)
        return {
            "total_duration": _ns(self.end - self.arrival),
            "load_duration": _ns(self.loaded - self.arrival) if self.loaded else 0,
            "prompt_eval_count": _int(usage.get("prompt_tokens")),
            "prompt_eval_duration": prompt_ns,
            "eval_count": _int(usage.get("completion_tokens")),
            "eval_duration": eval_ns,
        }


def _dict(value: Any) -> dict[str, Any]:
    """``value`` where it is an object, else an empty one: an engine's answer of an odd shape is
    translated as far as it goes, never a server error."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 2**63 else 0


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def _ms_ns(ms: Any, fallback: int) -> int:
    return _int(ms * 1e6) if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms >= 0 else fallback


def _arguments(text: Any) -> Any:
    """A tool call's arguments as an object (OpenAI sends them as JSON text)."""
    if not isinstance(text, str):
        return text if text is not None else {}
    try:
        return json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):
        return text


def tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    functions = [_dict(_dict(call).get("function")) for call in calls]
    return [
        {"function": {"name": str(f.get("name", "")), "arguments": _arguments(f.get("arguments"))}} for f in functions
    ]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _reason(given: Any) -> str:
    """Ollama's ``done_reason`` of an OpenAI ``finish_reason``: a tool call is a stop."""
    return "stop" if not isinstance(given, str) or given in _REASONS else given


def _reasoning(part: dict[str, Any]) -> str | None:
    value = part.get("reasoning_content") or part.get("reasoning")
    return value if isinstance(value, str) else None


def chat_answer(answer: dict[str, Any], kind: str, model: str, times: Times) -> dict[str, Any]:
    """A whole OpenAI chat (or completion) answer as Ollama's ``kind`` ("chat" or "generate")."""
    choice = _dict((_list(answer.get("choices")) or [{}])[0])
    message = _dict(choice.get("message"))
    text = message.get("content") if message else choice.get("text")
    text = text if isinstance(text, str) else ""
    text = text.removeprefix(NOTICE)  # a queued request's notice: not in Ollama's format
    out: dict[str, Any] = {"model": model, "created_at": now_iso()}
    thinking = _reasoning(message)
    if kind == "chat":
        out["message"] = {"role": "assistant", "content": text}
        if thinking:
            out["message"]["thinking"] = thinking
        if _list(message.get("tool_calls")):
            out["message"]["tool_calls"] = tool_calls(message["tool_calls"])
    else:
        out["response"] = text
        if thinking:
            out["thinking"] = thinking
    out.update(done=True, done_reason=_reason(choice.get("finish_reason")))
    out.update(times.fields(answer.get("usage"), answer.get("timings")))
    return out


def embed_answer(answer: dict[str, Any], model: str, times: Times, legacy: bool) -> dict[str, Any]:
    """An OpenAI embeddings answer as ``/api/embed``'s (or the older ``/api/embeddings``')."""
    items = [_dict(item) for item in _list(answer.get("data"))]
    vectors = [item.get("embedding") for item in sorted(items, key=lambda d: _int(d.get("index")))]
    if legacy:
        return {"embedding": vectors[0] if vectors else []}
    fields = times.fields(answer.get("usage"), None)
    return {
        "model": model,
        "embeddings": vectors,
        "total_duration": fields["total_duration"],
        "load_duration": fields["load_duration"],
        "prompt_eval_count": fields["prompt_eval_count"],
    }


def loaded_answer(kind: str, model: str, reason: str) -> dict[str, Any]:
    """The answer to a request that only loaded or unloaded its model (``reason``)."""
    out: dict[str, Any] = {"model": model, "created_at": now_iso()}
    if kind == "chat":
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out.update(done=True, done_reason=reason)
    return out


class StreamTranslator:
    """An engine's event stream, chunk by chunk, as Ollama's NDJSON lines (``kind``: "chat" or
    "generate"). Events may be cut anywhere between chunks: the rest waits for the next."""

    def __init__(self, kind: str, model: str) -> None:
        self.kind = kind
        self.model = model
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.reason: str | None = None
        self.failed = False  # an error line was written: no final object follows
        self._pending = b""
        self._calls: dict[int, dict[str, Any]] = {}

    def feed(self, chunk: bytes) -> bytes:
        """The lines for what ``chunk`` completes."""
        data = self._pending + chunk
        *events, self._pending = data.replace(b"\r\n", b"\n").split(b"\n\n")
        return b"".join(self._event(event) for event in events)

    def _event(self, event: bytes) -> bytes:
        payload = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
        if not payload or payload == b"[DONE]" or self.failed:
            return b""
        try:
            obj = json.loads(payload)
        except (ValueError, RecursionError):
            return b""
        if not isinstance(obj, dict) or obj.get("id") == NOTICE_ID:
            return b""
        if "error" in obj:
            self.failed = True
            return error_line(error_text(payload))
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if isinstance(obj.get("timings"), dict):
            self.timings = obj["timings"]
        return b"".join(self._choice(_dict(choice)) for choice in _list(obj.get("choices")))

    def _choice(self, choice: dict[str, Any]) -> bytes:
        delta = _dict(choice.get("delta"))
        text = delta.get("content") if "delta" in choice else choice.get("text")  # chat, or a raw completion
        text = text if isinstance(text, str) else ""
        for call in map(_dict, _list(delta.get("tool_calls"))):
            index = call.get("index")
            held = self._calls.setdefault(
                index if isinstance(index, int) else len(self._calls), {"name": "", "arguments": ""}
            )
            function = _dict(call.get("function"))
            held["name"] += _text(function.get("name"))
            held["arguments"] += _text(function.get("arguments"))
        if choice.get("finish_reason"):
            self.reason = _reason(choice["finish_reason"])
        thinking = _reasoning(delta)
        if not text and not thinking:
            return b""
        return self._line(text, thinking, None)

    def _line(self, text: str, thinking: str | None, calls: list[dict[str, Any]] | None) -> bytes:
        out: dict[str, Any] = {"model": self.model, "created_at": now_iso()}
        if self.kind == "chat":
            out["message"] = {"role": "assistant", "content": text}
            if thinking:
                out["message"]["thinking"] = thinking
            if calls:
                out["message"]["tool_calls"] = calls
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        out["done"] = False
        return json.dumps(out).encode() + b"\n"

    def final(self, times: Times) -> bytes:
        """The tool calls gathered (if any), then the final object; nothing after an error."""
        if self.failed:
            return b""
        out = b""
        if self._calls:
            calls = [
                {"function": {"name": held["name"], "arguments": _arguments(held["arguments"])}}
                for _, held in sorted(self._calls.items())
            ]
            out += self._line("", None, calls)
        last: dict[str, Any] = {"model": self.model, "created_at": now_iso()}
        if self.kind == "chat":
            last["message"] = {"role": "assistant", "content": ""}
        else:
            last["response"] = ""
        last.update(done=True, done_reason=self.reason or "stop")
        last.update(times.fields(self.usage, self.timings))
        return out + json.dumps(last).encode() + b"\n"
