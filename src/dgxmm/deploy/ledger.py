"""The deployer's records: the stored deployments, their names, and the one writer that changes them.

Every change to a deployment record goes through ``Ledger.write``: a new frozen record (the old
one with the changes, ``model_copy(update=...)``) is written to the store, then held in the old
one's place, and its names claimed. Readers are handed the held records themselves: a frozen
record cannot be changed, so none needs a copy. Listeners hear a change through ``notify``, after
it is stored. The deployer decides what changes and when (its check-and-write calls); this
module only keeps the records, so the writing rule is in one place.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from dgxmm.deploy.names import Names
from dgxmm.errors import NotFound, StoreUnavailable
from dgxmm.onethread import Owner
from dgxmm.records.changes import Change, Listener
from dgxmm.records.deployment import Deployment
from dgxmm.store.db import Store

log = logging.getLogger(__name__)


class Ledger:
    def __init__(self, store: Store) -> None:
        self._owner = Owner("deployer")
        self._store = store
        self.records: dict[str, Deployment] = {dep.id: dep for dep in store.load_deployments()}
        self.names = Names()  # served names and aliases: the model router's lookup
        for dep in self.records.values():  # oldest first: a name two of them hold stays the older one's
            for name in self.names.claim(dep):
                log.warning(
                    "the name %r of %s (id %s) is another deployment's too: the model router finds "
                    "the older one; give one of them another name",
                    name,
                    dep.name,
                    dep.id,
                )
        self.listeners: list[Listener] = []

    def name_of(self, deployment_id: str) -> str:
        dep = self.records.get(deployment_id)
        return dep.name if dep is not None else deployment_id

    def require(self, deployment_id: str) -> Deployment:
        dep = self.records.get(deployment_id)
        if dep is None:
            raise NotFound(f"no deployment {deployment_id}")
        return dep

    def notify(self, change: Change) -> None:
        self._owner.check()
        for listener in self.listeners:
            try:
                listener(change)
            except Exception:
                log.exception("deployment listener %r failed", listener)

    def write(self, dep: Deployment, *, keep: bool = True, **changes: Any) -> Deployment:
        """The one writer: store ``dep`` with ``changes`` as a new record, then hold it in the old
        one's place and return it. ``keep``: what happened to an engine is held whatever the disk
        does (the store writes it once it can); without, a database that cannot be written raises
        ``StoreUnavailable`` and nothing changes."""
        self._owner.check()
        dep = dep.model_copy(update={**changes, "updated_at": time.time()})
        self._store.put(dep, keep=keep)
        self.records[dep.id] = dep
        self.names.claim(dep)
        return dep

    def require_writable(self) -> None:
        """A change a caller asks for is refused while the database cannot be written."""
        if not self._store.flush():
            raise StoreUnavailable(self._store.problem or "the database cannot be written")

    def forget(self, deployment_id: str) -> Deployment:
        """Delete the record (``StoreUnavailable``: it is kept) and release its names."""
        self._store.delete(deployment_id)
        gone = self.records.pop(deployment_id)
        self.names.release(deployment_id)
        return gone
