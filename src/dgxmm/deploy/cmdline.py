"""The command line a deployment's engine runs, or will run at its next start, as people read it.

The runtimes build the same argument lists when they launch an engine; this shows them without
launching anything. A port that is not known yet (the engine is not running) reads ``{port}``.
"""

from __future__ import annotations

from dgxmm.deploy.engines import engine_of
from dgxmm.records.deployment import Deployment
from dgxmm.settings import Settings


class _UnknownPort(int):
    """A port that prints as the placeholder, so argument builders fill in ``{port}``."""

    def __str__(self) -> str:
        return "{port}"


def command_line(dep: Deployment, settings: Settings) -> list[str]:
    """The process's argv (``process`` runtime), or the image and the container's command
    after its entrypoint (``docker`` runtime)."""
    kind = engine_of(dep)
    if settings.runtime.kind == "docker":
        image = dep.image or kind.image(settings.engines) or ""
        return [image, *kind.container_cmd(dep, kind.container_port)]
    handle = dep.runtime_handle
    port = handle.port if dep.base_url and handle is not None and handle.port else _UnknownPort(0)
    return kind.argv(dep, port, settings.engines)
