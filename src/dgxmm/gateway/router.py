"""The model router: one OpenAI endpoint for every model on the host, ``{path}/...`` (``/v1`` by
default, outside the base path), so ``OPENAI_BASE_URL=http://host:8090/v1`` reaches them all.

The gateway serves it with the same checks, slots and streaming as the per-deployment routes;
what differs is how a request finds its deployment: by the ``model`` it names (the body's, or
the path's for ``models/{name}``), among every deployment's served name and aliases (unique on a
host, ``deploy.names``). The list and a model's entry are answered here, from the records and
the controller, and start nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

from dgxmm.gateway.paths import under
from dgxmm.records.deployment import Deployment, Role


class Names(Protocol):
    """The deployer, as the router reads it: stored records (not copies), by name and all."""

    def by_name(self, name: str) -> Deployment | None: ...

    def peek_all(self) -> list[Deployment]: ...


class Phases(Protocol):
    """The on-demand controller, as the router reads it: a deployment's public status."""

    def status(self, deployment_id: str) -> dict[str, Any]: ...


class Router:
    def __init__(self, prefix: str, deployer: Names, controller: Phases) -> None:
        self.prefix = prefix.rstrip("/")
        self._deployer = deployer
        self._controller = controller

    def claims(self, path: str) -> bool:
        """Whether a request for ``path`` (percent-decoded) is the router's."""
        return under(path, self.prefix)

    def find(self, name: str) -> Deployment | None:
        """The deployment called ``name`` (its stored record, not a copy)."""
        return self._deployer.by_name(name)

    def models(self) -> dict[str, Any]:
        """``GET {path}/models``: an entry per name of every deployment callers can use."""
        data = [
            self._entry(dep, name)
            for dep in self._deployer.peek_all()
            if dep.role is not Role.DECIDER
            for name in dep.names
        ]
        data.sort(key=lambda entry: entry["id"])
        return {"object": "list", "data": data}

    def model(self, name: str) -> dict[str, Any] | None:
        """``GET {path}/models/{name}``: the entry of ``name``, or None."""
        dep = self.find(name)
        return None if dep is None or dep.role is Role.DECIDER else self._entry(dep, name)

    def _entry(self, dep: Deployment, name: str) -> dict[str, Any]:
        """OpenAI's model object, and what ``ollama ps`` or llama-swap's ``/running`` tell."""
        phase = self._controller.status(dep.id)["phase"] if dep.is_on_demand else None
        return {
            "id": name,
            "object": "model",
            "created": int(dep.created_at),
            "owned_by": "dgxmm",
            "dgxmm": {
                "deployment_id": dep.id,
                "deployment": dep.name,
                "served_name": dep.served_name,
                "alias": name != dep.served_name,
                "state": dep.state.value,
                "mode": dep.effective_mode.value,
                "phase": phase,
            },
        }
