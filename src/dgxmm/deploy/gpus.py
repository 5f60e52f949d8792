"""A deployment's devices: how many it spans, which it may use, and what its engine is told.

* ``gpus`` is how many devices the engine spans; a vLLM deployment's own
  ``--tensor-parallel-size`` (``-tp``) times ``--pipeline-parallel-size`` (``-pp``) sets it, and a
  ``gpus`` that disagrees is refused. ``gpu_ids`` pins it to those devices, as many as it spans.
* On a host with devices (declared ``devices_gib``, or ``nvml``) the engine is told its devices:
  ``CUDA_VISIBLE_DEVICES`` with the indices NVML gives (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so CUDA
  numbers them as NVML does), vLLM a ``--tensor-parallel-size`` when it spans several and the
  deployment gave none. On a pooled host (a declared ``capacity_gib``, or unified memory) nothing
  is set: CPU engines and a DGX Spark behave as they always did.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgxmm.errors import InvalidInput
from dgxmm.records.deployment import Deployment

TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")


def _flag_value(args: Sequence[str], names: tuple[str, ...]) -> int | None:
    """The last value of one of ``names`` in ``args`` (``--flag N`` or ``--flag=N``; vLLM reads
    ``_`` as ``-``), as vLLM's parser keeps it."""
    found: int | None = None
    for index, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name.replace("_", "-") not in names:
            continue
        if not eq:
            value = args[index + 1] if index + 1 < len(args) else ""
        if not value.isdigit() or int(value) < 1:
            raise InvalidInput(f"args: {name} needs a whole number of devices, not {value!r}", field="args")
        found = int(value)
    return found


def parallel_size(dep: Deployment) -> int | None:
    """How many devices a vLLM deployment's own parallel flags span (None: it gives none)."""
    if dep.engine != "vllm":
        return None
    tp, pp = _flag_value(dep.args, TP_FLAGS), _flag_value(dep.args, PP_FLAGS)
    if tp is None and pp is None:
        return None
    return (tp or 1) * (pp or 1)


def settled(dep: Deployment, devices: Sequence[int], pooled: bool) -> Deployment:
    """``dep`` with ``gpus`` set from its engine's own parallel flags, checked against the host's
    ``devices``; ``InvalidInput`` naming the field when they cannot work together."""
    spans = parallel_size(dep)
    if spans is not None and dep.gpus is not None and dep.gpus != spans:
        raise InvalidInput(
            f"gpus: {dep.gpus} disagrees with the engine's own parallel flags in args, which span {spans} devices",
            field="gpus",
        )
    if spans is not None and dep.gpus is None:
        dep = dep.model_copy(update={"gpus": spans})
    pins = dep.gpu_ids
    if pins is not None:
        if len(set(pins)) != len(pins):
            raise InvalidInput("gpu_ids: each device may appear once", field="gpu_ids")
        if len(pins) != dep.device_count:
            raise InvalidInput(
                f"gpu_ids: {len(pins)} devices given for gpus = {dep.device_count}: give as many as it spans",
                field="gpu_ids",
            )
    if pooled:
        return dep  # one pooled device: what the engine spans is its own business, as before
    present = sorted(devices)
    if dep.device_count > len(present):
        raise InvalidInput(
            f"gpus: {dep.device_count} is more devices than this host has ({len(present)})", field="gpus"
        )
    missing = [pin for pin in pins or () if pin not in present]
    if missing:
        raise InvalidInput(
            f"gpu_ids: this host has no device {missing[0]} (its devices: {', '.join(map(str, present))})",
            field="gpu_ids",
        )
    return dep


def visible_devices(placed: Sequence[int] | None) -> dict[str, str]:
    """The environment that shows an engine only the devices it was placed on (``placed_on``;
    None on a pooled host: nothing is set)."""
    if placed is None:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in placed), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def tensor_parallel_args(dep: Deployment) -> list[str]:
    """vLLM's ``--tensor-parallel-size`` for a deployment placed on several devices that gave no
    parallel flags of its own."""
    placed = dep.placed_on
    if placed is None or len(placed) <= 1 or dep.engine != "vllm" or parallel_size(dep) is not None:
        return []
    return ["--tensor-parallel-size", str(len(placed))]
