"""The deliberate bugs of ``make mutants`` in the gateway: keys, peers, rate limits, forwarding,
the engine client and the live status (scripts/mutants.py runs them)."""

from __future__ import annotations

from mutant import (
    ACCESS,
    CALLERKEYS,
    ENGINECONN,
    FORWARD,
    GATEWAY,
    GUARD,
    HONEST,
    KEYCHECK,
    KEYRECORD,
    KEYS,
    LIVE,
    Mutant,
    RATELIMIT,
    REQPRIORITY,
    UPSTREAM,
)

MUTANTS = [
    Mutant(
        "priority_above_the_key",
        "a request that asks for more priority than its key's gets it",
        (
            (
                REQPRIORITY,
                "    return key_priority if request is None else min(request, key_priority)",
                "    return key_priority if request is None else request",
            ),
        ),
    ),
    Mutant(
        "vllm_priority_not_negated",
        "vLLM gets dgxmm's priority as it is (vLLM handles a lower number earlier: the order turned over)",
        ((REQPRIORITY, "bodyparams.encoded(-priority)", "bodyparams.encoded(priority)"),),
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
        "keyless_counts",
        "a request without credentials counts as a failed key check (locks out the right key)",
        (
            (
                KEYCHECK,
                '        raise Refused(401, "invalid_api_key", "the on-demand key is missing',
                '        limiter.failed(peer)\n        raise Refused(401, "invalid_api_key", "the on-demand key is missing',
            ),
        ),
    ),
    Mutant(
        "lockout_refuses_valid_keys",
        "a peer locked out for wrong keys is refused the right key too (issue 34)",
        (
            (
                KEYCHECK,
                "    if isinstance(verdict, CallerKey):\n        return verdict\n",
                "    if isinstance(verdict, CallerKey) and not limiter.exhausted(peer):\n        return verdict\n",
            ),
        ),
    ),
    Mutant(
        "key_models_ignored",
        "a caller key's models are ignored: it may use every model (issue 37)",
        (
            (
                KEYRECORD,
                "        return self._pattern is None or self._pattern.match(name) is not None\n",
                "        return True\n",
            ),
        ),
    ),
    Mutant(
        "reservation_kept",
        "a caller key's request that ended keeps its reservation of the key's tokens of the day (issue 47)",
        (
            (
                CALLERKEYS,
                "        key.counters.in_flight -= 1\n        key.counters.reserved -= reserve\n",
                "        key.counters.in_flight -= 1\n",
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
                KEYCHECK,
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
]
