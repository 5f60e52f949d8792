"""A deployment's devices: how many it spans, which it may use, and what its engine is told.

* ``gpus`` is how many devices the engine spans; a vLLM deployment's own
  ``--tensor-parallel-size`` (``-tp``) times ``--pipeline-parallel-size`` (``-pp``) sets it (an
  SGLang one's ``--tp-size`` times ``--pp-size``, or the same long names), and a ``gpus`` that
  disagrees is refused. ``gpu_ids`` pins it to those devices, as many as it spans.
* On a host with devices (declared ``devices_gib``, or ``nvml``) the engine is told its devices:
  ``CUDA_VISIBLE_DEVICES`` with the indices NVML gives (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so CUDA
  numbers them as NVML does), vLLM a ``--tensor-parallel-size`` (SGLang a ``--tp-size``) when it
  spans several and the deployment gave none. On a pooled host (a declared ``capacity_gib``, or unified memory) nothing
  is set: CPU engines and a DGX Spark behave as they always did.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgxmm.errors import InvalidInput
from dgxmm.records.deployment import Deployment

# Each engine's parallel flags, by the names its parser takes: (tensor parallel, pipeline parallel).
PARALLEL_FLAGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "vllm": (("--tensor-parallel-size", "-tp"), ("--pipeline-parallel-size", "-pp")),
    "sglang": (("--tp-size", "--tensor-parallel-size"), ("--pp-size", "--pipeline-parallel-size")),
}


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
    """How many devices a vLLM or SGLang deployment's own parallel flags span (None: it gives
    none, or its engine has no such flags)."""
    flags = PARALLEL_FLAGS.get(dep.engine)
    if flags is None:
        return None
    tp, pp = _flag_value(dep.args, flags[0]), _flag_value(dep.args, flags[1])
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
    """The engine's tensor parallel flag (vLLM's ``--tensor-parallel-size``, SGLang's
    ``--tp-size``) for a deployment placed on several devices that gave no parallel flags of its own."""
    placed, flags = dep.placed_on, PARALLEL_FLAGS.get(dep.engine)
    if placed is None or len(placed) <= 1 or flags is None or parallel_size(dep) is not None:
        return []
    return [flags[0][0], str(len(placed))]
