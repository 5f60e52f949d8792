"""A deployment as the admin API and its event stream show it: the record, its effective mode,
its engine's address while it runs, the controller's on-demand status, the LiteLLM status, the
honest status (``livestatus``) and the command line it runs with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dgxmm.deploy.cmdline import command_line
from dgxmm.deploy.models import Deployment

if TYPE_CHECKING:
    from dgxmm.context import Context


def view(ctx: Context, dep: Deployment) -> dict[str, Any]:
    data = dep.model_dump(mode="json", exclude={"runtime_handle", "mode"})
    data["mode"] = dep.effective_mode.value
    data["base_url"] = dep.base_url
    data["ondemand"] = ctx.ondemand.status(dep.id) if dep.is_on_demand else None
    litellm = ctx.litellm.status(dep.id) if ctx.litellm is not None else None
    data["litellm"] = litellm or {"status": "disabled", "error": None}
    data["status"] = ctx.live.status(dep)
    data["command_line"] = command_line(dep, ctx.settings)
    return data
