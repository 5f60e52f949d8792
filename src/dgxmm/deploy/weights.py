"""The files an engine loads for a deployment's ``model``: its weights, each with its size.

One answer for everyone who needs it: the memory limit sizes a model by them (limits.py), and
the page cache drops them after the engine stops (pagecache.py). What counts:

* a file: itself; a split GGUF (``<stem>-00001-of-00003.gguf``) every part present;
* a directory (a snapshot, as vLLM takes): its safetensors files, or its .bin/.pt files when it
  has none (vLLM loads one kind).

Anything else (a hub name, a path only a container sees) has none: ``None``. Finding them is
bounded, since sizing runs on the event loop inside the deployer's check-and-write: a split
GGUF's parts are found in one listing of its directory, never a stat per part its name claims
(``-00001-of-99999`` made 99,999 of them, a 1.3 s stall), and no listing reads past
``MAX_LISTED`` entries.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from dgxmm.errors import InvalidInput

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_GGUF_PART = re.compile(r"^(?P<stem>.*)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
# llama.cpp reads a split GGUF's part count as a uint16 (``split.count``, written by gguf-split and
# read by its model loader): no model it can load has more parts.
MAX_GGUF_PARTS = 65_535
# The most entries of a directory dgxmm reads to find a model's files (a few ms: names only, a
# stat per file found); past it the files are unknown, as for a model only a container sees.
MAX_LISTED = 4096


class WeightFile(NamedTuple):
    path: Path
    size: int  # bytes


def weight_files(model: str) -> list[WeightFile] | None:
    """The files ``model`` names (module docstring), or None when it names no local file or
    directory, or a listing passes ``MAX_LISTED``. ``InvalidInput`` for a split GGUF's part count
    no llama.cpp reads."""
    if not model:
        return None
    path = Path(model)
    try:
        if path.is_file():
            return _gguf_parts(path) if path.suffix == ".gguf" else [WeightFile(path, path.stat().st_size)]
        if path.is_dir():
            return _snapshot(path)
    except OSError:
        return None
    return None


def _snapshot(path: Path) -> list[WeightFile] | None:
    found: list[WeightFile] = []
    with os.scandir(path) as entries:
        for seen, entry in enumerate(entries):
            if seen == MAX_LISTED:
                return None
            if entry.name.endswith(_WEIGHT_SUFFIXES) and entry.is_file():  # (a Hub snapshot's links to blobs too)
                found.append(WeightFile(Path(entry.path), entry.stat().st_size))
    safetensors = [f for f in found if f.path.suffix == ".safetensors"]
    return safetensors or found


def _gguf_parts(path: Path) -> list[WeightFile] | None:
    match = _GGUF_PART.match(path.name)
    if match is None:
        return [WeightFile(path, path.stat().st_size)]
    index, count = int(match["index"]), int(match["count"])
    if not 1 <= index <= count <= MAX_GGUF_PARTS:
        raise InvalidInput(
            f"model: {path.name} claims part {index} of {count}: a split GGUF has 1 to "
            f"{MAX_GGUF_PARTS} parts (llama.cpp's split.count is 16 bits)",
            field="model",
        )
    parts: list[WeightFile] = []
    with os.scandir(path.parent) as entries:
        for seen, entry in enumerate(entries):
            if seen == MAX_LISTED:
                return None
            part = _GGUF_PART.match(entry.name)
            if (
                part is not None
                and part["stem"] == match["stem"]
                and part["count"] == match["count"]
                and 1 <= int(part["index"]) <= count
                and entry.is_file()
            ):
                parts.append(WeightFile(Path(entry.path), entry.stat().st_size))
    return sorted(parts)
