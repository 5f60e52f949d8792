"""The on-demand gateway: ``{base}/ondemand/{id}/v1/...``, called by LiteLLM instead of the engine,
and the model router, ``/v1/...``, where the body's ``model`` picks the deployment (router.py).

Each request comes as a ``GatewayRequest`` (request.py: the shape the gateway reads and answers
through; ``asgirequest.AsgiRequest`` is the one such object, whatever server serves dgxmm),
with its ``Heads`` read once by whoever calls ``serve``: the peer guard (guard.py), or for the
console's playground the gateway's one entrance (entrance.py), through which every request
comes. The deployer and the controller it takes as what it calls of them (``DeploymentPeek``,
``Slots``). Every byte is under control: checks run in the spec's order (path, key configured,
rate limit, key, body, deployment), traffic takes a slot from the controller (at once when the
model is ready and its turn free; else it waits, slotwait.py, while the controller may start the
model, make room or queue it), and the engine's answer streams back chunk by chunk. A client
that hangs up cancels what its request waits on (the request's ``hangup``).

The path of a ready deployment is the hot path (docs/performance.md): nothing per request that
can be computed once, no task of its own, the deployment record read without a copy.
"""

from __future__ import annotations

import asyncio
import time

from dgxmm.records.deployment import Deployment, Role, State
from dgxmm.front.body import Body, BodyBudget, BodyTimeout, ClientGone, OverBudget, return_freed_bodies
from dgxmm.gateway import bodyparams, health, jsonbody, modelname, props, quota
from dgxmm.gateway.asks import CallerAsks
from dgxmm.gateway.jsonbody import Facts
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.forward import Forwarder
from dgxmm.gateway.heads import Heads
from dgxmm.gateway.callerkeys import CallerKeys
from dgxmm.gateway.keyrecord import KEY_FILE, CallerKey
from dgxmm.gateway.inflight import OpenRequest
from dgxmm.gateway.keycheck import check_key, still_valid
from dgxmm.gateway.keys import KeyFile
from dgxmm.gateway.paths import InvalidPath, segments
from dgxmm.gateway.ratelimit import FailureLimiter
from dgxmm.gateway.request import GatewayRequest
from dgxmm.gateway.router import Router
from dgxmm.gateway.loading import load_or_unload
from dgxmm.gateway.routes import OWN, TRANSLATED_ONLY, Memo, Route, by_id, by_model
from dgxmm.gateway.refusal import ended, refuse
from dgxmm.gateway.slotwait import wait_for_slot
from dgxmm.gateway.progress import Looks, Told
from dgxmm.gateway.responses import send_json
from dgxmm.gateway.scans import Scans
from dgxmm.settings import OndemandSettings
from dgxmm.gateway.exchange import Exchange, Finish, HEALTH_CHECK, model_given, request_id_of, unrecorded
from dgxmm.gateway.collaborators import Audit, DeploymentPeek, Slots, TrafficObserver, WaitStatus
from dgxmm.gateway.usageonly import UsageOnly

NOTICE_STREAMS = frozenset({"chat/completions", "completions"})
NOTICE_BODIES = frozenset({"chat/completions", "completions", "responses"})
HEALTH_ANSWERED = frozenset({"chat/completions", "completions", "embeddings", "responses", "messages"})
NOT_READY_RETRY_S = 10  # an always-on engine that is not ready: starting, or about to be started again
HELD_BODIES = 4  # bodies of the largest size (max_body_bytes) the gateway holds at once, in all
MAX_NAME_SHOWN = 200  # characters of an unknown model's name an error repeats


class Gateway:
    def __init__(
        self,
        settings: OndemandSettings,
        prefix: str,
        deployer: DeploymentPeek,
        controller: Slots,
        keys: KeyFile,
        forwarder: Forwarder,
        observer: TrafficObserver | None = None,
        *,
        waits: WaitStatus,
        finish: Finish = unrecorded,
        body_timeout_s: float | None = None,
        router: Router | None = None,
        callers: CallerKeys | None = None,
        audit: Audit | None = None,
    ) -> None:
        self.settings = settings
        self._audit = audit  # a caller's load and unload (``loading``)
        self.router = router
        self._observer = observer
        self._looks = Looks(waits, deployer)  # what a wait's progress lines say (progress.py)
        self._finish = finish
        self.prefix = prefix.rstrip("/")
        self._deployer = deployer
        self._controller = controller
        self.keys = keys
        self.callers = callers if callers is not None else CallerKeys(keys)  # the key file's and the caller keys
        self._forwarder = forwarder
        self.limiter = FailureLimiter(settings.rate_limit_failures, settings.rate_limit_window_s)
        self._memo = Memo()  # the routes of paths seen with a valid key
        keys.on_rotate(lambda key: self.limiter.clear())
        self._body_timeout_s = body_timeout_s
        # The bodies held at once, in all: as many as HELD_BODIES of the largest size (docs/server.md).
        self.bodies = BodyBudget(HELD_BODIES * settings.max_body_bytes)
        return_freed_bodies()  # a body gone gives its memory back (front.body)
        self._scans = Scans()
        self._asks = CallerAsks(settings, self._scans, self.bodies)  # keep_alive, priority

    async def serve(self, req: GatewayRequest, heads: Heads) -> None:
        """One request (the peer guard passed it and read its ``heads``): a hang-up cancels this
        task, wherever it waits."""
        if req.disconnected:
            return
        client = req.client
        ex = Exchange(time.monotonic(), request_id_of(heads.request_id()), client[0] if client else "")
        ex.api = req.dialect.name
        req.exchange = ex
        task = asyncio.current_task()
        assert task is not None  # a request runs in a task
        req.hangup = task.cancel
        admitted: CallerKey | None = None  # a caller key whose request in flight this is
        opened: OpenRequest | None = None  # and how a revocation or an administrator ends it
        reserved = quota.NONE  # what it holds of the key's tokens of the day
        try:
            route, dep, body, facts = await self._checks_then_body(req, heads, ex)
            if dep is None:
                await self._listing(req, route, heads, ex)
            else:
                if route.kind == "traffic":  # a caller's keep_alive, then the deployment's parameters (bodyparams)
                    body, facts = await self._asks.keep_alive(body, facts, ex)
                    changed = await bodyparams.applied(self._scans, dep, route.endpoint, body)
                    if changed is not None:
                        self.bodies.resize(ex.held, len(changed))
                        body, facts, ex.held = changed, None, len(changed)  # (its facts read again)
                caller = ex.caller
                if caller is not KEY_FILE and caller is not None and route.kind == "traffic":
                    names = dep.names if ex.model is None else (ex.model,)  # what let it in
                    caller = ex.caller = still_valid(self.callers, caller, names)
                    body, reserved = await self._admit(caller, body, route.endpoint, ex)  # before a slot is taken
                    admitted = caller
                    opened = self.callers.open.enter(caller, names, task.cancel)
                if route.kind == "traffic":
                    changed = await self._asks.priority(heads, dep, route.endpoint, body, ex)
                    if changed is not None:
                        self.bodies.resize(ex.held, len(changed))
                        body, facts, ex.held = changed, None, len(changed)
                await self._dispatch(req, route, dep, body, facts, heads, ex)
        except Refused as exc:
            await refuse(req, ex, exc)
        except ClientGone:
            return
        except asyncio.CancelledError:
            if req.disconnected:
                return
            if opened is None or opened.reason is None:
                raise
            task.uncancel()
            await ended(req, ex, opened.reason)
        finally:
            req.hangup = None
            self.bodies.give(ex.held)
            if admitted is not None:
                self.callers.release(admitted, reserved.tokens)
                if opened is not None:
                    self.callers.open.leave(admitted, opened)
            if ex.caller is not None:
                usage = ex.usage
                tokens = (usage.prompt_tokens or 0, usage.completion_tokens or 0) if usage else (0, 0)
                cost = tokens if reserved is quota.NONE else quota.charged(ex, reserved)  # a quota's: charged
                self.callers.done(ex.caller, *cost, ex.failed)
                if ex.observed and self._observer is not None and ex.deployment_id is not None:
                    self._observer.answered(ex.deployment_id, *tokens, ex.failed)
            self._finish(req.method, req.path, ex)

    async def _checks_then_body(
        self, req: GatewayRequest, heads: Heads, ex: Exchange
    ) -> tuple[Route, Deployment | None, Body, Facts | None]:
        """Checks 2 to 7 of the spec, in order (the peer guard ran before routing), but for the
        rate limit, which applies to a wrong or missing key only (``keycheck``); a failed one
        raises ``Refused``. Returns the route, its deployment (None for the router's own
        answers: the list and a model's entry), the body, and the body as JSON when the router
        read it already (else None)."""
        router = self.router if self.router is not None and self.router.claims(req.path) else None
        known = self._memo.get(req.method, req.raw_path, router is not None)
        if known is None:
            try:
                parts = tuple(segments(req.raw_path, self.prefix if router is None else router.prefix))
            except InvalidPath as exc:
                raise Refused(400, "invalid_path", str(exc)) from None
        else:
            parts = known[0]
        if heads.repeated is not None:
            raise Refused(400, "invalid_header", f"the {heads.repeated.decode()} header appears more than once")
        if self.keys.current() is None:
            raise Refused(503, "ondemand_not_configured", "the on-demand gateway has no key configured")
        caller = ex.caller = check_key(self.callers, self.limiter, heads, ex.peer, req.dialect.keyless)
        ex.keyed = True
        if known is None:
            route = (by_id if router is None else by_model)(req.method, parts)
            self._memo.keep(req.method, req.raw_path, router is not None, parts, route)
        else:
            route = known[1]
        if route is None or (route.endpoint in TRANSLATED_ONLY and not req.dialect.translates):
            raise Refused(404, "not_found", "Not Found")
        ex.route = route.endpoint if route.kind == "traffic" else route.kind
        body = await self._read_body(req, heads, ex)
        caller = ex.caller = self.callers.current(caller)  # (changed while its body came: as it is now)
        if body is None:
            raise Refused(413, "request_too_large", f"the body exceeds {self.settings.max_body_bytes} bytes")
        if req.dialect.translates and route.kind == "traffic" and ex.route != route.endpoint:
            route = Route("traffic", ex.route, "")  # the endpoint its translated body chose
        facts: Facts | None = None
        if router is None:
            dep = self._deployer.peek(route.target)
            if dep is None:
                raise Refused(404, "not_found", f"no deployment {route.target}")
            if not caller.allows_any(dep.names):
                raise Refused(404, "model_not_found", f"the key {caller.name} may not use {dep.name}")
        elif route.kind != "traffic":
            return route, None, body, facts  # the list, or a model's entry: answered from here
        else:
            facts = await self._scans.facts(body)
            where = await self._scans.name(body, facts, heads.get(b"content-type"))
            dep, body = self._by_model(router, body, facts, where, ex, caller)
        ex.deployment_id, ex.served_name = dep.id, dep.served_name
        if dep.role is Role.DECIDER:
            raise Refused(503, "not_on_demand", f"{dep.name} is the decision model")
        return route, dep, body, facts

    def _by_model(
        self, router: Router, body: Body, facts: Facts, where: modelname.Named, ex: Exchange, caller: CallerKey
    ) -> tuple[Deployment, Body]:
        """The deployment the body names (``where``), and the body as its engine gets it (its
        served name in place of an alias, the budget of held bodies told of the new length: the
        old body is let go as this returns)."""
        ex.model = model_given(where.name)
        name = router.canonical(where.name)  # ``:latest`` implied
        dep = router.find(name)
        # The decision model is not the router's to name, a model outside the key's not the caller's.
        if dep is None or dep.role is Role.DECIDER or not caller.allows(name):
            raise Refused(
                404,
                "model_not_found",
                f"the model {where.name[:MAX_NAME_SHOWN]!r} does not exist on "
                f"this host (GET {router.prefix}/models lists them)",
            )
        if where.name != dep.served_name:
            body = modelname.renamed(body, where, dep.served_name, facts)
            self.bodies.resize(ex.held, len(body))
            ex.held = len(body)
        return dep, body

    async def _listing(self, req: GatewayRequest, route: Route, heads: Heads, ex: Exchange) -> None:
        """The router's own answers: every model, one model's entry, or llama-server's
        ``/props`` (``props``); nothing starts."""
        assert self.router is not None
        caller = ex.caller
        assert caller is not None
        if route.kind == "props":
            await props.answer(self.router, self._forwarder, req, heads, ex)
            return
        await self.router.learn()  # (the entries' meta)
        if route.kind == "models":
            answer = self.router.models()
            if caller.models is not None:  # a key's own models only
                answer["data"] = [entry for entry in answer["data"] if caller.allows(entry["id"])]
        else:
            found = self.router.model(route.target)
            ex.model = model_given(route.target)
            if found is None or not caller.allows(found["id"]):
                raise Refused(404, "model_not_found", f"the model {route.target!r} does not exist on this host")
            answer = found
            ex.deployment_id, ex.served_name = found["dgxmm"]["deployment_id"], found["dgxmm"]["served_name"]
        ex.status = 200
        await send_json(req, 200, answer, [ex.header])

    async def _admit(
        self, caller: CallerKey, body: Body, endpoint: str, ex: Exchange
    ) -> tuple[Body, quota.Reservation]:
        """Take one of ``caller``'s requests in flight with what it reserves of the key's tokens
        of the day (or refuse it), and the body as the engine gets it: asking for the usage of a
        stream the client asked none of, whose chunk the client then does not get (``quota``)."""
        if caller.tokens_per_day is None:
            self.callers.admit(caller)
            return body, quota.NONE
        default = self.settings.quota_reservation_tokens
        asked = await self._scans.reading(body, lambda: quota.asked(body, endpoint, default))
        self.callers.admit(caller, asked.reservation.tokens)
        changed = quota.with_usage(body, endpoint, asked)
        if changed is not None:
            self.bodies.resize(ex.held, len(changed))
            ex.held, ex.unasked = len(changed), UsageOnly()
        return changed or body, asked.reservation

    async def _read_body(self, req: GatewayRequest, heads: Heads, ex: Exchange) -> Body | None:
        """The whole body, or None past the limit (never buffering more than the limit), within
        the body deadline and the budget of all bodies held at once (``front.body``)."""
        limit = self.settings.max_body_bytes
        length = heads.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return None
        try:
            body = await req.body(limit, timeout_s=self._body_timeout_s, budget=self.bodies)
        except BodyTimeout:
            raise Refused(
                408, "request_timeout", f"the body made no progress for {self._body_timeout_s:g} s", close=True
            ) from None
        except OverBudget:
            raise Refused(
                503,
                "server_busy",
                "the gateway holds as many request bodies as it may; try again",
                retry_after=1,
                close=True,
            ) from None
        if body is not None:
            ex.held = len(body)
        return body

    async def _dispatch(
        self,
        req: GatewayRequest,
        route: Route,
        dep: Deployment,
        body: Body,
        facts: Facts | None,
        heads: Heads,
        ex: Exchange,
    ) -> None:
        if route.kind == "models":
            ex.status = 200
            await send_json(
                req,
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": dep.served_name, "object": "model", "created": int(dep.created_at), "owned_by": "dgxmm"}
                    ],
                },
                [ex.header],
            )
            return
        if route.kind == "model":
            if dep.state is not State.READY:
                raise Refused(503, "ondemand_not_ready", f"{dep.name} is {dep.state}")
            await self._forwarder.forward(req, heads, dep, route.endpoint, body, ex)
            return
        if route.endpoint in OWN:
            await load_or_unload(self._controller, self._forwarder, req, route.endpoint, dep, ex, self._audit)
            return
        if heads.get(health.HEADER) == "1":
            ex.route = HEALTH_CHECK
            await self._health(req, route, dep, ex)
            return
        if facts is None:
            facts = await self._scans.facts(body)
        if self._observer is not None:
            self._observer.request(dep.id)
            ex.observed = True  # its end is told too (``answered``)
        if not dep.is_on_demand:
            if dep.state is not State.READY:
                if self._observer is not None:  # a counted request: its refusal counts too
                    self._observer.refused(dep.id, "not_on_demand")
                raise Refused(
                    503, "not_on_demand", f"{dep.name} is always on and {dep.state}", retry_after=NOT_READY_RETRY_S
                )
            if dep.max_concurrent is None:  # no slot (the spec): nothing to count or to limit
                await self._forwarder.forward(req, heads, dep, route.endpoint, body, ex, streaming=facts.stream)
                return
            # With a limit, a slot of the controller's: its turn, in arrival order (controller/turns.py).
        await self._traffic(req, heads, route, dep, body, facts, ex)

    async def _health(self, req: GatewayRequest, route: Route, dep: Deployment, ex: Exchange) -> None:
        shape = health.answer(route.endpoint, dep)
        if dep.state is State.FAILED:
            raise Refused(503, "ondemand_not_ready", f"{dep.name} failed")
        if shape is None:
            raise Refused(503, "ondemand_health_unsupported", f"no health answer for {route.endpoint}")
        ex.status = 200
        await send_json(req, 200, shape, [(b"x-dgxmm-ondemand-state", dep.state.value.encode()), ex.header])

    async def _traffic(
        self,
        req: GatewayRequest,
        heads: Heads,
        route: Route,
        dep: Deployment,
        body: Body,
        facts: Facts,
        ex: Exchange,
    ) -> None:
        streaming = facts.stream
        slot = self._controller.try_slot(dep.id)  # ready: no task, no waiting
        if slot is not None:
            if ex.keep_alive is not None:
                self._controller.keep_alive(dep.id, ex.keep_alive)
            try:
                await self._forwarder.forward(req, heads, dep, route.endpoint, body, ex, streaming=streaming)
            finally:
                slot.release()
            return
        told = self._told(req, route, dep, streaming, ex)
        structured = jsonbody.structured(body, facts)
        notice_stream = told is None and streaming and route.endpoint in NOTICE_STREAMS and not structured
        notice_body = not streaming and route.endpoint in NOTICE_BODIES and not structured
        queued = asyncio.Event()
        waited = await wait_for_slot(
            self._controller,
            self._forwarder,
            self._observer,
            req,
            route.endpoint,
            dep,
            queued,
            notice_stream,
            notice_body,
            ex,
            told,
        )
        if waited is None:
            return
        slot, started = waited
        if ex.keep_alive is not None:
            self._controller.keep_alive(dep.id, ex.keep_alive)
        ex.cold = slot.cold  # waited for a start, not only for its turn under max_concurrent
        ex.slot_at = time.monotonic()
        dep = self._deployer.peek(dep.id) or dep  # its address may be new after a start
        try:
            await self._forwarder.forward(
                req,
                heads,
                dep,
                route.endpoint,
                body,
                ex,
                sse_started=started,
                prepend_notice=notice_body and queued.is_set(),
                streaming=streaming,
            )
        finally:
            slot.release()

    def _told(self, req: GatewayRequest, route: Route, dep: Deployment, streaming: bool, ex: Exchange) -> Told | None:
        """How a waiting request is told of its wait as reasoning (progress.py), when its caller
        asked for that (its key's ``progress``, the key file's ``[ondemand] progress``) and it is
        a streamed OpenAI chat (a translated dialect's stream is not the engine's SSE)."""
        caller = ex.caller
        asked = self.settings.progress if caller is KEY_FILE or caller is None else caller.progress
        if asked != "reasoning" or not streaming or route.endpoint != "chat/completions" or req.dialect.translates:
            return None
        looks = self._looks
        return Told(ex.model or dep.served_name, lambda: looks.look(dep))
