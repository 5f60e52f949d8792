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

from dgxmm.gateway.collaborators import OndemandStatus
from dgxmm.gateway.modelmeta import Contexts
from dgxmm.gateway.modelstatus import llamacpp_status
from dgxmm.gateway.paths import under
from dgxmm.modelstore.names import Readiness
from dgxmm.records.deployment import Deployment, Role

LATEST = ":latest"


class NamedDeployments(Protocol):
    """The deployer, as the router reads it: stored records (not copies), by name and all."""

    def by_name(self, name: str) -> Deployment | None: ...

    def peek_all(self) -> list[Deployment]: ...


class Downloads(Protocol):
    """The model store, as the router reads it: how far a hub model's files are."""

    def readiness_of(self, model: str) -> Readiness: ...


class Router:
    def __init__(
        self,
        prefix: str,
        deployer: NamedDeployments,
        controller: OndemandStatus,
        downloads: Downloads | None = None,
    ) -> None:
        self.prefix = prefix.rstrip("/")
        self._deployer = deployer
        self._controller = controller
        self._downloads = downloads
        self.contexts = Contexts()  # each model's context, for the entries' ``meta``

    def claims(self, path: str) -> bool:
        """Whether a request for ``path`` (percent-decoded) is the router's."""
        return under(path, self.prefix)

    def canonical(self, name: str) -> str:
        """``name`` as the host knows it: Ollama's clients add the tag ``:latest`` to a name
        without one (``/api/tags`` lists ``qwen3`` as ``qwen3:latest``, and Copilot then chats
        through ``/v1`` by that name), so ``NAME:latest`` is ``NAME`` where no deployment is
        called ``NAME:latest`` itself."""
        if name.endswith(LATEST) and self._deployer.by_name(name) is None:
            return name.removesuffix(LATEST)
        return name

    def find(self, name: str) -> Deployment | None:
        """The deployment called ``name`` (its stored record, not a copy), ``:latest`` implied."""
        return self._deployer.by_name(self.canonical(name))

    async def learn(self) -> None:
        """Read what the entries' ``meta`` needs of the models' files (``modelmeta``), off the loop."""
        await self.contexts.learn(self._deployer.peek_all())

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
        return None if dep is None or dep.role is Role.DECIDER else self._entry(dep, self.canonical(name))

    def _downloaded(self, dep: Deployment) -> float | None:
        """How much of a hub model's files the store has fetched, while it fetches them."""
        if self._downloads is None or not dep.awaits_files:
            return None
        readiness = self._downloads.readiness_of(dep.model)
        return (readiness.fraction or 0.0) if readiness.downloading else None

    def _entry(self, dep: Deployment, name: str) -> dict[str, Any]:
        """OpenAI's model object, its load state as llama.cpp's router tells it (modelstatus.py)
        and its context where known (``meta``, modelmeta.py), and what ``ollama ps`` or
        llama-swap's ``/running`` tell."""
        phase = self._controller.status(dep.id)["phase"] if dep.is_on_demand else None
        entry = {
            "id": name,
            "object": "model",
            "created": int(dep.created_at),
            "owned_by": "dgxmm",
            "status": llamacpp_status(dep.state, phase, self._downloaded(dep)),
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
        meta = self.contexts.meta(dep)
        if meta:
            entry["meta"] = meta
        return entry
