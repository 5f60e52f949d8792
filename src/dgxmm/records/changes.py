"""What the deployer tells its listeners, and what a stop's precheck sees.

The controller, the live status, the LiteLLM sync and the API's event stream all follow
deployments through these: every creation, state change, config change and removal, the release
of a failed engine's memory and a start's wait at the start-up gate, delivered synchronously and in order after the change is stored (see ``Deployer``). They live apart from the
deployer so that a listener depends on the contract, not on the deployer's code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dgxmm.records.deployment import Deployment, State

# "released": the engine of a failed deployment is gone, and the memory it held is free now.
# "gate": its start began or stopped waiting at the start-up gate for another engine to load.
# "progress": a planned deployment's preparation moved on (its ``state_reason``: a download's progress).
ChangeKind = Literal["created", "state", "config", "removed", "released", "gate", "progress"]
Precheck = Callable[[Deployment], bool]  # sees the current record; True lets the stop go ahead


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    deployment: Deployment  # the stored record (frozen), as it is after the change
    old_state: State | None = None
    old: Deployment | None = None  # for config changes: the record before


Listener = Callable[[Change], None]
