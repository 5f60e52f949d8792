"""What Ollama's read routes say of the host's models: ``/api/tags``, ``/api/ps``, ``/api/show``,
built from the router's entries (``GET /v1/models``: the names a caller key may use, each
deployment's state) and the deployment records; nothing here starts or asks an engine.

Names carry a tag, as Ollama's do: a name without one is listed as ``NAME:latest`` (and the
router takes ``NAME:latest`` for ``NAME``, ``gateway.router.Router.canonical``). A ``digest`` is
no file's (dgxmm serves models it does not pull as blobs): the SHA-256 of the deployment's id
and served name, stable while the deployment is. ``size`` and ``size_vram`` are the memory dgxmm
budgets for the deployment; ``expires_at`` is when its idle timer would stop it (far in the
future for an always-on model, as Ollama says of ``keep_alive: -1``). ``/api/show`` reads the
model's GGUF header or model directory (``modelinfo``, in a worker thread): the architecture,
its context length (VS Code Copilot reads ``<arch>.context_length``) and what the model can do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from dgxmm.ollama.modelinfo import TEMPLATE, ModelInfo
from dgxmm.records.deployment import Deployment, State

GIB = 1024**3
FOREVER = "2318-11-26T00:00:00Z"  # what ``expires_at`` says of a model no idle timer stops
LATEST = ":latest"


def tagged(name: str) -> str:
    """``name`` with Ollama's tag: ``:latest`` where it has none."""
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat().replace("+00:00", "Z")


def details(dep: Deployment) -> dict[str, Any]:
    source = dep.model_path or dep.model
    return {
        "parent_model": "",
        "format": "gguf" if source.lower().endswith(".gguf") else "safetensors" if source else "",
        "family": "",
        "families": None,
        "parameter_size": "",
        "quantization_level": "",
    }


def _model(name: str, dep: Deployment) -> dict[str, Any]:
    digest = hashlib.sha256(f"{dep.id}/{dep.served_name}".encode()).hexdigest()
    return {
        "name": tagged(name),
        "model": tagged(name),
        "modified_at": iso(dep.updated_at),
        "size": int(dep.memory_gib * GIB),
        "digest": digest,
        "details": details(dep),
    }


def tags(entries: list[dict[str, Any]], peek: Callable[[str], Deployment | None]) -> dict[str, Any]:
    """``GET /api/tags``: every name the caller may use (the router's ``entries``)."""
    models = []
    for entry in entries:
        dep = peek(entry["dgxmm"]["deployment_id"])
        if dep is not None:
            models.append(_model(entry["id"], dep))
    return {"models": models}


def ps(
    entries: list[dict[str, Any]],
    peek: Callable[[str], Deployment | None],
    expiry: Callable[[Deployment], float | None],
) -> dict[str, Any]:
    """``GET /api/ps``: the models running now (ready), each once under its served name, with
    when its idle timer stops it (``expiry``: a wall-clock time, None for never)."""
    models = []
    for entry in entries:
        dep = peek(entry["dgxmm"]["deployment_id"])
        if dep is None or dep.state is not State.READY or entry["id"] != dep.served_name:
            continue
        stops = expiry(dep)
        model = _model(entry["id"], dep)
        model.update(expires_at=FOREVER if stops is None else iso(stops), size_vram=model["size"])
        models.append(model)
    return {"models": models}


def show(dep: Deployment, known: ModelInfo) -> dict[str, Any]:
    """``POST /api/show``: what dgxmm knows of the model without asking its engine: the GGUF
    header's values, or a model directory's in the header's names (``known``), else its name
    only. ``capabilities`` says what they show: ``embedding`` (a pooling type) or
    ``completion``, ``tools`` and ``thinking`` (the chat template handles them), ``insert``
    (fill-in-the-middle tokens), ``vision`` (an ``--mmproj`` among the engine's arguments, or a
    model directory's vision part)."""
    header = known.header
    info = {key: value for key, value in header.items() if key != TEMPLATE}
    info.setdefault("general.basename", dep.served_name)
    info.setdefault("general.architecture", "")
    template = header.get(TEMPLATE)
    template = template if isinstance(template, str) else ""
    arch = info["general.architecture"]
    capabilities = ["embedding" if f"{arch}.pooling_type" in header else "completion"]
    if "tools" in template:
        capabilities.append("tools")
    if "<think>" in template or "thinking" in template:
        capabilities.append("thinking")
    if any(key.startswith("tokenizer.ggml.fim") for key in header):
        capabilities.append("insert")
    if known.vision or any(arg in ("--mmproj", "-mm") for arg in dep.args):
        capabilities.append("vision")
    if dep.capabilities:  # the deployment's word, where the files cannot tell
        capabilities = list(dep.capabilities)
    return {
        "license": "",
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": details(dep),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": iso(dep.updated_at),
    }
