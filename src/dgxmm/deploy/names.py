"""The names callers give as ``model``: every deployment's served name and aliases, unique on a
host, and which deployment each one is.

The model router (gateway) finds a deployment by the ``model`` of each request, so the lookup is
a dict, kept beside the records by their one writer, the deployer: ``claim`` after every write,
``release`` at a removal, ``check`` before a write that would make a name ambiguous (the
deployer refuses it with 422 and nothing is written).

A database from before names were unique may hold two deployments with one served name; the one
loaded first (the oldest) keeps the name, the other is not found by it until the first gives it
up (``stray`` lists such names for the log).
"""

from __future__ import annotations

from collections.abc import Callable

from dgxmm.errors import InvalidInput
from dgxmm.records.deployment import Deployment


class Names:
    def __init__(self) -> None:
        self._owner: dict[str, str] = {}  # name -> the id of the deployment it finds
        self._held: dict[str, tuple[str, ...]] = {}  # deployment id -> the names it claims

    def find(self, name: str) -> str | None:
        """The id of the deployment called ``name``, if any."""
        return self._owner.get(name)

    def check(self, dep: Deployment, name_of: Callable[[str], str]) -> None:
        """Raise ``InvalidInput`` (422, naming the field and the other deployment) when a name
        of ``dep`` is already another deployment's."""
        for field, name in [("served_name", dep.served_name), *(("aliases", alias) for alias in dep.aliases)]:
            other = self._owner.get(name)
            if other is not None and other != dep.id:
                raise InvalidInput(
                    f"{field}: {name!r} is already a name of the deployment {name_of(other)} "
                    f"(id {other}); served names and aliases are unique on a host",
                    field=field,
                )

    def claim(self, dep: Deployment) -> list[str]:
        """``dep`` as written now: its names find it, the names it dropped are free. Returns the
        names another deployment holds already (only from a database with duplicates)."""
        names = dep.names
        if self._held.get(dep.id) == names:
            return []
        self._drop(dep.id, keep=set(names))
        self._held[dep.id] = names
        return [name for name in names if self._owner.setdefault(name, dep.id) != dep.id]

    def release(self, deployment_id: str) -> None:
        """The deployment is gone: its names are free (or pass to another that claims them)."""
        self._drop(deployment_id, keep=set())
        self._held.pop(deployment_id, None)

    def _drop(self, deployment_id: str, keep: set[str]) -> None:
        for name in self._held.get(deployment_id, ()):
            if name in keep or self._owner.get(name) != deployment_id:
                continue
            del self._owner[name]
            heir = next((other for other, held in self._held.items() if other != deployment_id and name in held), None)
            if heir is not None:
                self._owner[name] = heir
