"""What llama.cpp's server will hold for a GGUF model, before its first start: the ``memory_gib``
to declare (``dgxmm estimate MODEL.gguf [--ctx N]``, ``POST /api/estimate``, the wizard).

* **Weights**: the sizes of the tensors listed in the GGUF header (read by ``gguf``, llama.cpp's
  own Python package), as stored: quantised weights stay quantised in memory.
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

GIB = 1024**3
# Bytes per element of each KV cache type llama-server accepts (ggml's block sizes).
CACHE_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
                    "iq4_nl": 18 / 32, "q5_0": 22 / 32, "q5_1": 24 / 32}  # fmt: skip
# The process and its buffers besides weights and cache (twice what was measured, 16-17 MiB), and
# without flash attention the attention scores of one batch of 512 tokens (4 bytes per score).
OVERHEAD_BYTES = 32 * 1024**2
BATCH = 512


class NotAModel(Exception):
    """Not a GGUF llama.cpp can load (the message says why)."""


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
        return {"weights_gib": round(self.weights_bytes / GIB, 3), "kv_cache_gib": round(self.kv_bytes / GIB, 3),
                "overhead_gib": round(self.overhead_bytes / GIB, 3), "total_gib": round(self.total_gib, 3),
                "suggested_memory_gib": self.suggested_gib, "context": self.context,
                "cache_type_k": self.cache_k, "cache_type_v": self.cache_v}  # fmt: skip


def read_shape(path: Path) -> Shape:
    """The header of the GGUF at ``path``; ``NotAModel`` when it is not one."""
    try:
        from gguf import GGUFReader  # numpy with it: imported only when a model is estimated
    except ImportError as exc:  # pragma: no cover - a runtime dependency
        raise NotAModel(f"reading GGUF headers needs the gguf package: {exc}") from None
    try:
        reader = GGUFReader(str(path), "r")
    except (OSError, ValueError) as exc:
        raise NotAModel(f"{path} is not a GGUF file llama.cpp can load: {exc}") from None

    def field(key: str, default: Any = None) -> Any:
        found = reader.fields.get(key)
        return default if found is None else found.contents()

    arch = field("general.architecture")
    if not isinstance(arch, str):
        raise NotAModel(f"{path}: the GGUF header names no architecture")
    layers = field(f"{arch}.block_count")
    embd = field(f"{arch}.embedding_length")
    heads = field(f"{arch}.attention.head_count")
    if not isinstance(layers, int) or not isinstance(embd, int) or not isinstance(heads, int) or heads <= 0:
        raise NotAModel(f"{path}: the GGUF header lacks the layer count, embedding length or head count")
    kv_heads = field(f"{arch}.attention.head_count_kv", heads)
    return Shape(
        architecture=arch, weights_bytes=sum(int(t.n_bytes) for t in reader.tensors), layers=layers,
        context_length=int(field(f"{arch}.context_length", 4096)), heads=heads,
        kv_heads=int(kv_heads if isinstance(kv_heads, int) else max(kv_heads)),  # per layer: the largest
        key_length=int(field(f"{arch}.attention.key_length", embd // heads)),
        value_length=int(field(f"{arch}.attention.value_length", embd // heads)),
    )  # fmt: skip


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
    names = {"-c": "context", "--ctx-size": "context", "-ctk": "cache_k", "--cache-type-k": "cache_k",
             "-ctv": "cache_v", "--cache-type-v": "cache_v", "-fa": "flash_attention", "--flash-attn": "flash_attention"}
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
    per_token = shape.kv_heads * (shape.key_length * CACHE_TYPE_BYTES[opts.cache_k]
                                  + shape.value_length * CACHE_TYPE_BYTES[opts.cache_v])  # fmt: skip
    kv = int(shape.layers * context * per_token)
    scores = 0 if opts.flash_attention else context * BATCH * shape.heads * 4
    return Estimate(shape.weights_bytes, kv, OVERHEAD_BYTES + scores, context, opts.cache_k, opts.cache_v)
