#!/usr/bin/env python3
"""Deliberate bugs in the on-demand controller and the engine pool, each applied to a copy of the tree: the fast
deterministic tests must fail for every one of them (the mutant is "killed").

    python scripts/mutants.py [--only NAME ...] [--random]

Each mutant is a list of exact text replacements; a replacement whose text is not found exactly
once is an error (the mutant no longer matches the code and must be updated with it). The copy
is run first without any mutant (it must pass), then once per mutant. The table names the tests
that failed; every one of them is deterministic (gated or table-driven, no random seeds). With
``--random`` the seeded random race test and the soak run too, for information.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DETERMINISTIC = [
    "tests/unit/test_decide.py",
    "tests/unit/test_placement.py",
    "tests/unit/test_decide_attempt.py",
    "tests/unit/test_upstream_reuse.py",
    "tests/unit/test_engine_answer_ends.py",
    "tests/unit/test_liveness.py",
    "tests/unit/test_forward_errors.py",
    "tests/unit/test_deployer.py",
    "tests/unit/test_controller.py",
    "tests/unit/test_controller_mode.py",
    "tests/unit/test_controller_races.py",
    "tests/unit/test_controller_steps.py",
    "tests/unit/test_controller_wakeups.py",
    "tests/unit/test_controller_prefetch.py",
    "tests/unit/test_store_unwritable.py",
    # (a tmpfs, as root; the one test that needs no engine: the others take longer than a mutant's 5 s)
    "tests/integration/test_full_disk.py::test_a_refused_change_leaves_the_store_unwritable_until_there_is_room",
    "tests/unit/test_keys.py",
    "tests/unit/test_callerkeys.py",
    "tests/unit/test_ratelimit.py",
    "tests/unit/test_refusals.py",
    "tests/unit/test_guard.py",
    "tests/integration/test_gateway_checks.py",
    "tests/unit/test_live_status.py",
    "tests/unit/test_status.py",
    "tests/unit/test_names.py",
    "tests/unit/test_controller_swaps.py",
    "tests/integration/test_router.py",
    "tests/integration/test_measured_memory.py::test_a_start_during_the_search_for_leftovers_is_not_one",
]
RANDOM = [
    "tests/unit/test_controller_races.py::test_random_interleavings_reach_both_precheck_outcomes",
    "tests/unit/test_controller_soak.py",
]
RANDOM_IDS = ("test_random_interleavings", "test_soak")


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    edits: tuple[tuple[str, str, str], ...]  # (file, old text, new text)


CONTROLLER = "src/dgxmm/controller/controller.py"
ATTEMPTS = "src/dgxmm/controller/attempts.py"
STATE = "src/dgxmm/controller/state.py"
DECIDE = "src/dgxmm/controller/decide.py"
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

DECIDE_STARTS_STARTING = (
    DECIDE,
    "    if dep.state in (State.STOPPED, State.FAILED):\n        return Action.REFUSE",
    "    if dep.state in (State.STOPPED, State.FAILED, State.STARTING):\n        return Action.REFUSE",
)
_RESTART_CHECK = (
    "        if dep.state not in {states}:\n"
    '            raise Conflict(f"deployment {{dep.name}} is {{dep.state}}, not stopped or failed")\n'
    "        self._require_writable()\n"
    "        placed = self._fit(dep, devices)\n"
    '        self.set_state(deployment_id, State.STARTING, "starting", placed=placed{force})'
)
DEPLOYER_STARTS_STARTING = (
    DEPLOYER,
    _RESTART_CHECK.format(states="(State.STOPPED, State.FAILED)", force=""),
    _RESTART_CHECK.format(states="(State.STOPPED, State.FAILED, State.STARTING)", force=", force=True"),
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
        "lost_wake_up",
        "a waiter takes the change event after reading the state (a lost wake-up)",
        (
            (
                CONTROLLER,
                "            changed = state.wakeup(dep_id)\n            if waiter.error",
                "            if waiter.error",
            ),
            (
                CONTROLLER,
                "            await self.clock.wait(changed, self._wake_in(waiter, now))",
                "            changed = state.wakeup(dep_id)\n            await self.clock.wait(changed, self._wake_in(waiter, now))",
            ),
        ),
    ),
    Mutant(
        "silent_listener",
        "a deployment change wakes nobody",
        (
            (
                CONTROLLER,
                "        self.state.wake(dep.id)  # its waiters decide again\n"
                "        self.state.wake_queued()  # (a release frees memory: queued starts look again)\n",
                "",
            ),
        ),
    ),
    Mutant(
        "idle_sample_unheard",
        "a victim's metrics turning idle does not wake the queued start (it waits for waiter_wake_s)",
        (
            (
                CONTROLLER,
                "        effects.add_idle_listener(self._on_idle_sample)\n",
                "",
            ),
        ),
    ),
    Mutant(
        "prefetch_outlives_wait",
        "a model's prefetch goes on after its wait ended (its start began, or the caller hung up)",
        (
            (
                STATE,
                "        self._queued(deployment_id, False)\n",
                "",
            ),
        ),
    ),
    Mutant(
        "own_change_unheard",
        "a deployment's change wakes the queue but not its own waiters (a ready model's requests sleep on)",
        (
            (
                CONTROLLER,
                "        self.state.wake(dep.id)  # its waiters decide again\n",
                "",
            ),
        ),
    ),
    Mutant(
        "broadcast_wakeups",
        "a deployment's change wakes every waiter (the old broadcast: each re-reads and decides again)",
        (
            (
                CONTROLLER,
                "        self.state.wake(dep.id)  # its waiters decide again\n",
                "        self.state.wake_all()\n",
            ),
        ),
    ),
    Mutant(
        "memory_change_unheard",
        "a change of another deployment (memory freed) wakes no queued waiter",
        (
            (
                CONTROLLER,
                "        self.state.wake_queued()  # (a release frees memory: queued starts look again)\n",
                "",
            ),
        ),
    ),
    Mutant(
        "new_head_unheard",
        "the head leaving the queue wakes nobody behind it (the next entry never makes room)",
        (
            (
                STATE,
                "        if was_head:  # a new head, and the reservation is gone: the queue looks again\n"
                "            self.wake_queued()\n",
                "",
            ),
        ),
    ),
    Mutant(
        "idle_ignores_inflight",
        "the idle rule ignores slots in flight",
        (
            (
                DECIDE,
                "    if track.inflight > 0 or track.waiting > 0:",
                "    if track.waiting > 0:",
            ),
        ),
    ),
    Mutant(
        "no_head_reservation",
        "make-room reserves nothing for the head",
        (
            (
                ATTEMPTS,
                "                queue.reserve(deployment_id, {v: memory.get(v, 0.0) for v in victims})",
                "                pass",
            ),
        ),
    ),
    Mutant(
        "second_start_per_burst",
        "a deployment already starting is started again (the decision and the deployer's check both let it)",
        (DECIDE_STARTS_STARTING, DEPLOYER_STARTS_STARTING),
    ),
    Mutant(
        "decide_starts_starting",
        "the decision alone treats a starting deployment as startable",
        (DECIDE_STARTS_STARTING,),
    ),
    Mutant(
        "deployer_starts_starting",
        "the deployer alone lets a starting deployment start again",
        (DEPLOYER_STARTS_STARTING,),
    ),
    Mutant(
        "unshared_attempts",
        "every waiter runs its own start attempt",
        (
            (
                ATTEMPTS,
                "        if task is None or task.done():\n            self._state.attempts[deployment_id]",
                "        if True:\n            self._state.attempts[deployment_id]",
            ),
        ),
    ),
    Mutant(
        "lock_across_make_room",
        "attempts hold one lock across the victims' stops (the old design)",
        (
            (
                ATTEMPTS,
                "        self._is_evictable = is_evictable\n",
                "        self._is_evictable = is_evictable\n        self._serial = asyncio.Lock()\n",
            ),
            (
                ATTEMPTS,
                "        progress = decide.Progress()\n        try:\n",
                "        progress = decide.Progress()\n        await self._serial.acquire()\n        try:\n",
            ),
            (
                ATTEMPTS,
                '            self._state.fail_waiters(deployment_id, StartFailed(f"start attempt failed: {exc}"))\n',
                (
                    '            self._state.fail_waiters(deployment_id, StartFailed(f"start attempt failed: {exc}"))\n'
                    "        finally:\n            self._serial.release()\n"
                ),
            ),
        ),
    ),
    Mutant(
        "no_settle",
        "after stopping victims the head does not wait for the freed memory",
        (
            (
                ATTEMPTS,
                "                    progress = decide.Progress(stopped_victim=True, settle_until=until)",
                "                    progress = decide.Progress(stopped_victim=True, settle_until=None)",
            ),
        ),
    ),
    Mutant(
        "no_grace",
        "does_not_fit ignores a recent stop and this attempt's victims",
        (
            (
                DECIDE,
                "    return never_fits and not snap.progress.stopped_victim and not recent",
                "    return never_fits",
            ),
        ),
    ),
    Mutant(
        "most_recently_used",
        "victims are picked most recently used first",
        (
            (
                PLACEMENT,
                "    ordered = sorted(holders, key=lambda h: (h.idle_since, h.id))",
                "    ordered = sorted(holders, key=lambda h: (-h.idle_since, h.id))",
            ),
        ),
    ),
    Mutant(
        "first_fit",
        "a start takes the first device set that holds it, not the best fit (a large model loses its room)",
        (
            (
                PLACEMENT,
                "        if best is None or rank < best:\n            best = rank\n",
                "        if best is None:\n            best = rank\n",
            ),
        ),
    ),
    Mutant(
        "victims_anywhere",
        "make-room stops models on devices the waiting model will not use",
        (
            (
                PLACEMENT,
                "            if not helps:\n                continue\n",
                "            if not helps:\n                pass\n",
            ),
        ),
    ),
    Mutant(
        "reserved_everywhere",
        "what was freed for the head is reserved on every device, not where it was freed",
        (
            (
                DECIDE,
                "        shares = placement.spread(gib, other.devices) if other is not None else dict.fromkeys(devices, gib)",
                "        shares = dict.fromkeys(devices, gib)",
            ),
        ),
    ),
    Mutant(
        "pins_ignored",
        "a pinned deployment is placed anywhere",
        (
            (
                PLACEMENT,
                "    if need.pins is not None:\n",
                "    if False:\n",
            ),
        ),
    ),
    Mutant(
        "no_stale_check",
        "a pooled engine connection is written to without polling it first",
        (
            (
                UPSTREAM,
                "            conn = idle.pop()\n            if not conn.closed and not peer_closed(conn):",
                "            conn = idle.pop()\n            if not conn.closed:",
            ),
        ),
    ),
    Mutant(
        "no_parking",
        "a streamed answer's connection is pooled at once while the engine is unknown",
        (
            (
                UPSTREAM,
                "        if conn.carried_stream and not self.keeps_after_streams:",
                "        if False:",
            ),
        ),
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
        "broken_stream_cut",
        "an event stream broken off between events is cut instead of ending with an error",
        (
            (
                FORWARD,
                "        if not req.response_started or sse_started or _between_events(resp):",
                "        if not req.response_started or sse_started:",
            ),
        ),
    ),
    Mutant(
        "eof_ends_any_answer",
        "an answer cut short by the engine's close is passed on as whole",
        (
            (
                ENGINECONN,
                "not resp.complete and _runs_to_close(resp.headers):",
                "not resp.complete:",
            ),
        ),
    ),
    Mutant(
        "record_before_engine",
        "a state change the disk refuses is refused (a stop fails, the engine keeps running)",
        (
            (
                DEPLOYER,
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
                "        self._require_writable()\n        placed = self._fit(dep, devices)\n",
                "        placed = self._fit(dep, devices)\n",
            ),
        ),
    ),
    Mutant(
        "keyless_counts",
        "a request without credentials counts as a failed key check (locks out the right key)",
        (
            (
                GATEWAY,
                '            raise Refused(401, "invalid_api_key", "the on-demand key is missing',
                '            self.limiter.failed(peer)\n            raise Refused(401, "invalid_api_key", "the on-demand key is missing',
            ),
        ),
    ),
    Mutant(
        "lockout_refuses_valid_keys",
        "a peer locked out for wrong keys is refused the right key too (issue 34)",
        (
            (
                GATEWAY,
                "        if isinstance(verdict, CallerKey):\n            return verdict\n",
                "        if isinstance(verdict, CallerKey) and not self.limiter.exhausted(peer):\n            return verdict\n",
            ),
        ),
    ),
    Mutant(
        "key_models_ignored",
        "a caller key's models are ignored: it may use every model (issue 37)",
        (
            (
                CALLERKEYS,
                "        return self._pattern is None or self._pattern.match(name) is not None\n",
                "        return True\n",
            ),
        ),
    ),
    Mutant(
        "keyless_recorded",
        "requests without a valid key are recorded one by one (a flood pushes served ones out)",
        (
            (
                ACCESS,
                "        if ex.keyed:\n",
                "        if True:\n",
            ),
        ),
    ),
    Mutant(
        "any_scheme",
        "a key sent with any scheme (not Bearer) is accepted",
        (
            (
                GATEWAY,
                'if scheme.lower() == "bearer" else Verdict.BAD',
                "",
            ),
        ),
    ),
    Mutant(
        "rate_limit_one_late",
        "a peer gets one failed key check more than the limit",
        (
            (
                RATELIMIT,
                "window.failures >= self.limit",
                "window.failures > self.limit",
            ),
        ),
    ),
    Mutant(
        "previous_key_forever",
        "a rotated-out key keeps working after its grace",
        (
            (
                KEYS,
                "previous is not None\n            and self._clock() < self._previous_until\n",
                "previous is not None\n",
            ),
        ),
    ),
    Mutant(
        "proxied_allowed",
        "a request that came through a proxy is let in",
        (
            (
                GUARD,
                "        if spelled is not None:\n",
                "        if False:\n",
            ),
        ),
    ),
    Mutant(
        "any_peer",
        "the peer policy is not asked",
        (
            (
                GUARD,
                "        if not self.policy.allows(client[0]):\n",
                "        if False:\n",
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
        "queue_join_unannounced",
        "a request joining the memory queue is not announced (the page shows Cold)",
        (
            (
                STATE,
                "            self.wake(deployment_id)  # its waiters see it queued and fire their notices\n"
                "            self.touched(deployment_id)",
                "            self.wake(deployment_id)  # its waiters see it queued and fire their notices",
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
        "alias_not_renamed",
        "a request by alias reaches the engine under the alias (vLLM answers 404)",
        (
            (
                GATEWAY,
                "        if where.name != dep.served_name:\n",
                "        if False:\n",
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
        "drain_never_ends",
        "a drain whose head gave up keeps its models from serving",
        (
            (
                ATTEMPTS,
                "                if track is not None and track.drained_for == deployment_id:\n",
                "                if False:\n",
            ),
        ),
    ),
    Mutant(
        "drained_still_gets_slots",
        "a drained model still hands out slots, so it is never free to stop",
        (
            (
                DECIDE,
                "        return Action.WAIT if track.drained_for is not None else Action.GRANT",
                "        return Action.GRANT",
            ),
            (
                CONTROLLER,
                "        if self._is_drained(deployment_id):\n            return None\n",
                "",
            ),
            (
                CONTROLLER,
                "        if dep.state is State.READY and not self._is_drained(deployment_id):",
                "        if dep.state is State.READY:",
            ),
        ),
    ),
    Mutant(
        "drain_unreserved",
        "what a drain frees is not reserved for its head (the drained model starts again first)",
        (
            (
                ATTEMPTS,
                "            case decide.MakeRoom(victims) | decide.Drain(victims):",
                "            case decide.MakeRoom(victims):",
            ),
        ),
    ),
    Mutant(
        "drain_untouched",
        "a model nobody used while the head waited is drained (the seed's idle rule broken)",
        (
            (
                DECIDE,
                "        and (o.track.inflight > 0 or o.track.idle_since > since)\n",
                "",
            ),
        ),
    ),
    Mutant(
        "drain_owed",
        "a model owed its turn is drained again (ping-pong)",
        (
            (
                DECIDE,
                "        if o.track is not None\n        and not o.track.owed\n",
                "        if o.track is not None\n",
            ),
        ),
    ),
    Mutant(
        "evict_rule_ignored",
        "make-room keeps the idle timeout whatever evict_idle_s says",
        (
            (
                DECIDE,
                "            idle_for_s=evict_after(o.dep, rules.idle_timeout_s, rules.evict_idle_s),",
                "            idle_for_s=None,",
            ),
        ),
    ),
    Mutant(
        "preload_makes_room",
        "a preload is tried whether or not it fits (and would need room)",
        (
            (
                DECIDE,
                "        if placed is not None:\n            start.append(dep.id)",
                "        if True:\n            start.append(dep.id)",
            ),
        ),
    ),
    Mutant(
        "backoff_never_due",
        "a backoff running out is never looked at again",
        (
            (
                LIVE,
                '            due = status["until"]',
                "            due = None",
            ),
        ),
    ),
    Mutant(
        "released_reads_nothing",
        "a model stopped for the head reads as nothing to wait for until its memory shows",
        (
            (
                HONEST,
                '    if released:\n        return _waits("release", released)\n',
                "",
            ),
        ),
    ),
    Mutant(
        "stop_hides_the_rest",
        "a stop that frees too little hides what the wait needs after it",
        (
            (
                HONEST,
                '        if rest > EPS:\n            wait["then"] = _beyond_stops(dep, others, rest, now)\n',
                "",
            ),
        ),
    ),
    Mutant(
        "later_wait_unscheduled",
        "the time of a wait after a stop is never looked at again",
        (
            (
                HONEST,
                '    return next((w["at"] for w in _chain(wait) if w.get("at") is not None), None)',
                '    return (wait or {}).get("at")',
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
]


def copy_tree(dest: Path) -> None:
    for part in ("src", "tests", "pyproject.toml"):
        source = ROOT / part
        if source.is_dir():
            shutil.copytree(source, dest / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, dest / part)


def apply(tree: Path, mutant: Mutant) -> None:
    for file, old, new in mutant.edits:
        path = tree / file
        text = path.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"mutant {mutant.name} does not apply to {file} ({text.count(old)} matches): update it")
        path.write_text(text.replace(old, new))


REPORTER = """import os

import pytest


def pytest_collection_modifyitems(items):
    # the same per-test limit for every test, over the modules' own (longer) timeout marks
    for item in items:
        item.add_marker(pytest.mark.timeout(float(os.environ["DGXMM_MUTANT_TIMEOUT"])), append=False)


def pytest_runtest_logreport(report):
    if report.failed:
        with open(os.environ["DGXMM_MUTANT_FAILURES"], "a") as out:
            out.write(report.nodeid + "\\n")
"""


def run_tests(tree: Path, tests: list[str], deselect: tuple[str, ...], timeout_s: int) -> tuple[int, list[str]]:
    """Run the tests in the copy; returns pytest's exit code and the failed test ids, recorded by
    a small plugin as each test ends (a mutant may crash pytest's own report at the end). A
    mutant that loses a wake-up makes tests hang: the per-test timeout ends them (the
    deterministic tests take well under a second each)."""
    (tree / "mutant_report.py").write_text(REPORTER)
    failures = tree / "failures.txt"
    failures.write_text("")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(tree / p) for p in ("src", "tests", "")),
        "PYTHONDONTWRITEBYTECODE": "1",
        "DGXMM_MUTANT_FAILURES": str(failures),
        "DGXMM_MUTANT_TIMEOUT": str(timeout_s),
    }
    args = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "mutant_report",
        "--rootdir",
        str(tree),
        *tests,
    ]
    if deselect:
        args += ["-k", " and ".join(f"not {name}" for name in deselect)]
    try:
        code = subprocess.run(args, cwd=tree, env=env, capture_output=True, check=False, timeout=900).returncode
    except subprocess.TimeoutExpired:
        code = -1
    return code, sorted(set(failures.read_text().split()))


def check_import(tree: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    out = subprocess.run(
        [sys.executable, "-c", "import dgxmm; print(dgxmm.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not out.startswith(str(tree)):
        raise SystemExit(f"the copy's dgxmm is not the one imported ({out})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", help="mutant names to run (default: all)")
    parser.add_argument("--random", action="store_true", help="also run the seeded random tests")
    opts = parser.parse_args()
    chosen = [m for m in MUTANTS if not opts.only or m.name in opts.only]
    tests = DETERMINISTIC + (RANDOM if opts.random else [])
    deselect = () if opts.random else RANDOM_IDS
    timeout_s = 120 if opts.random else 5
    rows = []
    with tempfile.TemporaryDirectory(prefix="dgxmm-mutants-") as tmp:
        control = Path(tmp) / "control"
        copy_tree(control)
        check_import(control)
        code, failed = run_tests(control, tests, deselect, timeout_s)
        if code != 0:
            print("the unmutated copy fails:", *failed, sep="\n  ")
            return 2
        for mutant in chosen:
            tree = Path(tmp) / mutant.name
            copy_tree(tree)
            apply(tree, mutant)
            started = time.monotonic()
            code, failed = run_tests(tree, tests, deselect, timeout_s)
            rows.append((mutant, code != 0, failed, time.monotonic() - started))
            print(f"{mutant.name}: {'killed' if code else 'SURVIVED'} ({len(failed)} failing)", file=sys.stderr)
            shutil.rmtree(tree)
    print_table(rows)
    return 0 if all(killed for _, killed, _, _ in rows) else 1


def print_table(rows: list[tuple[Mutant, bool, list[str], float]]) -> None:
    width = max(len(m.name) for m, *_ in rows)
    print(f"\n{'mutant':<{width}}  result    failing  time   bug / killed by")
    for mutant, killed, failed, seconds in rows:
        result = "killed" if killed else "SURVIVED"
        print(f"{mutant.name:<{width}}  {result:<8}  {len(failed):>7}  {seconds:4.0f}s  {mutant.bug}")
        for test in failed[:6]:
            print(f"{'':<{width}}  {'':<8}  {'':>7}  {'':>5}  - {test.split('/')[-1]}")
        if len(failed) > 6:
            print(f"{'':<{width}}  {'':<8}  {'':>7}  {'':>5}  ... and {len(failed) - 6} more")
    survived = [m.name for m, killed, *_ in rows if not killed]
    print(
        f"\n{len(rows) - len(survived)} of {len(rows)} mutants killed" + (f"; survived: {survived}" if survived else "")
    )


if __name__ == "__main__":
    sys.exit(main())
