"""``dgxmm import ollama``: each model tag of an Ollama store as a ``llamacpp`` deployment that
serves Ollama's own blob in place: the blob's path is the model, nothing is copied or fetched.

Ollama keeps ``manifests/HOST/NAMESPACE/MODEL/TAG`` (JSON: a config and layers, each a media
type, a ``sha256:<hex>`` digest and a size) and ``blobs/sha256-<hex>``. A tag is imported when
its model layer is a whole GGUF blob; its projector becomes ``--mmproj``, its parameters' num_ctx
``-c`` and their sampling defaults its ``request_defaults`` (``migrate.params``). Everything is read within bounds: the number of manifests and folders, each manifest's and
parameters layer's size, and of a GGUF only its header (deploy/ggufheader.py's bounds, through
deploy/estimate.py). A digest that is not sha256 hex is refused before it names any path, and a
tag with anything missing, truncated or not GGUF is reported and skipped, never half-imported.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from dgxmm.deploy.estimate import estimate
from dgxmm.deploy.ggufheader import NotAModel, why_not_gguf
from dgxmm.migrate.params import ollama_params
from dgxmm.migrate.report import Imported, Report, deployment_name

FILE_NAME = "ollama.toml"
MAX_MANIFESTS = 4096  # tags in one store (real stores: tens)
MAX_FOLDERS = 4 * MAX_MANIFESTS  # hosts, namespaces and models (Ollama's layout: three levels)
MAX_MANIFEST_BYTES = 1024 * 1024  # real ones: under 2 KB
MAX_PARAMS_BYTES = 64 * 1024  # a parameters layer (real ones: a few hundred bytes)
MODEL = "application/vnd.ollama.image.model"
PROJECTOR = "application/vnd.ollama.image.projector"
PARAMS = "application/vnd.ollama.image.params"
TEMPLATE = "application/vnd.ollama.image.template"
SYSTEM = "application/vnd.ollama.image.system"
TENSOR = "application/vnd.ollama.image.tensor"  # a safetensors model's weights, one layer a tensor
LICENSE = "application/vnd.ollama.image.license"
DEFAULT_HOST = "registry.ollama.ai"
_DIGEST = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")  # Ollama's own rule for a blob's digest


class Skip(Exception):
    """This tag is not imported (the message says why)."""


def default_dir() -> Path:
    """Where Ollama keeps its models: ``$OLLAMA_MODELS``, else ``~/.ollama/models``."""
    found = os.environ.get("OLLAMA_MODELS")
    return Path(found) if found else Path.home() / ".ollama" / "models"


def run(models: Path) -> Report:
    """Every tag of the store at ``models`` (blocking: small files and GGUF headers)."""
    report = Report(f"ollama {models}")
    taken: set[str] = set()
    for manifest, name in _manifests(models, report):
        entry = Imported(name)
        report.models.append(entry)
        try:
            entry.fields = _tag(entry, models, manifest, name)
        except Skip as exc:
            entry.skipped = str(exc)
            continue
        entry.fields["name"] = deployment_name(name.replace(":", "-"), taken)
    if not report.models and not report.top:
        report.top.append(f"{models / 'manifests'}: no models found")
    return report


def _manifests(models: Path, report: Report) -> list[tuple[Path, str]]:
    """The manifest files (HOST/NAMESPACE/MODEL/TAG) and the names Ollama gives them."""
    root = models / "manifests"
    if not root.is_dir():
        report.top.append(f"{root}: not a directory (no Ollama store there)")
        return []
    found: list[tuple[Path, str]] = []
    for visited, (folder, dirs, files) in enumerate(os.walk(root)):
        if visited == MAX_FOLDERS:
            report.top.append(f"more than {MAX_FOLDERS} folders under {root}: the rest not read")
            return found
        depth = len(Path(folder).relative_to(root).parts)
        dirs.sort()
        if depth >= 3:
            dirs.clear()  # (tags are files at the fourth level; nothing below is Ollama's)
        if depth != 3:
            continue
        for tag in sorted(files):
            host, namespace, model = Path(folder).relative_to(root).parts
            if len(found) == MAX_MANIFESTS:
                report.top.append(f"more than {MAX_MANIFESTS} manifests: the rest not read")
                return found
            found.append((Path(folder) / tag, _name(host, namespace, model, tag)))
    return found


def _name(host: str, namespace: str, model: str, tag: str) -> str:
    """The name Ollama shows: ``model:tag`` for its own library, else with namespace (and host)."""
    if host == DEFAULT_HOST:
        return f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _tag(entry: Imported, models: Path, manifest: Path, name: str) -> dict[str, Any]:
    layers = _layers(manifest)
    kinds = {layer["mediaType"] for layer in layers}
    if MODEL not in kinds:
        if TENSOR in kinds:
            raise Skip("a safetensors model: llama.cpp serves GGUF only (not imported)")
        raise Skip("no model layer")
    by_kind: dict[str, dict[str, Any]] = {}
    for layer in layers:
        by_kind.setdefault(layer["mediaType"], layer)
    model = _blob(models, by_kind[MODEL], "model")
    args: list[str] = []
    if PROJECTOR in by_kind:
        projector = _blob(models, by_kind[PROJECTOR], "projector")
        args += ["--mmproj", str(projector)]
        entry.carry(f"projector: --mmproj {projector}")
    sampling: dict[str, Any] = {}
    if PARAMS in by_kind:
        args += _params(entry, _blob(models, by_kind[PARAMS], "parameters"), sampling)
    try:
        found = estimate(model, args)
    except NotAModel as exc:
        raise Skip(f"model layer: {exc}") from None
    fields: dict[str, Any] = {
        "served_name": name,
        "aliases": [name.removesuffix(":latest")] if name.endswith(":latest") else [],
        "engine": "llamacpp",
        "model": str(model),
        "memory_gib": found.suggested_gib,
        "mode": "on_demand",
        "args": args,
        **sampling,
    }
    entry.memory = "estimated"
    entry.carry(f"model: served in place from {model}")
    entry.carry(f"names: served as {name!r}" + (f", alias {fields['aliases'][0]!r}" if fields["aliases"] else ""))
    entry.carry(f"memory_gib: {found.suggested_gib:g} estimated from the GGUF (context {found.context})")
    if TEMPLATE in by_kind:
        entry.drop("template: a Go template llama-server cannot read; the GGUF's own chat template is used")
    if SYSTEM in by_kind:
        entry.drop("system: the default system prompt: dgxmm adds no message to a request")
    return fields


def _layers(manifest: Path) -> list[dict[str, Any]]:
    """The manifest's config and layers, each checked: a media type, a sha256 digest, a size."""
    try:
        data = json.loads(_small(manifest, MAX_MANIFEST_BYTES, "manifest"))
    except ValueError:
        raise Skip("manifest: not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
        raise Skip("manifest: not an Ollama manifest (no layers)")
    layers: list[dict[str, Any]] = data["layers"]
    for layer in layers:
        if not isinstance(layer, dict) or not isinstance(layer.get("mediaType"), str):
            raise Skip("manifest: a layer without a media type")
        digest = layer.get("digest")
        if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
            raise Skip(f"manifest: digest {str(digest)[:80]!r} is not sha256:<64 hex digits>")
        size = layer.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise Skip(f"manifest: layer {digest[:19]}: size {size!r} is not a byte count")
    return layers


def _small(path: Path, limit: int, what: str) -> str:
    """A small file's text (a manifest, a parameters layer), refused past ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise Skip(f"{what}: {path} is not a regular file")
            data = os.read(fd, limit + 1)
        finally:
            os.close(fd)
    except OSError as exc:
        raise Skip(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise Skip(f"{what}: larger than {limit} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise Skip(f"{what}: not UTF-8 text") from None


def _blob(models: Path, layer: dict[str, Any], what: str) -> Path:
    """The blob of ``layer``: there, a regular file, of the size the manifest says."""
    path = models / "blobs" / f"sha256-{layer['digest'][-64:].lower()}"  # (checked by _layers)
    try:
        info = os.stat(path)
    except OSError as exc:
        raise Skip(f"{what} blob {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise Skip(f"{what} blob {path}: not a regular file")
    if info.st_size != layer["size"]:
        raise Skip(f"{what} blob {path}: {info.st_size} bytes, the manifest says {layer['size']} (truncated?)")
    if what in ("model", "projector"):
        why = why_not_gguf(path)
        if why is not None:
            raise Skip(f"{what} blob {path}: {why}")
    return path


def _params(entry: Imported, path: Path, fields: dict[str, Any]) -> list[str]:
    """The parameters layer: num_ctx as ``-c``; the sampling defaults into ``fields``
    (``migrate.params``)."""
    try:
        params = json.loads(_small(path, MAX_PARAMS_BYTES, "parameters"))
    except ValueError:
        raise Skip("parameters: not JSON") from None
    if not isinstance(params, dict):
        raise Skip("parameters: not a JSON object")
    args: list[str] = []
    ctx = params.pop("num_ctx", None)
    if isinstance(ctx, int) and not isinstance(ctx, bool) and ctx > 0:
        args = ["-c", str(ctx)]
        entry.carry(f"parameters: num_ctx as -c {ctx}")
    elif ctx is not None:
        entry.drop(f"parameters: num_ctx {ctx!r} is not a context size")
    try:
        ollama_params(entry, params, fields)
    except ValueError as exc:
        raise Skip(f"parameters: {exc}") from None
    return args
