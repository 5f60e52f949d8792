"""What each vLLM sleep level asks of the engine and what it leaves held (issue 52 item 2).

vLLM (its documentation's "Sleep Mode" page; development mode) sleeps at a level or by memory tag:

- **1**: ``POST /sleep?level=1`` moves the weights to host memory and drops the KV cache; ``POST
  /wake_up`` brings them back. On a discrete GPU the device keeps only the engine's CUDA context;
  on unified memory (a DGX Spark) host memory is the same pool, so the weights stay counted.
- **2**: ``POST /sleep?level=2`` drops weights and KV cache; the wake is three steps, in vLLM's
  order: ``POST /wake_up?tags=weights`` (the weights' memory again), ``POST /collective_rpc``
  ``{"method": "reload_weights"}`` (read them again, in place), ``POST /wake_up?tags=kv_cache``.
- **kv**: ``POST /sleep?tags=kv_cache`` drops only the KV cache; ``POST
  /wake_up?tags=kv_cache`` allocates it again. The weights stay where they are.

A deployment's ``sleep_level`` picks one; unset, the level that frees memory on this host: 1 on
discrete GPUs, 2 on unified memory (where 1 frees only the KV cache). What an asleep engine
still holds is measured where dgxmm can (``Measured``: a reading taken while asleep), else
estimated here from the level, the weights dgxmm read from the model's files and a CUDA
context's share; unknown weights count as the whole declaration, so an estimate never frees
memory that is still held.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dgxmm.records.deployment import Deployment

SleepLevel = Literal[1, 2, "kv"]

# What the engine keeps on the device through any sleep: its CUDA context and allocator pools
# (vLLM's docs: "releasing up to 90%+ of GPU memory"). An estimate, used until a reading says.
CONTEXT_GIB = 1.0


@dataclass(frozen=True)
class WakeStep:
    path: str  # the engine's route, with its query
    json: dict[str, object] | None = None  # its body, where it has one


@dataclass(frozen=True)
class Level:
    sleep_path: str
    wake: tuple[WakeStep, ...]
    keeps_weights_on_device: bool  # on a discrete GPU (on unified memory, level 1's host copy counts too)
    keeps_weights_in_host: bool


LEVELS: dict[SleepLevel, Level] = {
    1: Level("/sleep?level=1", (WakeStep("/wake_up"),), keeps_weights_on_device=False, keeps_weights_in_host=True),
    2: Level(
        "/sleep?level=2",
        (
            WakeStep("/wake_up?tags=weights"),
            WakeStep("/collective_rpc", {"method": "reload_weights"}),
            WakeStep("/wake_up?tags=kv_cache"),
        ),
        keeps_weights_on_device=False,
        keeps_weights_in_host=False,
    ),
    "kv": Level(
        "/sleep?tags=kv_cache",
        (WakeStep("/wake_up?tags=kv_cache"),),
        keeps_weights_on_device=True,
        keeps_weights_in_host=False,
    ),
}


def level_of(dep: Deployment, unified: bool) -> SleepLevel:
    """The deployment's ``sleep_level``, or the one that frees memory on this host."""
    if dep.sleep_level is not None:
        return dep.sleep_level
    return 2 if unified else 1


def asleep_holds_gib(dep: Deployment, unified: bool) -> float:
    """What an asleep engine of ``dep`` still holds of the budget, estimated (no reading)."""
    level = LEVELS[level_of(dep, unified)]
    weights = dep.memory_limit.weights_gib if dep.memory_limit is not None else None
    kept = level.keeps_weights_on_device or (unified and level.keeps_weights_in_host)
    if not kept:
        return min(CONTEXT_GIB, dep.memory_gib)
    if weights is None:  # not known: the whole declaration, as before sleeping
        return dep.memory_gib
    return min(weights + CONTEXT_GIB, dep.memory_gib)
