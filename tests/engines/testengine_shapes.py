"""Response bodies for the test engine, shaped like vLLM's OpenAI server.

Kept apart from ``testengine.py`` so the server module stays about wiring
(routes, seats, lifecycle) while this one is about bytes on the wire. Only
the stdlib is used; every function returns plain JSON-able dicts or text.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

Json = dict[str, Any]

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


def new_id(prefix: str) -> str:
    """Random id with vLLM's prefixes, so clients that sniff ids are satisfied."""
    return f"{prefix}{uuid.uuid4().hex}"


def pieces(reply: str, limit: Any) -> tuple[list[str], str]:
    """Split the reply into per-word deltas that re-join to the exact text.

    Returns the deltas and the finish reason: "length" when ``limit`` (a
    request's max_tokens) cut the reply short, as vLLM reports it.
    """
    words = reply.split()
    out = [w if i == 0 else " " + w for i, w in enumerate(words)]
    if isinstance(limit, int) and not isinstance(limit, bool) and 0 <= limit < len(out):
        return out[:limit], "length"
    return out, "stop"


def count_words(obj: Any) -> int:
    """Rough prompt-token count: words in every string of the request part."""
    if isinstance(obj, str):
        return len(obj.split())
    if isinstance(obj, list):
        return sum(1 if isinstance(x, int) else count_words(x) for x in obj)
    if isinstance(obj, dict):
        return sum(count_words(v) for k, v in obj.items() if k not in ("role", "type"))
    return 0


def usage(prompt: int, completion: int) -> Json:
    """vLLM's chat/completions usage block."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }


def error_body(message: str, code: int) -> Json:
    """OpenAI error shape (newer vLLM nests it under "error" too)."""
    kind = _ERROR_TYPES.get(code, "InternalServerError" if code >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def model_card(name: str, created: int, max_model_len: int) -> Json:
    """One entry of /v1/models as vLLM lists it."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "testengine",
        "root": name,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [],
    }


def chat_completion(name: str, parts: list[str], finish: str, prompt: int) -> Json:
    """Non-streaming chat.completion object."""
    message = {"role": "assistant", "content": "".join(parts), "reasoning_content": None, "tool_calls": []}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    return {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": name,
        "choices": [choice],
        "usage": usage(prompt, len(parts)),
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def chat_chunks(
    name: str, parts: list[str], finish: str, prompt: int, with_usage: bool, tool: Json | None = None
) -> Iterator[Json]:
    """chat.completion.chunk objects: role, one per word, a call of ``tool`` (a request's tool,
    called with ``{"q": "hi"}``) in two pieces, finish, optional usage."""
    head = {"id": new_id("chatcmpl-"), "object": "chat.completion.chunk", "created": int(time.time()), "model": name}

    def chunk(delta: Json, reason: str | None = None) -> Json:
        choice: Json = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        if reason is not None:
            choice["stop_reason"] = None
        return {**head, "choices": [choice]}

    yield chunk({"role": "assistant", "content": ""})
    for part in parts:
        yield chunk({"content": part})
    if tool is not None:
        call = {"index": 0, "id": new_id("chatcmpl-tool-"), "type": "function"}
        yield chunk({"tool_calls": [{**call, "function": {"name": tool["function"]["name"], "arguments": '{"q": '}}]})
        yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"hi"}'}}]})
        finish = "tool_calls"
    yield chunk({"content": ""}, finish)
    if with_usage:
        yield {**head, "choices": [], "usage": usage(prompt, len(parts))}


def completion(name: str, parts: list[str], finish: str, prompt: int) -> Json:
    """Non-streaming text_completion object."""
    choice = {
        "index": 0,
        "text": "".join(parts),
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": None,
        "prompt_logprobs": None,
    }
    return {
        "id": new_id("cmpl-"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": name,
        "choices": [choice],
        "usage": usage(prompt, len(parts)),
        "kv_transfer_params": None,
    }


def completion_chunks(name: str, parts: list[str], finish: str, prompt: int, with_usage: bool) -> Iterator[Json]:
    """text_completion stream chunks: one per word, a finishing one, optional usage."""
    head = {"id": new_id("cmpl-"), "object": "text_completion", "created": int(time.time()), "model": name}

    def chunk(text: str, reason: str | None) -> Json:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
        return {**head, "choices": [choice]}

    for part in parts:
        yield chunk(part, None)
    yield chunk("", finish)
    if with_usage:
        yield {**head, "choices": [], "usage": usage(prompt, len(parts))}


def embedding_vector(text: str) -> list[float]:
    """Deterministic unit-length 8-dim vector derived from the input's hash."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    raw = [(b / 127.5) - 1.0 for b in digest[:8]]
    norm = sum(x * x for x in raw) ** 0.5 or 1.0
    return [round(x / norm, 6) for x in raw]


def embedding_inputs(value: Any) -> list[str]:
    """Normalise the `input` field (string, strings, token ids, token-id lists)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        return [repr(value)]
    if isinstance(value, list):
        return [x if isinstance(x, str) else repr(x) for x in value]
    return [repr(value)]


def embeddings(name: str, inputs: list[str], encoding_format: str | None) -> Json:
    """vLLM's embedding list; base64 packs little-endian float32 like OpenAI."""
    data = []
    for i, text in enumerate(inputs):
        vec: Any = embedding_vector(text)
        if encoding_format == "base64":
            vec = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
        data.append({"index": i, "object": "embedding", "embedding": vec})
    prompt = sum(max(1, count_words(t)) for t in inputs)
    return {
        "id": new_id("embd-"),
        "object": "list",
        "created": int(time.time()),
        "model": name,
        "data": data,
        "usage": {
            "prompt_tokens": prompt,
            "total_tokens": prompt,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }


def _message_item(item_id: str, text: str | None) -> Json:
    """Responses API output message; `text=None` means still in progress."""
    content = [] if text is None else [_text_part(text)]
    status = "in_progress" if text is None else "completed"
    return {"id": item_id, "type": "message", "role": "assistant", "status": status, "content": content}


def _text_part(text: str) -> Json:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": None}


def response_object(name: str, resp_id: str, item_id: str, text: str | None, prompt: int, out: int, body: Json) -> Json:
    """Responses API object; `text=None` gives the in-progress (empty) form."""
    done = text is not None
    return {
        "id": resp_id,
        "object": "response",
        "created_at": int(time.time()),
        "model": name,
        "status": "completed" if done else "in_progress",
        "output": [_message_item(item_id, text)] if done else [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + out,
        }
        if done
        else None,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata"),
        "max_output_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": True,
        "previous_response_id": body.get("previous_response_id"),
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
        "background": False,
        "service_tier": "auto",
        "user": None,
    }


def response_events(name: str, parts: list[str], prompt: int, body: Json) -> Iterator[tuple[str, Json]]:
    """Typed Responses API stream events, numbered from 0, like OpenAI/vLLM."""
    resp_id, item_id, text = new_id("resp_"), new_id("msg_"), "".join(parts)
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    pending = response_object(name, resp_id, item_id, None, prompt, 0, body)
    final = response_object(name, resp_id, item_id, text, prompt, len(parts), body)
    events: list[tuple[str, Json]] = [
        ("response.created", {"response": pending}),
        ("response.in_progress", {"response": pending}),
        ("response.output_item.added", {"output_index": 0, "item": _message_item(item_id, None)}),
        ("response.content_part.added", {**where, "part": _text_part("")}),
    ]
    events += [("response.output_text.delta", {**where, "delta": p, "logprobs": []}) for p in parts]
    events += [
        ("response.output_text.done", {**where, "text": text, "logprobs": []}),
        ("response.content_part.done", {**where, "part": _text_part(text)}),
        ("response.output_item.done", {"output_index": 0, "item": _message_item(item_id, text)}),
        ("response.completed", {"response": final}),
    ]
    for seq, (kind, data) in enumerate(events):
        yield kind, {"type": kind, "sequence_number": seq, **data}


def metrics_text(name: str, running: int, waiting: int, counters: dict[str, int], names: str = "vllm") -> str:
    """Prometheus exposition like vLLM's (prometheus_client prints floats), or with ``names`` =
    "sglang" SGLang's scheduler gauges alone."""
    if names == "sglang":
        labels = f'engine_type="unified",model_name="{name}",tp_rank="0"'
        gauges = [("sglang:num_running_reqs", running), ("sglang:num_queue_reqs", waiting)]
        return "".join(f"# TYPE {metric} gauge\n{metric}{{{labels}}} {float(value)}\n" for metric, value in gauges)
    labels = f'engine="0",model_name="{name}"'
    gauges = [
        ("vllm:num_requests_running", "Number of requests in model execution batches.", running),
        ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
        ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", 0.0),
    ]
    lines: list[str] = []
    for metric, help_text, value in gauges:
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} gauge", f"{metric}{{{labels}}} {float(value)}"]
    totals = [
        ("vllm:prompt_tokens", "Number of prefill tokens processed.", counters.get("prompt", 0)),
        ("vllm:generation_tokens", "Number of generation tokens processed.", counters.get("generation", 0)),
        ("vllm:request_success", "Count of successfully processed requests.", counters.get("success", 0)),
    ]
    for metric, help_text, value in totals:
        lines += [
            f"# HELP {metric}_total {help_text}",
            f"# TYPE {metric}_total counter",
            f"{metric}_total{{{labels}}} {float(value)}",
        ]
    return "\n".join(lines) + "\n"


def include_usage(body: Json) -> bool:
    """stream_options.include_usage asks for a trailing usage-only chunk."""
    options = body.get("stream_options") or {}
    return bool(isinstance(options, dict) and options.get("include_usage"))


def echo(method: str, path: str, query: str, body: bytes, content_type: str | None) -> Json:
    """Answer of the catch-all /v1 route."""
    return {
        "echo": True,
        "method": method,
        "path": path,
        "query": query,
        "body_bytes": len(body),
        "content_type": content_type,
    }


def request_record(method: str, path: str, query: str, headers: Iterable[tuple[str, str]], body: bytes) -> Json:
    """One /_test/requests entry; repeated headers are joined with ", "."""
    joined: dict[str, str] = {}
    for key, value in headers:
        key = key.lower()
        joined[key] = f"{joined[key]}, {value}" if key in joined else value
    entry: Json = {"method": method, "path": path, "query": query, "headers": joined, "time": time.time()}
    try:
        entry["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        entry["body"], entry["body_b64"] = None, base64.b64encode(body).decode()
    return entry
