"""Test engine: a small OpenAI-compatible HTTP server imitating vLLM's.

Run as its own process so dgxmm's deployer, gateway and metrics sampler are
tested against real sockets, real exits and real signals::

    python tests/engines/testengine.py --port P --served-name NAME [options]

Flags: ``--help`` (testengine_args.py).

Routes: GET /health, GET /metrics, GET /props (llama-server's), GET /v1/models[/{model}], POST
/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses; any
other /v1/... echoes {"echo": true, "method", "path", "query", "body_bytes",
"content_type"}. Traffic endpoints (every /v1 route but the model list) hold
a seat, wait while asleep, obey --status and answer 503 until healthy.

Control endpoints under /_test/ (never under /v1, so a gateway never forwards them):
testengine_controls.py; POST /_test/crash answers, then exits 3 at once.

SIGTERM / SIGINT: clean shutdown within a second, exit 0 (--ignore-sigterm:
SIGTERM does nothing, like an engine slow to stop; SIGKILL ends it).

Timestamped lines on stdout (Unix time, for bench/coldstart.py, which measures
dgxmm's part of a cold start against the engine's own): "able to answer at T"
once /health answers 200, "woke at T after D s" when /wake_up is done, and
"stop asked at T" / "stopped at T" around a SIGTERM shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TextIO

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
import testengine_shapes as shapes
from testengine_conn import Connections
from testengine_controls import add_controls
from testengine_media import add_media
from testengine_seats import Seats
from testengine_sleep import SleepState, add_sleep
from testengine_args import parse_args

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BodyHandler = Callable[[web.Request, dict[str, Any]], Awaitable[web.StreamResponse]]
UNRECORDED = ("/health", "/metrics", "/_test/")
# --oom-starts: PyTorch's line when the driver refuses an allocation (as vLLM's engine writes it).
OOM_LINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "23.56 GiB of which 21.75 MiB is free."
)


class Engine:
    """All mutable state of one engine process."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name: str = args.served_name
        self.created = int(time.time())
        self.config: dict[str, Any] = {
            "chunk_delay": args.chunk_delay,
            "status": args.status,
            "reply": args.reply,
            "max_num_seqs": args.max_num_seqs,
            "health_delay": 0.0,
            "busy_health_delay": args.busy_health_delay,
        }
        self.seats = Seats(args.max_num_seqs)
        self.healthy = False
        self.answered_healthy = asyncio.Event()  # a 200 to /health was sent (--crash-after counts from it)
        self.awake = asyncio.Event()
        self.awake.set()
        self.asleep_waiting = 0
        self.requests: list[dict[str, Any]] = []
        self.conns = Connections(args.close_after_stream, args.idle_close, args.max_requests_per_conn)
        self.counters = {"prompt": 0, "generation": 0, "success": 0}
        self.stopping: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def stop(self, code: int) -> None:
        """Ask main() to shut the server down and exit with `code`."""
        if not self.stopping.done():
            self.stopping.set_result(code)

    @contextlib.asynccontextmanager
    async def seat(self) -> AsyncIterator[None]:
        """Wait while asleep, then for a free seat; hold it for the block."""
        self.asleep_waiting += 1
        try:
            await self.awake.wait()
        finally:
            self.asleep_waiting -= 1
        await self.seats.acquire()
        try:
            yield
        finally:
            self.seats.release()


def say(*parts: object, file: TextIO | None = None, flush: bool = False) -> None:
    """``print`` as an engine in C writes its log: a write that fails (a full disk) is dropped,
    and the engine goes on serving."""
    try:
        print(*parts, file=file or sys.stdout, flush=flush)
    except OSError:
        pass


def crash(message: str, code: int) -> None:
    """Die like a crashed engine: no cleanup, sockets dropped by the kernel."""
    say(message, file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        sys.stdout.flush()
    os._exit(code)


def error(message: str, code: int) -> web.Response:
    return web.json_response(shapes.error_body(message, code), status=code)


def engine_of(request: web.Request) -> Engine:
    return request.app["engine"]


@web.middleware
async def log_and_record(request: web.Request, handler: Handler) -> web.StreamResponse:
    """One stdout line per request (log-tail tests); record what a gateway forwarded."""
    say(f"{request.method} {request.path}", flush=True)
    engine = engine_of(request)
    if not request.path.startswith(UNRECORDED):
        engine.requests.append(
            shapes.request_record(
                request.method, request.path, request.query_string, request.headers.items(), await request.read()
            )
        )
    with engine.conns.request(request):
        return await handler(request)


def traffic(parse_json: bool) -> Callable[[BodyHandler], Handler]:
    """Wrap a traffic endpoint: injected status, loading, JSON, sleep and seat."""

    def wrap(inner: BodyHandler) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            engine = engine_of(request)
            status = engine.config["status"]
            if status is not None:
                return error(f"simulated error status {status}", status)
            if not engine.healthy:
                return error("model is still loading", 503)
            body: dict[str, Any] = {}
            if parse_json:
                try:
                    body = json.loads(await request.read() or b"{}")
                except ValueError as exc:
                    return error(f"JSON decode error: {exc}", 400)
                if not isinstance(body, dict):
                    return error("request body must be a JSON object", 400)
            async with engine.seat():
                return await inner(request, body)

        return handler

    return wrap


async def send_events(request: web.Request, events: list[tuple[str | None, Any]]) -> web.StreamResponse:
    """Write SSE events one by one, sleeping chunk_delay between them.

    A client hang-up ends the handler (cancellation or a reset on write), which
    releases its seat: that is what makes `running` drop on hang-up. A sleep meanwhile aborts
    the stream, as vLLM's ``/sleep`` (its default mode, ``abort``) does: the connection closes
    with no further event and no ``[DONE]``.
    """
    engine = engine_of(request)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for i, (kind, data) in enumerate(events):
        if i and engine.config["chunk_delay"]:
            await asyncio.sleep(engine.config["chunk_delay"])
        if not engine.awake.is_set():
            say(f"testengine {engine.name} aborted a stream: put to sleep", flush=True)
            if request.transport is not None:
                request.transport.close()
            return resp
        payload = data if isinstance(data, str) else json.dumps(data)
        head = f"event: {kind}\n" if kind else ""
        try:
            await resp.write(f"{head}data: {payload}\n\n".encode())
        except ConnectionError:
            return resp
    await resp.write_eof()
    engine.conns.stream_ended(request)
    return resp


async def generate(engine: Engine, parts: list[str], prompt: int) -> None:
    """Pretend to generate a non-streaming answer; count tokens for /metrics."""
    if engine.config["chunk_delay"]:
        await asyncio.sleep(engine.config["chunk_delay"] * (len(parts) + 1))
    account(engine, parts, prompt)


def account(engine: Engine, parts: list[str], prompt: int) -> None:
    engine.counters["prompt"] += prompt
    engine.counters["generation"] += len(parts)
    engine.counters["success"] += 1


def text_endpoint(
    full: Callable[..., Any], chunks: Callable[..., Any], prompt_key: str, limit_keys: tuple[str, ...]
) -> Handler:
    """Chat and text completions differ only in shapes and field names."""

    async def handler(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        engine = engine_of(request)
        limit = next((body[k] for k in limit_keys if body.get(k) is not None), None)
        parts, finish = shapes.pieces(engine.config["reply"], limit)
        prompt = shapes.count_words(body.get(prompt_key, ""))
        if body.get("stream"):
            account(engine, parts, prompt)
            usage = shapes.include_usage(body)
            called = {"tool": body["tools"][0]} if engine.args.call_tools and body.get("tools") else {}
            events: list[tuple[str | None, Any]] = [
                (None, c) for c in chunks(engine.name, parts, finish, prompt, usage, **called)
            ]
            return await send_events(request, events + [(None, "[DONE]")])
        await generate(engine, parts, prompt)
        return web.json_response(full(engine.name, parts, finish, prompt))

    return traffic(parse_json=True)(handler)


chat_completions = text_endpoint(
    shapes.chat_completion, shapes.chat_chunks, "messages", ("max_completion_tokens", "max_tokens")
)
completions = text_endpoint(shapes.completion, shapes.completion_chunks, "prompt", ("max_tokens",))


@traffic(parse_json=True)
async def embeddings(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    engine = engine_of(request)
    if "input" not in body:
        return error("field 'input' is required", 400)
    inputs = shapes.embedding_inputs(body["input"])
    return web.json_response(shapes.embeddings(engine.name, inputs, body.get("encoding_format")))


@traffic(parse_json=True)
async def responses(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    engine = engine_of(request)
    parts, _ = shapes.pieces(engine.config["reply"], body.get("max_output_tokens"))
    prompt = shapes.count_words(body.get("input", "")) + shapes.count_words(body.get("instructions") or "")
    if body.get("stream"):
        account(engine, parts, prompt)
        return await send_events(request, list(shapes.response_events(engine.name, parts, prompt, body)))
    await generate(engine, parts, prompt)
    resp_id, item_id = shapes.new_id("resp_"), shapes.new_id("msg_")
    text = "".join(parts)
    return web.json_response(shapes.response_object(engine.name, resp_id, item_id, text, prompt, len(parts), body))


@traffic(parse_json=False)
async def echo(request: web.Request, _body: dict[str, Any]) -> web.StreamResponse:
    """Any other /v1 route: lets forwarding tests reach every vLLM path."""
    raw = await request.read()
    return web.json_response(
        shapes.echo(request.method, request.path, request.query_string, raw, request.headers.get("Content-Type"))
    )


async def health(request: web.Request) -> web.Response:
    engine = engine_of(request)
    delay = engine.config["health_delay"] or (engine.config["busy_health_delay"] if engine.seats.running else 0)
    if delay:
        await asyncio.sleep(delay)
    if not engine.healthy:
        return web.json_response({"status": "loading"}, status=503)
    resp = web.json_response({"status": "ok"})
    await resp.prepare(request)  # sent before --crash-after's clock starts
    await resp.write_eof()
    engine.answered_healthy.set()
    return resp


async def list_models(request: web.Request) -> web.Response:
    engine = engine_of(request)
    card = shapes.model_card(engine.name, engine.created, engine.args.max_model_len)
    return web.json_response({"object": "list", "data": [card]})


async def get_model(request: web.Request) -> web.Response:
    engine = engine_of(request)
    model = request.match_info["model"]
    if model != engine.name:
        return error(f"The model `{model}` does not exist.", 404)
    return web.json_response(shapes.model_card(engine.name, engine.created, engine.args.max_model_len))


async def metrics(request: web.Request) -> web.Response:
    engine = engine_of(request)
    waiting = engine.seats.waiting + engine.asleep_waiting
    text = shapes.metrics_text(engine.name, engine.seats.running, waiting, engine.counters, engine.args.metrics_names)
    return web.Response(body=text.encode(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def ctl_crash(request: web.Request) -> web.StreamResponse:
    """Answer first, so the caller sees 200, then die with code 3."""
    resp = web.json_response({"crashing": True})
    await resp.prepare(request)
    await resp.write_eof()
    asyncio.get_running_loop().call_soon(crash, "simulated crash (via /_test/crash)", 3)
    return resp


async def prepare_response(request: web.Request, response: web.StreamResponse) -> None:
    engine_of(request).conns.prepare(request, response)


def build_app(engine: Engine) -> web.Application:
    app = web.Application(middlewares=[log_and_record], client_max_size=1 << 30)
    app["engine"] = engine
    app.on_response_prepare.append(prepare_response)
    r = app.router
    r.add_get("/health", health)
    r.add_get("/metrics", metrics)
    r.add_get("/v1/models", list_models)
    r.add_get("/v1/models/{model:.+}", get_model)
    r.add_post("/v1/chat/completions", chat_completions)
    r.add_post("/v1/completions", completions)
    r.add_post("/v1/embeddings", embeddings)
    r.add_post("/v1/responses", responses)
    add_media(app)
    r.add_route("*", "/v1/{tail:.*}", echo)
    if engine.args.sleep_mode:
        add_sleep(app, SleepState(engine.awake, engine.args.wake_delay, say, engine.name))
    r.add_post("/_test/crash", ctl_crash)
    add_controls(r)
    return app


async def lifecycle(engine: Engine) -> None:
    """Start delay, then become healthy, fail or schedule a crash (after a client saw it healthy)."""
    args = engine.args
    await asyncio.sleep(args.start_delay)
    while args.start_gate is not None and not Path(args.start_gate).exists():
        await asyncio.sleep(0.02)
    if args.fail_start:
        say("simulated start failure: --fail-start was given", file=sys.stderr, flush=True)
        engine.stop(1)
        return
    if args.oom_starts is not None and (left := int(args.oom_starts.read_text() or 0)) > 0:
        args.oom_starts.write_text(str(left - 1))
        say(OOM_LINE, file=sys.stderr, flush=True)
        engine.stop(1)
        return
    if args.never_healthy:
        return
    engine.healthy = True
    say(f"testengine {engine.name} able to answer at {time.time():.6f}", flush=True)
    if args.crash_after is not None:
        await engine.answered_healthy.wait()
        await asyncio.sleep(args.crash_after)
        crash("simulated crash", 3)


async def serve(args: argparse.Namespace) -> int:
    engine = Engine(args)
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        say(f"testengine {engine.name} stop asked at {time.time():.6f}", flush=True)
        engine.stop(0)

    for sig in (signal.SIGTERM, signal.SIGINT):  # first, so an early SIGTERM is clean
        if sig is signal.SIGTERM and args.ignore_sigterm:
            loop.add_signal_handler(sig, lambda: None)
        else:
            loop.add_signal_handler(sig, on_signal)
    held = bytearray(args.hold_mib * 1024 * 1024)  # (zeros: untouched pages, not yet resident)
    held[::4096] = b"\1" * len(range(0, len(held), 4096))  # every page written, with no copy of it all
    if args.leave_child:  # a child in a session of its own, as a daemonizing server leaves one
        child = (
            ["sleep", "3600"]
            if not args.child_hold_mib
            else [
                sys.executable,
                "-c",
                (
                    f"import time; held = bytearray({args.child_hold_mib} << 20); held[::4096] = b'\\1' * (len(held) // 4096); "
                    "time.sleep(3600)"
                ),
            ]
        )
        subprocess.Popen(
            child,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    if args.listen_delay:
        stop = asyncio.ensure_future(engine.stopping)
        await asyncio.wait([stop], timeout=args.listen_delay)  # a SIGTERM while "loading" ends it
        if engine.stopping.done():
            return engine.stopping.result()
    # handler_cancellation: a client hang-up cancels its handler (and frees
    # its seat) at once, as vLLM aborts a request whose client went away.
    runner = web.AppRunner(build_app(engine), handler_cancellation=True, shutdown_timeout=0.3, access_log=None)
    await runner.setup()
    engine.conns.track(runner.server)
    site = web.TCPSite(runner, args.host, args.port)
    await site.start()
    port = runner.addresses[0][1]
    say(f"testengine {engine.name} listening on {args.host}:{port}", flush=True)
    tasks = [asyncio.create_task(lifecycle(engine)), asyncio.create_task(engine.conns.close_idle())]
    code = await engine.stopping
    for task in tasks:
        task.cancel()
    # Exiting anyway: a slow or failing cleanup must never hang SIGTERM.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(runner.cleanup(), timeout=0.7)
    say(f"testengine {engine.name} stopped at {time.time():.6f}", flush=True)
    del held
    return code


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
