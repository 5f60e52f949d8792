"""The running service as ``dgxmm.assembly`` builds it (issue 48 item 3): the listeners of a
deployment's change registered in the order the code gives, and a context no one rewires."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import make_settings


async def test_a_change_is_heard_by_the_deployers_bookkeeping_then_by_the_tuple_in_its_order(
    serve, tmp_path: Path
) -> None:
    """The measured memory first (a start begins a new run before anyone decides on it), then
    the tuple of ``assembly.listeners``: the controller's listener (its state's ``hear``), which
    the controller handed over as it was built, and no other registration of it."""
    svc = await serve(make_settings(tmp_path))
    ctx = svc.ctx
    heard = ctx.deployer._ledger.listeners
    controllers = [listener for listener in heard if getattr(listener, "__self__", None) is ctx.ondemand.state]
    assert len(controllers) == 1
    expected = (
        controllers[0],
        ctx.live.on_change,
        ctx.history.on_change,
        ctx.publisher.on_change,
        ctx.metrics.on_change,
    )
    assert heard == [ctx.measured.on_change, *expected]


async def test_the_context_is_not_rewired_after_it_is_built(serve, tmp_path: Path) -> None:
    svc = await serve(make_settings(tmp_path))
    with pytest.raises(dataclasses.FrozenInstanceError):
        svc.ctx.live = svc.ctx.live  # type: ignore[misc]
    resp = await svc.client.get("/api/host")
    assert resp.status_code == 200
    assert resp.json()["config"] == svc.app.state.declared.status()  # the declared files' status, as built
