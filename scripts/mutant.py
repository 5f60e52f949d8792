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
ONCHANGE = "src/dgxmm/controller/onchange.py"
DECIDE = "src/dgxmm/controller/decide.py"
OOMRETRY = "src/dgxmm/controller/oomretry.py"
PRELOADS = "src/dgxmm/controller/preloads.py"
TURNS = "src/dgxmm/controller/turns.py"
PRIORITY = "src/dgxmm/controller/priority.py"
QUEUE = "src/dgxmm/controller/queue.py"
REQPRIORITY = "src/dgxmm/gateway/reqpriority.py"
PLACEMENT = "src/dgxmm/deploy/placement.py"
DEPLOYER = "src/dgxmm/deploy/deployer.py"
LEDGER = "src/dgxmm/deploy/ledger.py"
UPSTREAM = "src/dgxmm/engineclient/pool.py"
LIVENESS = "src/dgxmm/deploy/liveness.py"
ENDING = "src/dgxmm/deploy/ending.py"
FORWARD = "src/dgxmm/gateway/forward.py"
ENGINECONN = "src/dgxmm/engineclient/connection.py"
STORE = "src/dgxmm/store/db.py"
GATEWAY = "src/dgxmm/gateway/gateway.py"
KEYCHECK = "src/dgxmm/gateway/keycheck.py"
ACCESS = "src/dgxmm/telemetry/access.py"
GUARD = "src/dgxmm/gateway/guard.py"
KEYS = "src/dgxmm/gateway/keys.py"
CALLERKEYS = "src/dgxmm/gateway/callerkeys.py"
KEYRECORD = "src/dgxmm/gateway/keyrecord.py"
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
    "        self._ledger.{mark}"
)
DEPLOYER_STARTS_STARTING = (
    DEPLOYER,
    _RESTART_CHECK.format(states="(State.STOPPED, State.FAILED)", mark="mark_starting(deployment_id, placed)"),
    _RESTART_CHECK.format(
        states="(State.STOPPED, State.FAILED, State.STARTING)",
        mark='_move(deployment_id, State.STARTING, "starting", check=False, placed=placed)',
    ),
)
