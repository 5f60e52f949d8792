"""A deliberate bug of ``make mutants``, and the files and texts the bugs are written against."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    edits: tuple[tuple[str, str, str], ...]  # (file, old text, new text)


CONTROLLER = "src/dgxmm/controller/controller.py"
ATTEMPTS = "src/dgxmm/controller/attempts.py"
STATE = "src/dgxmm/controller/state.py"
DECIDE = "src/dgxmm/controller/decide.py"
TURNS = "src/dgxmm/controller/turns.py"
PLACEMENT = "src/dgxmm/deploy/placement.py"
DEPLOYER = "src/dgxmm/deploy/deployer.py"
UPSTREAM = "src/dgxmm/engineclient/pool.py"
LIVENESS = "src/dgxmm/deploy/liveness.py"
ENDING = "src/dgxmm/deploy/ending.py"
FORWARD = "src/dgxmm/gateway/forward.py"
ENGINECONN = "src/dgxmm/engineclient/connection.py"
STORE = "src/dgxmm/store/db.py"
GATEWAY = "src/dgxmm/gateway/gateway.py"
ACCESS = "src/dgxmm/telemetry/access.py"
GUARD = "src/dgxmm/gateway/guard.py"
KEYS = "src/dgxmm/gateway/keys.py"
CALLERKEYS = "src/dgxmm/gateway/callerkeys.py"
RATELIMIT = "src/dgxmm/gateway/ratelimit.py"
STARTS = "src/dgxmm/deploy/starts.py"
NAMES = "src/dgxmm/deploy/names.py"
LIVE = "src/dgxmm/status/live.py"
PROCESS = "src/dgxmm/deploy/runtimes/process.py"
HONEST = "src/dgxmm/status/honest.py"
PREPARATION = "src/dgxmm/deploy/preparation.py"
SOURCE = "src/dgxmm/modelstore/source.py"

DECIDE_STARTS_STARTING = (
    DECIDE,
    "    if dep.state in (State.STOPPED, State.FAILED):\n        return Action.REFUSE",
    "    if dep.state in (State.STOPPED, State.FAILED, State.STARTING):\n        return Action.REFUSE",
)
_RESTART_CHECK = (
    "        if dep.state not in {states}:\n"
    '            raise Conflict(f"deployment {{dep.name}} is {{dep.state}}, not stopped or failed")\n'
    "        self._require_writable()\n"
    "        if dep.from_hub and not self.preparing.for_start(dep, actor=actor, user=user):\n"
    "            return  # its files are not here: planned, fetched first (no engine before they are verified)\n"
    "        placed = self._fit(dep, devices)\n"
    '        self.set_state(deployment_id, State.STARTING, "starting", placed=placed{force})'
)
DEPLOYER_STARTS_STARTING = (
    DEPLOYER,
    _RESTART_CHECK.format(states="(State.STOPPED, State.FAILED)", force=""),
    _RESTART_CHECK.format(states="(State.STOPPED, State.FAILED, State.STARTING)", force=", force=True"),
)
