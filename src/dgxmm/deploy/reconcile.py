"""After a dgxmm restart: make the deployment records and the engines the runtime still runs agree.

A killed or restarted dgxmm may leave engines running (containers outlive it; a SIGKILL leaves
child processes) and records that say starting, ready, asleep or stopping. Nothing may stay
untracked: an engine is either adopted into a state that counts its memory, or stopped and
removed; it is never left running behind a stopped deployment. Always-on deployments that were
running, or that the last shutdown stopped, are started again. Planned deployments pick up the
fetch of their model's files (preparation.py; the model store resumes the transfer).

This runs once, before the server accepts a request, and writes only through the deployer's
public transitions (``adopt``, ``declare_stopped``, ``restart``): the deployer stays the only writer of
records.
"""

from __future__ import annotations

import logging

import aiohttp

from dgxmm.deploy import probe
from dgxmm.deploy.deployer import Deployer
from dgxmm.deploy.ending import SHUTDOWN_REASON
from dgxmm.deploy.engines import engine_of
from dgxmm.records.deployment import RUNNING, Deployment, Mode, RuntimeHandle, State
from dgxmm.events import EventBus

log = logging.getLogger(__name__)


async def reconcile(deployer: Deployer, http: aiohttp.ClientSession, bus: EventBus) -> None:
    """Adopt every engine that serves its counted deployment, stop every other one, then start
    the always-on deployments again (see the module's docstring)."""
    runtime = deployer.runtime
    await runtime.forget_others({dep.id for dep in deployer.all()})
    deployer.preparing.resume()  # (before the restarts below: one of those may plan a fetch itself)
    for dep in deployer.all():
        handle = await runtime.adopt(dep)
        if handle is not None:
            if await _serves(http, dep, handle):
                deployer.adopt(dep.id, handle)
                continue
            await runtime.stop(dep.id, deployer.settings.stop_grace_s)
            bus.event("deployer", dep.id, f"Removed the engine an earlier dgxmm left ({dep.state})")
        if dep.state not in RUNNING:
            continue
        was = dep.state
        dep = deployer.declare_stopped(dep.id, "dgxmm restarted")
        if was is not State.STOPPING and dep.effective_mode is Mode.ALWAYS_ON:  # (pending mode applied)
            _restart_always_on(deployer, dep.id)
    for dep in deployer.all():  # stopped by the last shutdown, not by anyone's wish
        if (
            dep.state is State.STOPPED
            and dep.state_reason == SHUTDOWN_REASON
            and (dep.effective_mode is Mode.ALWAYS_ON)
        ):
            _restart_always_on(deployer, dep.id)


def _restart_always_on(deployer: Deployer, deployment_id: str) -> None:
    try:
        deployer.restart(deployment_id, actor="deployer")
    except Exception as exc:  # noqa: BLE001 - one refusal must not stop the rest
        deployer.declare_stopped(deployment_id, f"not restarted: {exc}")


async def _serves(http: aiohttp.ClientSession, dep: Deployment, handle: RuntimeHandle) -> bool:
    """Whether an engine found running may be kept: its deployment counts it (starting, ready
    or asleep) and it serves, i.e. answers health and, unless asleep, lists its model."""
    if dep.state not in (State.STARTING, State.READY, State.ASLEEP):
        return False
    if not await probe.healthy(http, handle.base_url, engine_of(dep).health_path_of(dep), headers=handle.auth):
        return False
    return dep.state is State.ASLEEP or await probe.lists_model(http, handle.base_url, dep.served_name, handle.auth)
