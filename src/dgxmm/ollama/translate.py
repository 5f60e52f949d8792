"""Ollama's requests as the engine's OpenAI requests: pure functions, each bad input a
``BadInput`` (a 400 in Ollama's ``{"error": ...}`` shape) before anything reaches an engine.

What maps where (Ollama's docs/api.md): ``messages`` (``images`` become image parts, an
assistant's ``tool_calls`` get their arguments as the JSON string OpenAI wants, a ``tool``
message the id of the call it answers), ``tools`` as they are (the same shape), ``format``
(``"json"`` or a JSON schema) as ``response_format``, ``think`` as the chat template's
``enable_thinking`` (or ``reasoning_effort`` for a level), ``options`` by name (below). ``/api/generate``
is a chat of one user message (after ``system``), or with ``raw`` a plain completion of the prompt.
``keep_alive`` is read here and never forwarded; ``num_ctx`` is never forwarded either (the
engine's context is set when it starts): one larger than the engine's is refused, never cut.
"""

from __future__ import annotations

import binascii
import json
from dataclasses import dataclass
from typing import Any

from dgxmm.gateway import keepalive

MAX_MESSAGES = 4096  # more is no conversation a model's context holds: refused, not passed on
MAX_IMAGES = 64  # images in one request
NUM_PREDICT_INFINITE = -1  # Ollama: no limit
NUM_PREDICT_FILL = -2  # Ollama: until the context is full (no limit an OpenAI engine is told)

# Options with an OpenAI (or engine) field of their own: Ollama's name -> (fields, kind).
# ``repeat_penalty`` goes under both names engines read (vLLM's ``repetition_penalty``,
# llama-server's ``repeat_penalty``); each ignores the other's.
_MAPPED: dict[str, tuple[tuple[str, ...], str]] = {
    "temperature": (("temperature",), "number"),
    "top_p": (("top_p",), "number"),
    "top_k": (("top_k",), "int"),
    "min_p": (("min_p",), "number"),
    "seed": (("seed",), "int"),
    "repeat_penalty": (("repetition_penalty", "repeat_penalty"), "number"),
    "presence_penalty": (("presence_penalty",), "number"),
    "frequency_penalty": (("frequency_penalty",), "number"),
}
# Options Ollama's runner reads that an OpenAI engine has no field for (load-time settings or
# samplers it lacks): type-checked, then left out, as Ollama leaves out options it does not know.
_IGNORED_NUMBERS = frozenset(
    {"typical_p", "tfs_z", "mirostat_tau", "mirostat_eta", "repeat_last_n", "num_keep", "num_batch", "num_gpu"}
)
_IGNORED_INTS = frozenset({"mirostat", "num_thread", "main_gpu"})
_IGNORED_BOOLS = frozenset({"numa", "low_vram", "use_mmap", "use_mlock", "vocab_only", "penalize_newline", "f16_kv"})
_ROLES = frozenset({"system", "user", "assistant", "tool"})
_MAGIC = ((b"\x89PNG", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"), (b"RIFF", "image/webp"))


class BadInput(Exception):
    """A request dgxmm refuses before any engine sees it: 400 (or ``status``) with ``message``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True)
class Translated:
    """An Ollama request as the engine gets it: ``endpoint`` under ``/v1`` and its ``body``
    (None: the request only loads or unloads the model), whether the answer streams, the name the
    caller gave (answers repeat it) and its ``keep_alive`` in seconds (None: not given)."""

    endpoint: str
    body: dict[str, Any] | None
    stream: bool
    model: str
    keep_alive_s: float | None


def parse(raw: bytes | bytearray) -> dict[str, Any]:
    """The body as a JSON object."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise BadInput("the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadInput("the body must be a JSON object")
    return body


def model_of(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadInput("model is required")
    return model


def keep_alive_s(value: Any) -> float | None:
    """Ollama's ``keep_alive`` in seconds (``gateway.keepalive.seconds``, the parser ``/v1``
    shares); None when absent."""
    try:
        return keepalive.seconds(value)
    except keepalive.BadKeepAlive as exc:
        raise BadInput(str(exc)) from None


def _stream_of(body: dict[str, Any]) -> bool:
    stream = body.get("stream", True)  # absent means true, as in Ollama
    if not isinstance(stream, bool):
        raise BadInput("stream must be true or false")
    return stream


def options(body: dict[str, Any], context: int | None) -> dict[str, Any]:
    """The OpenAI fields of Ollama's ``options``, each checked for its type; ``context`` is the
    engine's context length where known (a larger ``num_ctx`` is refused)."""
    given = body.get("options")
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise BadInput("options must be an object")
    out: dict[str, Any] = {}
    for name, value in given.items():
        if name in _MAPPED:
            fields, kind = _MAPPED[name]
            _check(name, value, kind)
            out.update(dict.fromkeys(fields, value))
        elif name == "num_predict":
            _check(name, value, "int")
            if value < NUM_PREDICT_FILL:
                raise BadInput(f"options.num_predict must be -1 (no limit), -2 (fill the context) or more, got {value}")
            if value >= 0:
                out["max_tokens"] = value
        elif name == "stop":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise BadInput("options.stop must be a list of strings")
            out["stop"] = value
        elif name == "num_ctx":
            _check(name, value, "int")
            if context is not None and value > context:
                raise BadInput(f"options.num_ctx {value} is larger than the model's context ({context} tokens)")
        elif name in _IGNORED_NUMBERS:
            _check(name, value, "number")
        elif name in _IGNORED_INTS:
            _check(name, value, "int")
        elif name in _IGNORED_BOOLS:
            _check(name, value, "bool")
    return out


def _check(name: str, value: Any, kind: str) -> None:
    if kind == "bool":
        ok = isinstance(value, bool)
    elif isinstance(value, bool):
        ok = False
    elif kind == "int":
        ok = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    else:
        ok = isinstance(value, (int, float))
    if not ok:
        raise BadInput(f"options.{name} must be {'an integer' if kind == 'int' else 'a ' + kind}, got {value!r:.40}")


def _image_part(image: Any, where: str) -> dict[str, Any]:
    """An Ollama image (base64, no data: prefix) as an OpenAI image part."""
    if not isinstance(image, str):
        raise BadInput(f"{where} must be base64 strings")
    text = image.split(",", 1)[1] if image.startswith("data:") else image
    try:
        head = binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        raise BadInput(f"{where}: an image is not base64") from None
    kind = next((mime for magic, mime in _MAGIC if head.startswith(magic)), "image/png")
    return {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{text}"}}


def _content(text: str, images: Any, where: str) -> str | list[dict[str, Any]]:
    if images is None or images == []:
        return text
    if not isinstance(images, list) or len(images) > MAX_IMAGES:
        raise BadInput(f"{where} must be a list of at most {MAX_IMAGES} base64 images")
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    return parts + [_image_part(image, where) for image in images]


def _tool_calls(calls: Any, first: int) -> list[dict[str, Any]]:
    """An assistant's Ollama ``tool_calls`` (arguments as objects) as OpenAI's (as JSON text)."""
    if not isinstance(calls, list):
        raise BadInput("tool_calls must be a list")
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadInput("each tool call needs a function with a name")
        arguments = function.get("arguments", {})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{first + i}"
        out.append({"id": call_id, "type": "function", "function": {"name": function["name"], "arguments": text}})
    return out


def messages(given: Any) -> list[dict[str, Any]]:
    """Ollama's ``messages`` as OpenAI's."""
    if not isinstance(given, list):
        raise BadInput("messages must be a list")
    if len(given) > MAX_MESSAGES:
        raise BadInput(f"{len(given)} messages: at most {MAX_MESSAGES} are taken")
    out: list[dict[str, Any]] = []
    calls: list[str] = []  # ids of the tool calls not answered yet, oldest first
    for i, message in enumerate(given):
        if not isinstance(message, dict):
            raise BadInput(f"messages[{i}] must be an object")
        role, text = message.get("role"), message.get("content", "")
        if not isinstance(role, str) or role not in _ROLES:
            raise BadInput(f"messages[{i}].role must be one of system, user, assistant, tool")
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise BadInput(f"messages[{i}].content must be a string")
        entry: dict[str, Any] = {
            "role": role,
            "content": _content(text, message.get("images"), f"messages[{i}].images"),
        }
        if role == "assistant" and message.get("tool_calls"):
            entry["tool_calls"] = _tool_calls(message["tool_calls"], len(calls) + i)
            calls.extend(call["id"] for call in entry["tool_calls"])
        if role == "tool":
            entry["tool_call_id"] = calls.pop(0) if calls else f"call_{i}"
        out.append(entry)
    return out


def _shared(body: dict[str, Any], context: int | None) -> dict[str, Any]:
    """What chat and generate take alike: ``format``, ``think``, ``options``, ``stream``."""
    out = options(body, context)
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, dict):
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    elif fmt not in (None, ""):
        raise BadInput('format must be "json" or a JSON schema')
    think = body.get("think")
    if isinstance(think, bool):
        out["chat_template_kwargs"] = {"enable_thinking": think}
    elif think in ("low", "medium", "high"):
        out["reasoning_effort"] = think
    elif think is not None:
        raise BadInput('think must be true, false, "low", "medium" or "high"')
    if _stream_of(body):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}  # the final object's counts
    return out


def chat(body: dict[str, Any], context: int | None = None) -> Translated:
    """``POST /api/chat``; no messages only loads (or unloads) the model."""
    model = model_of(body)
    given = body.get("messages")
    keep = keep_alive_s(body.get("keep_alive"))
    stream = _stream_of(body)
    if given is None or given == []:
        return Translated("chat/completions", None, stream, model, keep)
    out: dict[str, Any] = {"model": model, "messages": messages(given), **_shared(body, context)}
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
            raise BadInput("tools must be a list of objects")
        out["tools"] = tools
    return Translated("chat/completions", out, stream, model, keep)


def generate(body: dict[str, Any], context: int | None = None) -> Translated:
    """``POST /api/generate``: a chat of the prompt (after ``system``), or with ``raw`` a
    completion of it as it is; an empty prompt only loads (or unloads) the model."""
    model = model_of(body)
    prompt, system, images = body.get("prompt", ""), body.get("system"), body.get("images")
    keep = keep_alive_s(body.get("keep_alive"))
    stream = _stream_of(body)
    if prompt is None:
        prompt = ""
    if not isinstance(prompt, str) or (system is not None and not isinstance(system, str)):
        raise BadInput("prompt and system must be strings")
    if body.get("suffix"):
        raise BadInput("suffix (fill-in-the-middle) is not served through /api/generate by dgxmm", 501)
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise BadInput("raw must be true or false")
    if not prompt and not images:
        return Translated("chat/completions", None, stream, model, keep)
    shared = _shared(body, context)
    if raw:
        if images:
            raise BadInput("images need a chat template: raw prompts take none")
        return Translated("completions", {"model": model, "prompt": prompt, **shared}, stream, model, keep)
    turns: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    turns.append({"role": "user", "content": _content(prompt, images, "images")})
    return Translated("chat/completions", {"model": model, "messages": turns, **shared}, stream, model, keep)


def embed(body: dict[str, Any], legacy: bool = False) -> Translated:
    """``POST /api/embed`` (``input``: a string or strings) or the older ``/api/embeddings``
    (``legacy``: ``prompt``, one string)."""
    model = model_of(body)
    given = body.get("prompt" if legacy else "input")
    if isinstance(given, str):
        given = [given]
    if not isinstance(given, list) or not given or not all(isinstance(text, str) for text in given):
        raise BadInput("prompt must be a string" if legacy else "input must be a string or a list of strings")
    options(body, None)  # checked; samplers mean nothing to an embedding
    out: dict[str, Any] = {"model": model, "input": given}
    dimensions = body.get("dimensions")
    if dimensions is not None:
        _check("dimensions", dimensions, "int")
        out["dimensions"] = dimensions
    return Translated("embeddings", out, False, model, keep_alive_s(body.get("keep_alive")))
