"""What dgxmm can say of a model's context without asking its engine, for the model list's
``meta`` (llama.cpp's router puts it beside ``status``; Open WebUI, ``pi`` and others size a
conversation by it) and the ``/props`` answer of a model that is not ready (``gateway.props``).

- ``n_ctx`` and ``context_length``: the context the engine serves, as its arguments set it
  (llama-server's ``-c``/``--ctx-size``, vLLM's ``--max-model-len``), else, for a GGUF, the
  model's own (llama-server takes it from the model when ``-c`` is absent or 0, as
  ``deploy.estimate`` counts it);
- ``n_ctx_train``: the GGUF header's ``<arch>.context_length``, llama.cpp's name for it; for a
  model directory (vLLM's, SGLang's), its ``config.json``'s ``max_position_embeddings`` (or its
  ``text_config``'s), from which vLLM takes its context when ``--max-model-len`` is absent (a
  rope-scaled model may serve more: vLLM's own answer then differs).

A key is absent where dgxmm does not know it. The header is read within ``deploy.ggufheader``'s
bounds, a ``config.json`` of at most ``CONFIG_BYTES``, in a worker thread, once per version of
the file (its size and modification time), and kept for at most ``MAX_KNOWN`` models.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dgxmm.deploy.estimate import server_options
from dgxmm.deploy.ggufheader import NotAModel, read_header
from dgxmm.records.deployment import Deployment

MAX_KNOWN = 4096  # models whose context is kept
CONFIG_BYTES = 1024 * 1024  # a model's config.json: anything longer is not read
ARCH = "general.architecture"
Version = tuple[int, int]  # a file's size and modification time (ns)


def context_of(dep: Deployment) -> int | None:
    """The context the deployment's engine was started with, where its arguments say it
    (llama-server's ``-c``/``--ctx-size``, vLLM's ``--max-model-len``); None when they leave it
    to the model."""
    args = dep.args
    for i, arg in enumerate(args):
        flag, _, inline = arg.partition("=")
        value = inline or (args[i + 1] if i + 1 < len(args) else "")
        if flag == "--max-model-len" and value.isdigit():
            return int(value) or None
    return server_options(args).context or None


def _source(dep: Deployment) -> str:
    return dep.model_path or dep.model


class Contexts:
    """The trained context of each deployment's GGUF, as its header says it."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[Version, int | None]] = {}

    async def learn(self, deps: Iterable[Deployment]) -> None:
        """Read the headers of the GGUFs among ``deps``' models not read yet or changed since."""
        sources = {_source(dep) for dep in deps if not dep.awaits_files}
        if not sources:
            return
        versions = {source: known[0] for source, known in self._known.items() if source in sources}
        found = await asyncio.to_thread(_read, sources, versions)
        for source, known in found.items():
            self._known.pop(source, None)
            if len(self._known) >= MAX_KNOWN:
                del self._known[next(iter(self._known))]
            self._known[source] = known

    def meta(self, dep: Deployment) -> dict[str, Any]:
        """``meta`` of the deployment's list entry: what is known of its context (maybe nothing)."""
        known = self._known.get(_source(dep))
        trained = known[1] if known is not None else None
        served = context_of(dep) or trained  # (vLLM and llama-server default to the model's)
        out: dict[str, Any] = {} if served is None else {"n_ctx": served, "context_length": served}
        if trained is not None:
            out["n_ctx_train"] = trained
        return out


def _read(sources: set[str], versions: dict[str, Version]) -> dict[str, tuple[Version, int | None]]:
    """The trained context of each source whose version differs from ``versions``' (blocking)."""
    found: dict[str, tuple[Version, int | None]] = {}
    for source in sources:
        path = Path(source)
        config = path / "config.json"
        read = _configured if config.is_file() else _trained if path.suffix.lower() == ".gguf" else None
        if read is None:
            continue
        try:
            st = (config if read is _configured else path).stat()
        except OSError:
            continue
        version = (st.st_size, st.st_mtime_ns)
        if versions.get(source) == version:
            continue
        length = read(config if read is _configured else path, st.st_size)
        found[source] = (
            version,
            length if isinstance(length, int) and not isinstance(length, bool) and length > 0 else None,
        )
    return found


def _trained(gguf: Path, _size: int) -> object:
    """A GGUF header's ``<arch>.context_length``."""
    try:
        values = read_header(gguf, lambda key: key == ARCH or key.endswith(".context_length")).values
    except NotAModel:
        return None
    return values.get(f"{values.get(ARCH)}.context_length")


def _configured(config: Path, size: int) -> object:
    """A model directory's ``config.json``'s ``max_position_embeddings`` (its own, or its
    ``text_config``'s for a model with a vision part)."""
    if size > CONFIG_BYTES:
        return None
    try:
        data = json.loads(config.read_bytes()[:CONFIG_BYTES])
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    text = data.get("text_config")
    return data.get("max_position_embeddings") or (
        text.get("max_position_embeddings") if isinstance(text, dict) else None
    )
