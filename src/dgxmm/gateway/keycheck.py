"""Whose key a gateway request carries: the check of its credentials against the key file and
the caller keys, with the rate limit on failed checks, and the check again, once its body is in,
that the key was not revoked or narrowed meanwhile (frozen key records: ``callerkeys``)."""

from __future__ import annotations

import time

from dgxmm.gateway.callerkeys import CallerKeys
from dgxmm.gateway.heads import Heads
from dgxmm.gateway.keyrecord import CallerKey
from dgxmm.gateway.keys import Verdict
from dgxmm.gateway.ratelimit import FailureLimiter
from dgxmm.gateway.refused import Refused


def still_valid(callers: CallerKeys, caller: CallerKey, names: tuple[str, ...]) -> CallerKey:
    """The key's record as it is now, before its request is admitted: one revoked while its
    body came is 401; one changed meanwhile (a new record, callerkeys.py) must still allow
    the model its request named, as the live record did before the records were frozen."""
    current = callers.get(caller.id)
    if current is None:
        raise Refused(401, "invalid_api_key", "invalid on-demand key")
    if current is not caller and not current.allows_any(names):
        raise Refused(404, "model_not_found", f"the key {current.name} may not use {names[0]}")  # (as at the check)
    return current


def check_key(
    callers: CallerKeys, limiter: FailureLimiter, heads: Heads, peer: str, keyless: str | None = None
) -> CallerKey:
    """The key (``Authorization: Bearer`` or ``x-api-key``: the key file's or a caller
    key, ``callerkeys``), then the rate limit: a valid key is served even while its peer is
    locked out for other callers' failures (several local users share 127.0.0.1); a wrong or
    missing one from a locked-out peer is 429, else 401. No credentials at all, where the
    request's API names a ``keyless`` caller key, act as that key (a key that is sent is
    checked, never downgraded to it). Returns whose key it is."""
    authorization = heads.get(b"authorization")
    verdict: CallerKey | Verdict | None  # None: no credentials at all
    if authorization is not None:
        scheme, _, token = authorization.partition(" ")
        verdict = callers.check(token.strip()) if scheme.lower() == "bearer" else Verdict.BAD
    else:
        api_key = heads.get(b"x-api-key")  # where Anthropic's clients send it
        verdict = None if api_key is None else callers.check(api_key.strip())
    if isinstance(verdict, CallerKey):
        return verdict
    if verdict is Verdict.EXPIRED:  # a real key, no guess: not counted
        raise Refused(401, "key_expired", "the key has expired")
    if limiter.exhausted(peer):
        raise Refused(429, "rate_limited", "too many failed key checks", retry_after=60)
    if verdict is None and keyless is not None:
        stand_in = callers.by_name(keyless)
        if stand_in is not None and (stand_in.expires_at is None or time.time() < stand_in.expires_at):
            return stand_in
        raise Refused(401, "invalid_api_key", f"the keyless caller key {keyless!r} does not exist or has expired")
    if verdict is None:
        # No credentials at all: not a failed key check. A web page the operator opens can
        # send these without any script (a no-cors POST), and must not lock out the peer.
        raise Refused(401, "invalid_api_key", "the on-demand key is missing (Authorization: Bearer, or x-api-key)")
    if verdict is Verdict.BAD:
        limiter.failed(peer)
    raise Refused(401, "invalid_api_key", "invalid on-demand key")
