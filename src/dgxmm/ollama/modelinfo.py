"""What ``/api/show`` reads of a model on this host, in the GGUF header's terms: a GGUF's own
header (``deploy.ggufheader``, within its bounds), or, for a model directory (vLLM's, SGLang's),
its ``config.json`` and chat template put in those terms, so that every model says its
architecture and that architecture's context length (VS Code Copilot reads
``model_info["general.architecture"]`` and ``<arch>.context_length`` before it offers a model).

Blocking (a stat, small reads): run in a worker thread. Each file is read only up to its bound
(a longer one is left unread, as if absent); nothing here trusts a file's shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgxmm.deploy.ggufheader import NotAModel, read_header
from dgxmm.records.deployment import Deployment

TEMPLATE = "tokenizer.chat_template"
CONFIG_BYTES = 1024 * 1024  # a config.json or a chat template: anything longer is not read
TOKENIZER_CONFIG_BYTES = 16 * 1024 * 1024  # tokenizer_config.json lists the added tokens too
_SHAPE = (".context_length", ".embedding_length", ".block_count", ".pooling_type", ".attention.head_count")
# config.json's names of what the GGUF header calls <arch>.NAME
_CONFIG_SHAPE = {
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
}


@dataclass(frozen=True)
class ModelInfo:
    """The header's values (a model directory's in the header's names) and whether the model
    directory has a vision part (a GGUF's shows in its engine's ``--mmproj``)."""

    header: dict[str, Any] = field(default_factory=dict)
    vision: bool = False


def read(dep: Deployment) -> ModelInfo:
    """What the deployment's model file or directory says (empty when it has neither here)."""
    source = Path(dep.model_path or dep.model)
    try:
        if source.suffix.lower() == ".gguf" and source.is_file():
            return ModelInfo(_gguf(source))
        if (source / "config.json").is_file():
            return _directory(source)
    except OSError:
        pass
    return ModelInfo()


def _kept(key: str) -> bool:
    """The header's keys ``/api/show`` reads: the general ones, the shape, the chat template, the
    fill-in-the-middle tokens (the chat template is read, not shown: it may be long)."""
    return key.startswith(("general.", "tokenizer.ggml.fim")) or key.endswith(_SHAPE) or key == TEMPLATE


def _gguf(path: Path) -> dict[str, Any]:
    try:
        return read_header(path, _kept).values
    except NotAModel:
        return {}


def _directory(path: Path) -> ModelInfo:
    """``config.json``'s ``model_type`` as the architecture and its sizes under the header's
    names (a model with a vision part: its ``text_config``'s), and the chat template of
    ``tokenizer_config.json`` or ``chat_template.jinja``."""
    config = _json(path / "config.json", CONFIG_BYTES)
    text = config.get("text_config")
    text = text if isinstance(text, dict) else {}
    arch = config.get("model_type") or text.get("model_type")
    header: dict[str, Any] = {}
    if isinstance(arch, str) and arch:
        header["general.architecture"] = arch
        for name, key in _CONFIG_SHAPE.items():
            value = config.get(key) or text.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                header[f"{arch}.{name}"] = value
    template = _json(path / "tokenizer_config.json", TOKENIZER_CONFIG_BYTES).get("chat_template")
    if not isinstance(template, str):
        template = _text(path / "chat_template.jinja", CONFIG_BYTES)
    if template:
        header[TEMPLATE] = template
    return ModelInfo(header, vision=isinstance(config.get("vision_config"), dict))


def _text(path: Path, bound: int) -> str:
    try:
        if path.stat().st_size > bound:
            return ""
        with path.open("rb") as f:
            return f.read(bound).decode("utf-8", "replace")
    except OSError:
        return ""


def _json(path: Path, bound: int) -> dict[str, Any]:
    raw = _text(path, bound)
    try:
        data = json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}
