"""What llama.cpp's server will hold for a GGUF model, before its first start: the ``memory_gib``
to declare (``dgxmm estimate MODEL.gguf [--ctx N]``, ``POST /api/estimate``, the wizard).

* **Weights**: the sizes of the tensors listed in the GGUF header (read by ``ggufheader``, within
  bounds, with the types of ``gguf``, llama.cpp's own Python package), as stored: quantised
  weights stay quantised in memory.
* **KV cache**: layers x context x (K and V width per token) x the cache type's bytes per element.
  The width comes from the header: key and value lengths, or the embedding length over the head
  count, times the KV head count. The context and the cache types come from the deployment's
  arguments as llama-server reads them (``-c``/``--ctx-size``, where 0 or none means the
  model's trained context; ``-ctk``/``--cache-type-k``, ``-ctv``/``--cache-type-v``, f16 by
  default). The context is the whole cache, shared by the parallel slots (``-np``).
* **Overhead**: the server process itself and its compute buffers, a documented constant: with
  flash attention (llama-server's default, ``-fa auto``) the buffers stay small, measured at
  16-17 MiB for every model and context in docs/engines.md's table, and the constant is twice
  that. With ``-fa off`` the attention scores of one batch (512 tokens, 4 bytes a score, every
  head, against the whole context) are added.

It covers the usual decoder architectures (llama, qwen, mistral, phi...); a sliding-window or
recurrent model holds less KV cache than estimated, so the estimate errs on the safe side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgxmm.deploy.ggufheader import NotAModel, read_header

GIB = 1024**3
# Bytes per element of each KV cache type llama-server accepts (ggml's block sizes).
CACHE_TYPE_BYTES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
    "iq4_nl": 18 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
}
# The process and its buffers besides weights and cache (twice what was measured, 16-17 MiB), and
# without flash attention the attention scores of one batch of 512 tokens (4 bytes per score).
OVERHEAD_BYTES = 32 * 1024**2
BATCH = 512
# What the estimate takes of a header must be within these, or the file is refused: far beyond any
# real model, and small enough that the estimate stays a number of GiB a host can have.
MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS (real models: up to ~130)
MAX_CONTEXT = 1 << 24  # 16,777,216 tokens, as POST /api/estimate's ctx (the longest trained: 10M)
MAX_HEADS = 1024  # attention heads (real models: up to 128)
MAX_WIDTH = 1 << 17  # the embedding length and a head's key and value widths (real: up to ~16,384)
_KEYS = (
    ".block_count",
    ".context_length",
    ".embedding_length",
    ".attention.head_count",
    ".attention.head_count_kv",
    ".attention.key_length",
    ".attention.value_length",
)


@dataclass(frozen=True)
class Shape:
    """What the estimate reads of a GGUF header."""

    architecture: str
    weights_bytes: int
    layers: int
    context_length: int
    heads: int
    kv_heads: int
    key_length: int
    value_length: int


@dataclass(frozen=True)
class Estimate:
    weights_bytes: int
    kv_bytes: int
    overhead_bytes: int
    context: int
    cache_k: str
    cache_v: str

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.overhead_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def suggested_gib(self) -> float:
        """The ``memory_gib`` to declare: the estimate rounded up to 0.1 GiB."""
        return round(math.ceil(self.total_gib * 10) / 10, 1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "weights_gib": round(self.weights_bytes / GIB, 3),
            "kv_cache_gib": round(self.kv_bytes / GIB, 3),
            "overhead_gib": round(self.overhead_bytes / GIB, 3),
            "total_gib": round(self.total_gib, 3),
            "suggested_memory_gib": self.suggested_gib,
            "context": self.context,
            "cache_type_k": self.cache_k,
            "cache_type_v": self.cache_v,
        }


def read_shape(path: Path) -> Shape:
    """The header of the GGUF at ``path`` (read within ``ggufheader``'s bounds); ``NotAModel``
    when it is not one, or when a value the estimate uses is absent or absurd (the message names
    the key)."""
    header = read_header(path, _wanted)
    values = header.values
    arch = values.get("general.architecture")
    if not isinstance(arch, str) or not 0 < len(arch) <= 64 or not arch.isprintable():
        raise NotAModel(f"{path}: general.architecture is {_shown(arch)}: not an architecture's name")

    def number(key: str, low: int, high: int, default: int | None = None) -> int:
        found = values.get(f"{arch}.{key}", default)
        if found is None:
            raise NotAModel(f"{path}: the GGUF header has no {arch}.{key}")
        return _bounded(path, f"{arch}.{key}", found, low, high)

    layers = number("block_count", 1, MAX_LAYERS)
    embd = number("embedding_length", 1, MAX_WIDTH)

    def per_layer(key: str, default: int | None = None) -> int:
        """The largest of a value llama.cpp takes as one number or one per layer."""
        found = values.get(f"{arch}.{key}", default)
        if not isinstance(found, list):
            return number(key, 1, MAX_HEADS, default)
        if len(found) != layers:
            raise NotAModel(f"{path}: {arch}.{key} has {len(found)} items, not one per layer ({layers})")
        largest = max(_bounded(path, f"{arch}.{key}", item, 0, MAX_HEADS) for item in found)
        return _bounded(path, f"{arch}.{key}", largest, 1, MAX_HEADS)

    heads = per_layer("attention.head_count")
    return Shape(
        architecture=arch,
        weights_bytes=sum(t.n_bytes for t in header.tensors),
        layers=layers,
        context_length=number("context_length", 1, MAX_CONTEXT, 4096),
        heads=heads,
        kv_heads=per_layer("attention.head_count_kv", heads),  # per layer: the largest
        key_length=number("attention.key_length", 1, MAX_WIDTH, embd // heads or None),
        value_length=number("attention.value_length", 1, MAX_WIDTH, embd // heads or None),
    )


def _wanted(key: str) -> bool:
    """The keys whose values the estimate reads (any architecture's: it is named in the header)."""
    return key == "general.architecture" or key.endswith(_KEYS)


def _bounded(path: Path, key: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise NotAModel(f"{path}: {key} is {_shown(value)}: not an integer")
    if not low <= value <= high:
        raise NotAModel(f"{path}: {key} is {value}: not within {low} to {high}")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Options:
    """What of llama-server's arguments the estimate depends on."""

    context: int | None = None  # None or 0: the model's trained context
    cache_k: str = "f16"
    cache_v: str = "f16"
    flash_attention: bool = True  # -fa auto (the default) uses it on the CPU and on GPUs that have it


def server_options(args: list[str]) -> Options:
    """The options llama-server takes from ``args`` (the last of a repeated flag wins, as in
    llama.cpp's parser)."""
    found: dict[str, Any] = {}
    names = {
        "-c": "context",
        "--ctx-size": "context",
        "-ctk": "cache_k",
        "--cache-type-k": "cache_k",
        "-ctv": "cache_v",
        "--cache-type-v": "cache_v",
        "-fa": "flash_attention",
        "--flash-attn": "flash_attention",
    }
    for i, arg in enumerate(args):
        flag, _, inline = arg.partition("=")
        which = names.get(flag)
        if which is None:
            continue
        value = (inline or (args[i + 1] if i + 1 < len(args) else "")).lower()
        if which == "context" and value.isdigit():
            found[which] = int(value)
        elif which == "flash_attention":
            found[which] = value != "off"
        elif which != "context" and value in CACHE_TYPE_BYTES:
            found[which] = value
    return Options(**found)


def estimate(path: Path, args: list[str] | None = None, ctx: int | None = None) -> Estimate:
    """What llama-server will hold for the model at ``path`` started with ``args`` (``ctx``, when
    given, wins over the arguments' context size)."""
    shape = read_shape(path)
    opts = server_options(args or [])
    context = (ctx if ctx is not None else opts.context) or shape.context_length
    per_token = shape.kv_heads * (
        shape.key_length * CACHE_TYPE_BYTES[opts.cache_k] + shape.value_length * CACHE_TYPE_BYTES[opts.cache_v]
    )
    kv = int(shape.layers * context * per_token)
    scores = 0 if opts.flash_attention else context * BATCH * shape.heads * 4
    return Estimate(shape.weights_bytes, kv, OVERHEAD_BYTES + scores, context, opts.cache_k, opts.cache_v)
