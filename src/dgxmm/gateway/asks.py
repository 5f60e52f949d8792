"""What a caller asks of its model beside what the engine answers: its idle timer (``keep_alive``,
``ttl``: keepalive.py) and its place in line (``priority``: reqpriority.py). Each is read from the
request before a slot is taken, and taken out of the body the engine gets where the engine would
not know it; the gateway keeps what was asked in the request's ``Exchange``."""

from __future__ import annotations

from dgxmm.front.body import Body, BodyBudget
from dgxmm.gateway import bodyparams, jsonbody, keepalive, reqpriority
from dgxmm.gateway.exchange import Exchange
from dgxmm.gateway.heads import PRIORITY, Heads
from dgxmm.gateway.jsonbody import Facts
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.routes import UNLOAD
from dgxmm.gateway.scans import Scans
from dgxmm.records.deployment import Deployment
from dgxmm.settings import OndemandSettings


class CallerAsks:
    def __init__(self, settings: OndemandSettings, scans: Scans, bodies: BodyBudget) -> None:
        self.settings = settings
        self._scans = scans
        self.bodies = bodies  # the gateway's: a body made shorter gives back what it held

    async def keep_alive(self, body: Body, facts: Facts | None, ex: Exchange) -> tuple[Body, Facts | None]:
        """A caller's ``keep_alive`` or ``ttl`` (``keepalive``): Ollama's, read with its body
        (``ex.keep_alive``), or a JSON body's top-level members, taken out here so that the
        engine never sees them. Refused for a key without the right; else held to the idle
        timeout's bounds, what was kept told in the answer's header. The body and its facts as
        they are after (None: read them again)."""
        if facts is None:
            facts = await self._scans.facts(body)
        if facts.keeps:
            stripped, ex.keep_alive = await self._scans.reading(body, lambda: keepalive.taken(body))
            self.bodies.resize(ex.held, len(stripped))
            body, facts, ex.held = stripped, None, len(stripped)
        asked = ex.keep_alive
        if asked is None:
            return body, facts
        caller = ex.caller
        if caller is not None and not caller.keep_alive:
            raise Refused(
                403,
                "keep_alive_not_allowed",
                f"the key {caller.name} may not set keep_alive or ttl (the model's idle timer)",
            )
        if ex.route != UNLOAD:  # (Ollama's keep_alive 0 with nothing to answer: a stop, not a timer)
            ex.keep_alive, note = keepalive.held(
                asked, self.settings.idle_timeout_min_s, self.settings.idle_timeout_max_s
            )
            ex.kept_note = note
        return body, facts

    async def priority(self, heads: Heads, dep: Deployment, endpoint: str, body: Body, ex: Exchange) -> Body | None:
        """The request's priority (reqpriority.py: its key's, or less if it asks for less) in
        ``ex.priority``, and the body its engine gets, or None when it is the same: the usual
        request (no header, no member, a key of priority 0) only looks. A body past
        ``jsonbody.FAST_BYTES`` is looked at in a worker thread (a search of 16 MiB took 9 ms)."""
        caller = ex.caller
        ex.priority = key = 0 if caller is None else caller.priority
        header = heads.get(PRIORITY)
        member = endpoint in bodyparams.ENDPOINTS and (len(body) > jsonbody.FAST_BYTES or reqpriority.MEMBER in body)
        if header is None and not key and not member:
            return None
        ex.priority, changed = await reqpriority.applied(self._scans, dep, endpoint, body, header, key)
        return changed
