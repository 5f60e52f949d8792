"""Hostile GGUF files (issue 34), written byte by byte: each shape a local user can leave where the
operator picks models, with the words dgxmm's refusal must contain. The unit tests read them with
the bounded reader, the hostile suite posts them to a served dgxmm's ``/api/estimate``, and
``make fuzz`` (corpus.py) replays them too.

``valid()`` is a small llama model's header and data; every shape changes one thing of it (or is
a few bytes on its own), so each refusal is that one thing's.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

U8, I32, U32, U64, F32, BOOL, STRING, ARRAY, I64 = 0, 5, 4, 10, 6, 7, 8, 9, 11
F32_TENSOR = 0  # ggml's F32
ROWS = 64  # the one tensor: F32, 64 x 4


def string(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return string(key.encode()) + struct.pack("<I", vtype) + payload


def u32(key: str, value: int) -> bytes:
    return kv(key, U32, struct.pack("<I", value))


def array(key: str, itype: int, length: int, items: bytes = b"") -> bytes:
    return kv(key, ARRAY, struct.pack("<IQ", itype, length) + items)


def tensor(
    name: bytes = b"t", dims: tuple[int, ...] = (ROWS, 4), ggml_type: int = F32_TENSOR, offset: int = 0
) -> bytes:
    return string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)


KEYS = {
    "general.architecture": kv("general.architecture", STRING, string(b"llama")),
    "llama.block_count": u32("llama.block_count", 2),
    "llama.context_length": u32("llama.context_length", 2048),
    "llama.embedding_length": u32("llama.embedding_length", 64),
    "llama.attention.head_count": u32("llama.attention.head_count", 4),
    "llama.attention.head_count_kv": u32("llama.attention.head_count_kv", 2),
    "tokenizer.ggml.tokens": array("tokenizer.ggml.tokens", STRING, 3, string(b"<s>") + string(b"a") + string(b"b")),
}


def gguf(
    keys: list[bytes] | None = None,
    tensors: list[bytes] | None = None,
    *,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    version: int = 3,
    data: int | None = None,
) -> bytes:
    """A GGUF of ``keys`` (the valid model's by default) and ``tensors``, with ``data`` bytes of
    tensor data after the header's padding (enough for the tensors by default)."""
    keys = list(KEYS.values()) if keys is None else keys
    tensors = [tensor()] if tensors is None else tensors
    head = (
        b"GGUF"
        + struct.pack(
            "<IQQ", version, len(tensors) if n_tensors is None else n_tensors, len(keys) if n_kv is None else n_kv
        )
        + b"".join(keys)
        + b"".join(tensors)
    )
    head += b"\0" * (-len(head) % 32)
    return head + b"\0" * (ROWS * 4 * 4 if data is None else data)


def valid() -> bytes:
    return gguf()


def replaced(key: str, entry: bytes) -> list[bytes]:
    """The valid model's keys with ``key``'s entry replaced (``b""``: left out)."""
    return [entry if name == key else value for name, value in KEYS.items() if entry or name != key]


CTX = "llama.context_length"
# name: (the file's bytes, words the refusal contains)
SHAPES: dict[str, tuple[bytes, str]] = {
    "magic only": (b"GGUF", "the version goes past the end of the file"),
    "not a gguf": (b"<html>not a model</html>\n", "does not begin with the GGUF magic"),
    "truncated after the version": (b"GGUF\x03\0\0\0", "the tensor count goes past the end of the file"),
    "truncated in a key": (
        gguf([KEYS["general.architecture"]], [], data=0)[:40],
        "key 0 goes past the end of the file",
    ),
    "version 1": (gguf(version=1), "GGUF version 1"),
    "version 4": (gguf(version=4), "GGUF version 4"),
    "big-endian": (gguf(version=3 << 24), "big-endian"),
    "2^62 tensors": (gguf(n_tensors=1 << 62), f"claims {1 << 62} tensors"),
    "2^62 keys": (gguf(n_kv=1 << 62), f"claims {1 << 62} keys"),
    "more keys than the file holds": (gguf(n_kv=4000), "more than the rest of its header can hold"),
    "a key of 2^62 bytes": (
        b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 62) + bytes(16),
        "key 0 is 4611686018427387904 bytes",
    ),
    "a string of 2^62 bytes": (
        gguf(replaced("general.architecture", kv("general.architecture", STRING, struct.pack("<Q", 1 << 62)))),
        "goes past the end of the file",
    ),
    "an array of 2^62 uint8": (
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + array("a", U8, 1 << 62),
        f"claims {1 << 62} items",
    ),
    "an array of 2^20 strings in 100 bytes": (gguf([array("a", STRING, 1 << 20)]), "more than the rest of its header"),
    "a string item of 2^62 bytes": (
        gguf([array("a", STRING, 1, struct.pack("<Q", 1 << 62))]),
        "item 0 of 'a' goes past the end",
    ),
    "an array of arrays": (gguf([array("a", ARRAY, 1, struct.pack("<IQ", U8, 1 << 40))]), "an array of arrays"),
    "an unknown value type": (gguf([kv("a", 13, b"\0" * 8)]), "unknown value type 13"),
    "a duplicate key": (gguf([*KEYS.values(), KEYS[CTX]]), "appears twice"),
    "a key that is not utf-8": (gguf([string(b"\xff\xfe") + struct.pack("<II", U32, 1)]), "is not UTF-8"),
    "no architecture": (gguf(replaced("general.architecture", b"")), "general.architecture is None"),
    "context length a string": (
        gguf(replaced(CTX, kv(CTX, STRING, string(b"4096")))),
        f"{CTX} is '4096': not an integer",
    ),
    "context length 2^64-1": (
        gguf(replaced(CTX, kv(CTX, U64, struct.pack("<Q", (1 << 64) - 1)))),
        f"{CTX} is {(1 << 64) - 1}: not within",
    ),
    "context length infinite": (
        gguf(replaced(CTX, kv(CTX, F32, struct.pack("<f", float("inf"))))),
        f"{CTX} is inf: not an integer",
    ),
    "head_count_kv an empty array": (
        gguf(replaced("llama.attention.head_count_kv", array("llama.attention.head_count_kv", U32, 0))),
        "llama.attention.head_count_kv has 0 items",
    ),
    "head_count 0": (
        gguf(replaced("llama.attention.head_count", u32("llama.attention.head_count", 0))),
        "llama.attention.head_count is 0",
    ),
    "block_count 0": (gguf(replaced("llama.block_count", u32("llama.block_count", 0))), "llama.block_count is 0"),
    "block_count -1": (
        gguf(replaced("llama.block_count", kv("llama.block_count", I32, struct.pack("<i", -1)))),
        "llama.block_count is -1",
    ),
    "block_count a bool": (
        gguf(replaced("llama.block_count", kv("llama.block_count", BOOL, b"\1"))),
        "llama.block_count is True: not an integer",
    ),
    "a tensor whose size overflows": (gguf(tensors=[tensor(dims=(1 << 40, 1 << 40))]), "whose size overflows"),
    "a tensor of 5 dimensions": (gguf(tensors=[tensor(dims=(1, 1, 1, 1, 1))]), "5 dimensions"),
    "a tensor of an unknown type": (gguf(tensors=[tensor(ggml_type=99)]), "unknown type 99"),
    "a tensor's data past the end": (
        gguf(tensors=[tensor(dims=(ROWS, 1 << 30))]),
        "the data of tensor 't' ends past the end",
    ),
    "a tensor at a wrong offset": (gguf(tensors=[tensor(offset=1 << 50)]), "not 0 where the one before it ends"),
    "a duplicate tensor": (gguf(tensors=[tensor(), tensor(offset=1024)], data=2048), "the tensor 't' appears twice"),
    "a tensor name of 2^62 bytes": (gguf(tensors=[struct.pack("<Q", 1 << 62)]), "name is 4611686018427387904 bytes"),
    "an alignment of 3": (gguf([*KEYS.values(), u32("general.alignment", 3)]), "general.alignment 3"),
}


def write_shapes(folder: Path) -> dict[str, Path]:
    """Every shape as a file in ``folder``, by name."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for index, (name, (raw, _)) in enumerate(SHAPES.items()):
        paths[name] = folder / f"hostile-{index:02d}.gguf"
        paths[name].write_bytes(raw)
    return paths


SPARSE_BYTES = 4 * 1024**3


def write_specials(folder: Path) -> dict[str, tuple[Path, str]]:
    """The files that are not shapes of bytes: a FIFO nobody writes to (reading it would wait
    forever), a sparse 4 GiB file claiming 2^27 tensors, a directory and a device; with the words
    of each refusal."""
    folder.mkdir(parents=True, exist_ok=True)
    fifo = folder / "fifo.gguf"
    if not fifo.exists():
        os.mkfifo(fifo)
    sparse = folder / "sparse.gguf"
    with sparse.open("wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 1 << 27, 0))
        f.truncate(SPARSE_BYTES)
    sparse_tensors = folder / "sparse-16000.gguf"  # within the tensor limit: each is read and refused
    with sparse_tensors.open("wb") as f:
        f.write(gguf(n_tensors=16000, tensors=[], data=0))
        f.truncate(SPARSE_BYTES)
    directory = folder / "folder.gguf"
    directory.mkdir(exist_ok=True)
    return {
        "a FIFO": (fifo, "not a regular file (a FIFO)"),
        "a sparse 4 GiB file claiming 2^27 tensors": (sparse, f"claims {1 << 27} tensors"),
        "a sparse 4 GiB file claiming 16000 tensors": (sparse_tensors, "name is 0 bytes long"),
        "a directory": (directory, "not a regular file (a directory)"),
        "a device": (Path("/dev/zero"), "not a regular file (a character device)"),
        "a missing file": (folder / "missing.gguf", "cannot open it: No such file or directory"),
    }
