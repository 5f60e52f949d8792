"""The deliberate bugs of ``make mutants`` in the on-demand controller: its decisions, attempts,
state and placement (scripts/mutants.py runs them)."""

from __future__ import annotations

from mutant import (
    ATTEMPTS,
    CONTROLLER,
    DECIDE,
    PRELOADS,
    DECIDE_STARTS_STARTING,
    DEPLOYER_STARTS_STARTING,
    ONCHANGE,
    Mutant,
    PLACEMENT,
    PRIORITY,
    QUEUE,
    STATE,
    TURNS,
)

MUTANTS = [
    Mutant(
        "lost_wake_up",
        "a waiter clears its wake-up after reading the state (a lost wake-up)",
        (
            (
                CONTROLLER,
                "            waiter.woken.clear()\n            if waiter.error",
                "            if waiter.error",
            ),
            (
                CONTROLLER,
                "            await self.clock.wait(waiter.woken, self._wake_in(waiter, now))",
                "            waiter.woken.clear()\n            await self.clock.wait(waiter.woken, self._wake_in(waiter, now))",
            ),
        ),
    ),
    Mutant(
        "silent_listener",
        "a deployment change wakes nobody",
        (
            (
                ONCHANGE,
                "        state.wake(dep.id)  # its waiters decide again\n"
                "        if concerns_queue(change):\n"
                "            state.wake_queued()  # memory held, freed or taken: queued starts look again\n",
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
                ONCHANGE,
                "        state.wake(dep.id)  # its waiters decide again\n",
                "",
            ),
        ),
    ),
    Mutant(
        "broadcast_wakeups",
        "a deployment's change wakes every waiter (the old broadcast: each re-reads and decides again)",
        (
            (
                ONCHANGE,
                "        state.wake(dep.id)  # its waiters decide again\n",
                "        state.wake_all()\n",
            ),
        ),
    ),
    Mutant(
        "memory_change_unheard",
        "a change of another deployment (memory freed) wakes no queued waiter",
        (
            (
                ONCHANGE,
                "        if concerns_queue(change):\n"
                "            state.wake_queued()  # memory held, freed or taken: queued starts look again\n",
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
                "                self._state.reserve(deployment_id, {v: memory.get(v, 0.0) for v in victims})",
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
        "unshared_attempts",
        "every waiter runs its own start attempt",
        (
            (
                STATE,
                "        if task is None or task.done():\n            self._attempts[deployment_id]",
                "        if True:\n            self._attempts[deployment_id]",
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
        "drain_never_ends",
        "a drain whose head gave up keeps its models from serving",
        (
            (
                STATE,
                "        if track is not None and track.drained_for == head:\n",
                "        if False:\n",
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
                "        if track.drained_for is not None:\n            return False\n",
                "",
            ),
            (
                CONTROLLER,
                "        if track.drained_for is not None or self.state.shutting_down:\n            return\n",
                "        if self.state.shutting_down:\n            return\n",
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
                PRELOADS,
                "        if placed is not None:\n            start.append(dep.id)",
                "        if True:\n            start.append(dep.id)",
            ),
        ),
    ),
    Mutant(
        "planned_failure_not_a_start_failure",
        "a request waiting on a planned deployment whose fetch failed starts a fetch again, without start_failed or backoff",
        (
            (
                ONCHANGE,
                "        elif old in (State.STARTING, State.PLANNED) and dep.state is State.FAILED:",
                "        elif old is State.STARTING and dep.state is State.FAILED:",
            ),
        ),
    ),
    Mutant(
        "fetch_again_makes_room",
        "a request for a hub model whose fetch failed stops idle models before fetching it again",
        ((DECIDE, "    if action is Action.START and dep.awaits_files:\n", "    if False:\n"),),
    ),
    Mutant(
        "turn_limit_off_by_one",
        "max_concurrent lets one request more than the limit in flight",
        (
            (
                TURNS,
                "    return None if limit is None else max(0, limit - inflight)",
                "    return None if limit is None else max(0, limit + 1 - inflight)",
            ),
        ),
    ),
    Mutant(
        "release_not_handed_over",
        "a released slot is not handed to the longest waiter (it waits for its timer, or a newcomer takes it)",
        (
            (
                CONTROLLER,
                "            self._hand_out(deployment_id)  # to the longest waiter, before anyone else looks\n",
                "            pass\n",
            ),
        ),
    ),
    Mutant(
        "newcomer_barges",
        "a newcomer takes a free slot while others wait before it",
        (
            (
                TURNS,
                "    return waiting == 0 and (free is None or free > 0)",
                "    return free is None or free > 0",
            ),
        ),
    ),
    Mutant(
        "priority_ignored",
        "a released slot goes to the longest waiter whatever its priority",
        (
            (
                STATE,
                "        if len(self._priorities.get(deployment_id, ())) < 2:\n            return line\n",
                "        return line\n",
            ),
        ),
    ),
    Mutant(
        "no_aging",
        "a waiter's priority never rises with its wait (a low one starves under a steady high stream)",
        ((PRIORITY, "    if aging_s <= 0 or waited_s <= 0:\n", "    if True:\n"),),
    ),
    Mutant(
        "ties_last_come_first",
        "equal effective priorities served last come, first served",
        (
            (
                PRIORITY,
                "key=lambda i: -effective(waiters[i][0], now - waiters[i][1], aging_s))",
                "key=lambda i: (-effective(waiters[i][0], now - waiters[i][1], aging_s), -i))",
            ),
        ),
    ),
    Mutant(
        "head_overtaken_while_making_room",
        "a higher entry overtakes the head whose victims are stopping (their memory is its)",
        (
            (
                PRIORITY,
                "    return reserving[:1] + [i for i in order if i not in reserving[:1]]",
                "    return order",
            ),
        ),
    ),
    Mutant(
        "queue_head_by_arrival",
        "the memory queue starts models in order of joining whatever their waiters' priority",
        ((QUEUE, "        if len(entries) < 2:\n", "        if True:\n"),),
    ),
    Mutant(
        "handed_slot_leaked",
        "a slot handed to a waiter that hangs up before it runs again is never released",
        (
            (
                CONTROLLER,
                '            if outcome != "granted" and waiter.slot is not None:\n'
                "                waiter.slot.release()  # handed to it as it went: the next in line gets it\n",
                "",
            ),
        ),
    ),
    Mutant(
        "cancel_unheard",
        "a cancelled waiter is not woken: it answers only at its next timer",
        (
            (
                STATE,
                "        waiter.error = error\n"
                "        waiter.woken.set()  # (the cancelled waiter answers now, not at its next timer)\n",
                "        waiter.error = error\n",
            ),
        ),
    ),
    Mutant(
        "ttl_0_reaped",
        "a deployment with idle_timeout_s = 0 is reaped at once (0 read as a timeout, not as never)",
        (
            (
                DECIDE,
                "    if idle_for_s is None and wait_s == NEVER:  # never reaped; make-room's idle_for_s is 0\n"
                "        return False\n",
                "",
            ),
        ),
    ),
    Mutant(
        "sleep_under_a_stream",
        "a sleep does not wait for the requests in flight (vLLM's /sleep would abort them)",
        (
            (
                CONTROLLER,
                "        if track is not None and track.inflight:\n            self.state.drain(deployment_id, SLEEP_DRAIN)",
                "        if False:\n            self.state.drain(deployment_id, SLEEP_DRAIN)",
            ),
        ),
    ),
    Mutant(
        "sleep_drain_unheard",
        "the last release does not wake a sleep waiting for it: the sleep waits out its whole drain",
        (
            (
                CONTROLLER,
                "            self.state.wake(deployment_id)  # a sleep's drain waits for this last release\n",
                "            pass  # a sleep's drain waits for this last release\n",
            ),
        ),
    ),
]
