"""A device that disappears while dgxmm runs (a GPU that fell off the bus): its deployments are
failed with the reason, nothing new is placed there, and the rest of the host keeps serving.

The budget notices: a device the source no longer reports reads as gone (``MemoryBudget.lost``)
and has no room, so no fit check places anything there. This loop, on the metrics sampler's
clock, fails what runs there through the deployer's one way for an engine that died
(``Deployer.fail``, the watchdog's), so views, events and the controller hear it as they hear any
engine failure.
"""

from __future__ import annotations

import asyncio
import logging

from dgxmm.deploy.deployer import Deployer

log = logging.getLogger(__name__)


async def check_devices(deployer: Deployer, told: set[int]) -> list[str]:
    """One look: fail the deployments on devices that are gone; returns their ids. ``told``: the
    lost devices already logged (each is logged once)."""
    deployer.snapshot()  # reads the source: what it no longer reports is lost
    budget = deployer.budget
    lost = budget.lost
    for index in sorted(lost - told):
        log.error("device %d is gone from NVML: its deployments are failed, nothing is placed there", index)
    told &= lost  # a device that comes back is logged again if it goes again
    told |= lost
    if not lost:
        return []
    names = {device.index: device.name for device in budget.devices()}
    failed = []
    for dep in deployer.peek_all():
        gone = sorted(set(budget.devices_of(dep)) & lost) if dep.holds_memory else []
        if gone:
            failed.append(dep.id)
            await deployer.fail(dep.id, f"device {gone[0]} ({names.get(gone[0], 'GPU')}) is gone from NVML")
    return failed


async def watch_devices(deployer: Deployer, interval_s: float) -> None:
    """``check_devices`` every ``interval_s`` (a supervised task, with the nvml source)."""
    told: set[int] = set()
    while True:
        await check_devices(deployer, told)
        await asyncio.sleep(interval_s)
