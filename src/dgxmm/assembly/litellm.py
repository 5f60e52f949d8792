"""The LiteLLM registration built, when ``[litellm] enabled``: it follows the deployments and a
rotation of the on-demand key."""

from __future__ import annotations

import aiohttp

from dgxmm.assembly.deploy import Publish
from dgxmm.deploy.deployer import Deployer
from dgxmm.gateway.keys import KeyFile
from dgxmm.litellm.sync import LiteLLMSync
from dgxmm.settings import Settings
from dgxmm.telemetry.metrics import Metrics


def build_litellm(
    settings: Settings,
    deployer: Deployer,
    keys: KeyFile,
    http: aiohttp.ClientSession,
    publish_view: Publish,
    *,
    instance: str,
    metrics: Metrics,
) -> LiteLLMSync | None:
    """None when disabled. A registration's status change publishes the deployment's view."""
    if not settings.litellm.enabled:
        return None
    sync = LiteLLMSync(
        settings.litellm,
        settings.ondemand,
        deployer,
        keys.current,
        http,
        publish_view,
        instance=instance,
        metrics=metrics,
    )
    keys.on_rotate(lambda key: sync.trigger())
    return sync
