"""The deliberate bugs of ``make mutants`` in the deployer, its starts and ends, the store and
the process runtime (scripts/mutants.py runs them)."""

from __future__ import annotations

from mutant import (
    DEPLOYER,
    DEPLOYER_STARTS_STARTING,
    ENDING,
    LEDGER,
    LIVENESS,
    Mutant,
    NAMES,
    PREPARATION,
    PROCESS,
    SOURCE,
    STARTS,
    STORE,
)

MUTANTS = [
    Mutant(
        "await_before_stopping",
        "an await between the approved precheck and marking stopping",
        (
            (
                DEPLOYER,
                "        stopping = self._begin_stop(deployment_id, precheck, reason)\n",
                (
                    "        if precheck is not None and not precheck(self.get(deployment_id)):\n"
                    "            return False\n"
                    "        await asyncio.sleep(0)\n"
                    "        stopping = self._begin_stop(deployment_id, None, reason)\n"
                ),
            ),
        ),
    ),
    Mutant(
        "start_waits_for_cache_count",
        "a start waits for the count of its model's cached pages before it launches the engine",
        (
            (
                STARTS,
                "        count = CacheCount(counted.local_model) if counted is not None else None\n",
                (
                    "        count = CacheCount(counted.local_model) if counted is not None else None\n"
                    "        if count is not None:\n"
                    "            await count._future\n"
                ),
            ),
        ),
    ),
    Mutant(
        "deployer_starts_starting",
        "the deployer alone lets a starting deployment start again",
        (DEPLOYER_STARTS_STARTING,),
    ),
    Mutant(
        "health_alone_decides",
        "the watchdog fails a busy engine whose health check is slow",
        (
            (
                LIVENESS,
                "        if healthy or alive:",
                "        if healthy:",
            ),
        ),
    ),
    Mutant(
        "failed_memory_freed_at_once",
        "a failed engine's memory is free while its engine is still being ended",
        (
            (
                ENDING,
                "        self.lingering.add(deployment_id)  # its memory is counted until its engine is gone",
                "        pass",
            ),
        ),
    ),
    Mutant(
        "no_release_notice",
        "nobody hears that a failed engine's memory came free",
        (
            (
                ENDING,
                "                self._records.released(deployment_id)",
                "                pass",
            ),
        ),
    ),
    Mutant(
        "record_before_engine",
        "a state change the disk refuses is refused (a stop fails, the engine keeps running)",
        (
            (
                LEDGER,
                "        keep: bool = True,\n        placed: list[int] | None = None,\n    ) -> Deployment:",
                "        keep: bool = False,\n        placed: list[int] | None = None,\n    ) -> Deployment:",
            ),
        ),
    ),
    Mutant(
        "start_on_unwritable_disk",
        "a start is accepted while the database cannot be written",
        (
            (
                DEPLOYER,
                "        self._require_writable()\n        if dep.from_hub and not self.preparing.for_start(",
                "        if dep.from_hub and not self.preparing.for_start(",
            ),
        ),
    ),
    Mutant(
        "empty_write_check",
        "an empty transaction is taken for proof that the disk has room again",
        (
            (
                STORE,
                "            elif self.problem is not None:\n                conn.execute(_PROBE, (str(time.time()),))\n",
                "",
            ),
        ),
    ),
    Mutant(
        "gate_unannounced",
        "a start that waits at the start-up gate is not announced",
        (
            (
                STARTS,
                "                self._gated.add(deployment_id)\n                self._records.gated(deployment_id)",
                "                self._gated.add(deployment_id)",
            ),
        ),
    ),
    Mutant(
        "names_not_unique",
        "a second deployment may take a served name or alias another has",
        (
            (
                NAMES,
                "            if other is not None and other != dep.id:\n",
                "            if False:\n",
            ),
        ),
    ),
    Mutant(
        "leftovers_unlocked",
        "the search for what a stopped engine left takes a retry's new engine for it",
        (
            (
                PROCESS,
                "        async with self._lock(deployment_id):\n            if deployment_id in self._children:",
                "        if True:\n            if deployment_id in self._children:",
            ),
        ),
    ),
    Mutant(
        "start_before_files",
        "a start of a hub model whose files are not here launches its engine (on the hf:// name)",
        (
            (
                DEPLOYER,
                (
                    "        if dep.from_hub and not self.preparing.for_start(dep, actor=actor, user=user):\n"
                    "            return  # its files are not here: planned, fetched first (no engine before they are verified)\n"
                ),
                "",
            ),
        ),
    ),
    Mutant(
        "progress_unfolded",
        "a planned deployment's reason is written at every progress tick of its download",
        ((PREPARATION, "                if loop.time() >= due:\n", "                if True:\n"),),
    ),
    Mutant(
        "stall_retried",
        "a transfer the hub stopped sending is tried again five times (six stall timeouts)",
        ((SOURCE, "[_StallGuard.on_request, hosts.on_request]", "[hosts.on_request]"),),
    ),
]
