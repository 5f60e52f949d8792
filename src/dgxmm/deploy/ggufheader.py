"""A bounded reader of GGUF headers: what ``dgxmm estimate`` and ``POST /api/estimate`` read of a
file any local user may have put where the operator picks models (issue 34).

``gguf.GGUFReader`` believes the header: it maps the whole file and builds one numpy array per
value, per array element and per tensor that the header claims, so a 41-byte file claiming 2^62
elements grows dgxmm without end. This reader reads the same format (GGUF 2 and 3, as llama.cpp's
``gguf.cpp`` does) with every claim checked before anything is allocated for it:

* only a regular file is read, opened without blocking (a FIFO or a device is refused, not waited
  on), and never more than ``MAX_HEADER_BYTES`` of it, in chunks of ``CHUNK_BYTES``: memory stays
  about one chunk whatever the header claims;
* a count or length is refused when it exceeds its limit below or when the rest of the header
  could not hold that many of the smallest item (a string claiming 2^62 bytes in a 41-byte file);
* only the values of the keys the caller asks for are decoded, within ``KEEP_BYTES``; the others
  are checked and skipped (a tokenizer's 250,000 strings are walked, never stored);
* the tensors are checked as llama.cpp checks them when it loads the file (at most 4 dimensions,
  a known type, no overflowing size, offsets laid out one after the other, data within the file);
* the whole read ends at a deadline, whatever the file.

Every refusal is ``NotAModel`` with one line that says what is wrong. The limits are far beyond
real models, whose headers are 5-10 MiB (a tokenizer of 150,000-260,000 tokens and as many merges),
with at most a few thousand tensors and fewer than a hundred keys.
"""

from __future__ import annotations

import os
import stat
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

MIB = 1024**2
MAX_HEADER_BYTES = 64 * MIB  # the header (keys and tensor infos); real ones: 5-10 MiB
MAX_KEYS = 4096  # real models: 30-100
MAX_TENSORS = 16384  # real models: a few hundred to a few thousand (experts are stacked in one tensor)
MAX_ARRAY_ITEMS = 1 << 21  # 2,097,152; the largest real arrays are vocabularies and merges of < 300,000
MAX_KEY_BYTES = 1024  # real keys: < 100
MAX_NAME_BYTES = 63  # a tensor name: llama.cpp's GGML_MAX_NAME (64) less its NUL
MAX_DIMS = 4  # llama.cpp's GGML_MAX_DIMS
KEEP_BYTES = 1 * MIB  # the values decoded for the caller: bytes, plus 64 per item for Python's objects
CHUNK_BYTES = 1 * MIB
DEADLINE_S = 5.0  # the longest header allowed is read in about a second
_CHECK_EVERY = 4096  # items of an array between two looks at the clock
_INT64_MAX = (1 << 63) - 1
_MAGIC = b"GGUF"
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class NotAModel(Exception):
    """Not a GGUF llama.cpp can load (the message says why, in one line)."""


@dataclass(frozen=True)
class Tensor:
    name: str
    type: GGMLQuantizationType
    dims: tuple[int, ...]
    offset: int  # from the start of the data section
    n_bytes: int


@dataclass(frozen=True)
class Header:
    version: int
    types: dict[str, tuple[int, ...]]  # every key's GGUF value type; an array's adds its items' type
    values: dict[str, Any]  # the kept keys' values: int, float, bool, str, or a list of them
    tensors: list[Tensor]
    alignment: int
    data_offset: int  # where the tensor data begins in the file


def read_header(
    path: Path,
    keep: Callable[[str], bool] = lambda key: False,
    *,
    keep_bytes: int = KEEP_BYTES,
    deadline_s: float = DEADLINE_S,
) -> Header:
    """The header of the GGUF at ``path``, with the values of the keys ``keep`` selects (and
    ``general.alignment``, which places the data); ``NotAModel`` when it is none llama.cpp loads."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (OSError, ValueError) as exc:
        raise NotAModel(f"{path}: cannot open it: {_why(exc)}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAModel(f"{path}: not a regular file ({_kind(info.st_mode)})")
        source = _Source(path, fd, info.st_size, time.monotonic() + deadline_s)
        return _Parser(source, keep, keep_bytes).header()
    except OSError as exc:
        raise NotAModel(f"{path}: cannot read it: {_why(exc)}") from None
    finally:
        os.close(fd)


def why_not_gguf(path: Path) -> str | None:
    """None when ``path`` is a readable regular file that begins with the GGUF magic, else what is
    wrong, as a person reads it: the check of a llama.cpp deployment's model at create and edit
    (api/modelcheck.py) and of a hub model's file once it is downloaded (preparation.py). Only
    what fails every start is checked, without reading past the magic. Blocking: run it in a thread."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        return "no such file on this host"
    except PermissionError:
        return "dgxmm may not read it (permission denied)"
    except OSError as exc:
        return f"cannot open it: {exc.strerror or exc}"
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            return "a directory, not a .gguf file"
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        head = os.read(fd, len(_MAGIC))
    except OSError as exc:
        return f"cannot read it: {exc.strerror or exc}"
    finally:
        os.close(fd)
    if head != _MAGIC:
        return "not a GGUF file (it does not begin with the GGUF magic)"
    return None


def _why(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")


def _show(raw: bytes) -> str:
    """A name from the file, short and printable, for a message."""
    text = raw[:60].decode("utf-8", "replace")
    return repr(text + ("..." if len(raw) > 60 else ""))


class _Source:
    """The file's first bytes through a window of one chunk: every read is checked against what
    the file holds and against the header's limit before it is made."""

    def __init__(self, path: Path, fd: int, size: int, deadline: float) -> None:
        self.path, self.fd, self.size, self.deadline = path, fd, size, deadline
        self.end = min(size, MAX_HEADER_BYTES)
        self.pos = 0  # the file offset of the next byte
        self.buf = b""
        self.buf_at = 0  # the file offset of buf[0]

    def fail(self, reason: str) -> NotAModel:
        return NotAModel(f"{self.path} is not a GGUF file llama.cpp can load: {reason}")

    def left(self) -> int:
        """How many more bytes the header may take."""
        return self.end - self.pos

    def room(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            raise self.beyond(self.pos + n, what)

    def beyond(self, until: int, what: str) -> NotAModel:
        """The refusal of ``what``, which would end at byte ``until``, past the header's limit."""
        if until > self.size:
            return self.fail(f"{what} goes past the end of the file ({self.size} bytes)")
        return self.fail(f"{what} makes the header larger than {MAX_HEADER_BYTES / MIB:g} MiB")

    def clock(self) -> None:
        if time.monotonic() > self.deadline:
            raise self.fail(f"its header takes longer than {DEADLINE_S:g} s to read")

    def take(self, n: int, what: str) -> bytes:
        self.room(n, what)
        start = self.pos - self.buf_at
        if start + n > len(self.buf):  # a new window, at pos
            self.clock()
            self.buf = b""  # the old window goes before the new one is read (from pos, its rest again)
            self.buf = os.pread(self.fd, max(CHUNK_BYTES, n), self.pos)
            self.buf_at, start = self.pos, 0
            if n > len(self.buf):
                raise self.fail(f"{what} could not be read (the file shrank)")
        self.pos += n
        return self.buf[start : start + n]

    def skip(self, n: int, what: str) -> None:
        self.room(n, what)
        self.pos += n

    def u32(self, what: str) -> int:
        return int(_U32.unpack(self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(_U64.unpack(self.take(8, what))[0])

    def skip_strings(self, count: int, what: str) -> None:
        """Walk ``count`` strings (a length, then its bytes) without keeping one: the loop a
        tokenizer's 250,000 tokens take, kept tight (a few lengths at a time from the window)."""
        unpack, done = _U64.unpack_from, 0
        while done < count:
            buf, at = self.buf, self.pos - self.buf_at
            stop = min(len(buf), self.end - self.buf_at) - 8  # the last length in the window and the limit
            while done < count and at <= stop:
                at += 8 + unpack(buf, at)[0]
                done += 1
            if self.buf_at + at > self.end:
                raise self.beyond(self.buf_at + at, f"item {done - 1} of {what}")
            self.pos = self.buf_at + at
            if done < count:
                del buf  # (not kept through the next window's read)
                self.clock()
                self.skip(self.u64(f"the length of item {done} of {what}"), f"item {done} of {what}")
                done += 1


class _Parser:
    """One pass over the header, in the order of the format: magic, version, counts, keys,
    tensor infos; then the tensors placed as llama.cpp places them."""

    def __init__(self, source: _Source, keep: Callable[[str], bool], keep_bytes: int) -> None:
        from gguf import GGUFValueType as VT

        self.src, self.keep, self.kept_left, self.vt = source, keep, keep_bytes, VT
        # the size and struct format of each fixed-size value type
        self.fixed: dict[int, tuple[int, str]] = {
            VT.UINT8: (1, "B"),
            VT.INT8: (1, "b"),
            VT.UINT16: (2, "H"),
            VT.INT16: (2, "h"),
            VT.UINT32: (4, "I"),
            VT.INT32: (4, "i"),
            VT.FLOAT32: (4, "f"),
            VT.BOOL: (1, "?"),
            VT.UINT64: (8, "Q"),
            VT.INT64: (8, "q"),
            VT.FLOAT64: (8, "d"),
        }

    def header(self) -> Header:
        src = self.src
        if src.take(4, "the magic") != _MAGIC:
            raise src.fail("it does not begin with the GGUF magic")
        version = src.u32("the version")
        if version & 0xFFFF == 0:
            raise src.fail(f"version {version:#x}: a big-endian GGUF, which llama.cpp on this host cannot load")
        if version not in (2, 3):
            raise src.fail(f"GGUF version {version} (llama.cpp loads versions 2 and 3)")
        n_tensors, n_kv = src.u64("the tensor count"), src.u64("the key count")
        self.count(n_kv, MAX_KEYS, 8 + 1 + 4 + 1, "keys")  # the smallest: a 1-byte key, a 1-byte value
        self.count(n_tensors, MAX_TENSORS, 8 + 1 + 4 + 4 + 8, "tensors")  # a 1-byte name, no dimension
        types: dict[str, tuple[int, ...]] = {}
        values: dict[str, Any] = {}
        for index in range(n_kv):
            self.key_value(index, types, values)
        alignment = values.get("general.alignment", 32)
        if (
            types.get("general.alignment", (self.vt.UINT32,)) != (self.vt.UINT32,)
            or alignment & (alignment - 1)
            or not alignment
        ):
            raise src.fail(f"general.alignment {alignment!r} is not a power of two (a uint32)")
        if not self.keep("general.alignment"):
            values.pop("general.alignment", None)
        infos = [self.tensor_info(index) for index in range(n_tensors)]
        data_offset = -(-src.pos // alignment) * alignment
        return Header(version, types, values, self.place(infos, alignment, data_offset), alignment, data_offset)

    def count(self, n: int, limit: int, smallest: int, what: str) -> None:
        if n > limit:
            raise self.src.fail(f"it claims {n} {what}, more than the {limit} dgxmm reads (real models have far fewer)")
        if n * smallest > self.src.left():
            raise self.src.fail(f"it claims {n} {what}, more than the rest of its header can hold")

    def key_value(self, index: int, types: dict[str, tuple[int, ...]], values: dict[str, Any]) -> None:
        src = self.src
        n = src.u64(f"the length of key {index}")
        if n == 0 or n > MAX_KEY_BYTES:
            raise src.fail(f"key {index} is {n} bytes long (1 to {MAX_KEY_BYTES})")
        raw = src.take(n, f"key {index}")
        label = _show(raw)  # the key in messages: quoted, on one line, short
        key = self.text(raw, f"key {index} ({label})")
        if key in types:
            raise src.fail(f"the key {label} appears twice")
        kept = key == "general.alignment" or self.keep(key)
        vtype = src.u32(f"the type of {label}")
        if vtype != self.vt.ARRAY:
            self.value_type(vtype, label)
            types[key] = (vtype,)
            found = self.scalar(label, vtype, kept)
        else:
            itype, length = src.u32(f"the item type of {label}"), src.u64(f"the length of {label}")
            self.value_type(itype, label)
            types[key] = (vtype, itype)
            if length > MAX_ARRAY_ITEMS:
                raise src.fail(f"{label} claims {length} items, more than the {MAX_ARRAY_ITEMS} dgxmm reads")
            if length * self.fixed.get(itype, (8, ""))[0] > src.left():  # a string takes 8 bytes or more
                raise src.fail(f"{label} claims {length} items, more than the rest of its header can hold")
            found = self.array(label, itype, length, kept)
        if kept:
            values[key] = found

    def value_type(self, vtype: int, key: str) -> None:
        if vtype not in self.fixed and vtype != self.vt.STRING:
            what = "an array of arrays" if vtype == self.vt.ARRAY else f"the unknown value type {vtype}"
            raise self.src.fail(f"{key} has {what}, which llama.cpp does not load")

    def spend(self, n: int, key: str) -> None:
        self.kept_left -= n
        if self.kept_left < 0:
            raise self.src.fail(f"{key} is larger than the {KEEP_BYTES // 1024} KiB dgxmm reads of the values it uses")

    def scalar(self, key: str, vtype: int, kept: bool) -> Any:
        src = self.src
        if vtype == self.vt.STRING:
            n = src.u64(f"the length of {key}")
            src.room(n, f"{key} ({n} bytes)")
            if kept:
                self.spend(n + 64, key)
                return self.text(src.take(n, key), key)
            src.skip(n, key)
            return None
        size, fmt = self.fixed[vtype]
        return struct.unpack("<" + fmt, src.take(size, key))[0]

    def array(self, key: str, itype: int, length: int, kept: bool) -> list[Any] | None:
        src = self.src
        if itype == self.vt.STRING and not kept:
            src.skip_strings(length, key)
            return None
        if itype != self.vt.STRING:
            size, fmt = self.fixed[itype]
            if not kept:
                src.skip(length * size, key)
                return None
            self.spend(length * (size + 64), key)
            return list(struct.unpack(f"<{length}{fmt}", src.take(length * size, key)))
        items = []
        for i in range(length):
            n = src.u64(f"the length of item {i} of {key}")
            src.room(n, f"item {i} of {key} ({n} bytes)")
            self.spend(n + 64, key)
            items.append(self.text(src.take(n, f"item {i} of {key}"), f"item {i} of {key}"))
        return items

    def text(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.src.fail(f"{what} is not UTF-8") from None

    def tensor_info(self, index: int) -> tuple[str, tuple[int, ...], int, int]:
        src = self.src
        n = src.u64(f"the name length of tensor {index}")
        if n == 0 or n > MAX_NAME_BYTES:
            raise src.fail(f"tensor {index}'s name is {n} bytes long (1 to {MAX_NAME_BYTES}, as in llama.cpp)")
        raw = src.take(n, f"the name of tensor {index}")
        name = self.text(raw, f"the name of tensor {index} ({_show(raw)})")
        n_dims = src.u32(f"the dimension count of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise src.fail(f"tensor {name!r} has {n_dims} dimensions (llama.cpp: at most {MAX_DIMS})")
        dims = struct.unpack(f"<{n_dims}Q", src.take(8 * n_dims, f"the dimensions of tensor {name!r}"))
        return name, dims, src.u32(f"the type of tensor {name!r}"), src.u64(f"the offset of tensor {name!r}")

    def place(
        self, infos: list[tuple[str, tuple[int, ...], int, int]], alignment: int, data_offset: int
    ) -> list[Tensor]:
        """The tensors as llama.cpp places them: each of a known type and a size that does not
        overflow, at the offset where the one before it ends (padded), all within the file."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        src, seen, tensors, expected = self.src, set(), [], 0
        for name, dims, type_id, offset in infos:
            if name in seen:
                raise src.fail(f"the tensor {name!r} appears twice")
            seen.add(name)
            try:
                ggml_type = GGMLQuantizationType(type_id)
            except ValueError:
                raise src.fail(f"tensor {name!r} has the unknown type {type_id}") from None
            block, type_size = GGML_QUANT_SIZES[ggml_type]
            elements = 1
            for dim in dims:
                elements *= dim
                if dim > _INT64_MAX or elements > _INT64_MAX:
                    raise src.fail(f"tensor {name!r} has the dimensions {list(dims)}, whose size overflows")
            if (dims[0] if dims else 1) % block:
                raise src.fail(
                    f"tensor {name!r} has rows of {dims[0] if dims else 1}, not a multiple of the "
                    f"{block} of a {ggml_type.name} block"
                )
            n_bytes = elements // block * type_size
            if offset != expected:
                raise src.fail(f"tensor {name!r} is at offset {offset}, not {expected} where the one before it ends")
            if data_offset + offset + n_bytes > src.size:
                raise src.fail(f"the data of tensor {name!r} ends past the end of the file ({src.size} bytes)")
            expected = offset + -(-n_bytes // alignment) * alignment
            tensors.append(Tensor(name, ggml_type, dims, offset, n_bytes))
        return tensors
