"""Tests of the test engine itself, run as a real process over real sockets.

dgxmm's integration tests trust this engine to behave like vLLM; these tests
pin down each behaviour they rely on, so a broken engine fails here first.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

ENGINE = Path(__file__).with_name("testengine.py")
REPLY = "Hello from the test engine"


@dataclass
class Engine:
    """A running engine process and where its output goes."""

    proc: subprocess.Popen[bytes]
    base: str
    out: Path
    err: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def stdout(self) -> str:
        return self.out.read_text()

    def stderr(self) -> str:
        return self.err.read_text()

    def url(self, path: str) -> str:
        return self.base + path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(workdir: Path, *args: str, name: str = "test-model") -> Engine:
    """Start the engine and wait until its port accepts connections."""
    port = free_port()
    out, err = workdir / f"engine-{port}.out", workdir / f"engine-{port}.err"
    cmd = [sys.executable, str(ENGINE), "--port", str(port), "--served-name", name, *args]
    with out.open("wb") as fout, err.open("wb") as ferr:
        proc = subprocess.Popen(cmd, stdout=fout, stderr=ferr)
    deadline = time.monotonic() + 60  # bounds a hang only: a busy machine stretches the start tenfold
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return Engine(proc, f"http://127.0.0.1:{port}", out, err)
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"engine did not listen: {err.read_text()}")


def stop(engine: Engine) -> None:
    if engine.proc.poll() is None:
        engine.proc.terminate()
        try:
            engine.proc.wait(5)
        except subprocess.TimeoutExpired:
            engine.proc.kill()
            engine.proc.wait()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    """Factory for per-test engines; all are stopped afterwards."""
    started: list[Engine] = []

    def factory(*args: str, name: str = "test-model") -> Engine:
        started.append(launch(tmp_path, *args, name=name))
        return started[-1]

    yield factory
    for engine in started:
        stop(engine)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """One engine for the read-only shape tests, to keep the suite fast."""
    engine = launch(tmp_path_factory.mktemp("shared"))
    wait_for(lambda: httpx.get(engine.url("/health")).status_code == 200)
    yield engine
    stop(engine)


def wait_for(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


async def settle(get: Callable[[], Awaitable[Any]], want: Any, timeout: float = 5.0) -> None:
    """Poll an async probe until it returns `want` (engine state changes async)."""
    deadline = time.monotonic() + timeout
    while (got := await get()) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"still {got!r}, wanted {want!r}")
        await asyncio.sleep(0.02)


def gauges(text: str) -> dict[str, float]:
    found = re.findall(r'^(vllm:num_requests_\w+)\{engine="0",model_name="test-model"\} (\S+)$', text, re.M)
    return {name.split("_")[-1]: float(value) for name, value in found}


def sse_data(text: str) -> list[Any]:
    """Payloads of `data:` lines; [DONE] stays a string."""
    out: list[Any] = []
    for line in text.split("\n\n"):
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def chat(stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": "test-model", "messages": [{"role": "user", "content": "say hi"}], "stream": stream, **extra}


# --- lifecycle --------------------------------------------------------------


def test_health_loading_then_ok_and_logs(start: Callable[..., Engine]) -> None:
    engine = start("--start-delay", "0.6")
    first = httpx.get(engine.url("/health"))
    assert (first.status_code, first.json()) == (503, {"status": "loading"})
    assert httpx.post(engine.url("/v1/chat/completions"), json=chat()).status_code == 503
    wait_for(lambda: httpx.get(engine.url("/health")).status_code == 200)
    assert httpx.get(engine.url("/health")).json() == {"status": "ok"}
    port = engine.base.rsplit(":", 1)[1]
    lines = engine.stdout().splitlines()
    assert lines[0] == f"testengine test-model listening on 127.0.0.1:{port}"
    assert "GET /health" in lines


def test_listen_delay_opens_the_port_late_then_says_when_it_could_answer(start: Callable[..., Engine]) -> None:
    began = time.time()
    engine = start("--listen-delay", "0.5")  # returns once the port accepts connections
    assert time.time() - began >= 0.5
    assert httpx.get(engine.url("/health")).status_code == 200
    able = [line for line in engine.stdout().splitlines() if " able to answer at " in line]
    assert len(able) == 1 and began + 0.5 <= float(able[0].rsplit(" ", 1)[1]) <= time.time()


def test_sigterm_is_logged_with_its_times(start: Callable[..., Engine]) -> None:
    engine = start()
    stop(engine)
    lines = engine.stdout().splitlines()
    asked = next(float(line.rsplit(" ", 1)[1]) for line in lines if " stop asked at " in line)
    stopped = next(float(line.rsplit(" ", 1)[1]) for line in lines if " stopped at " in line)
    assert asked <= stopped


def test_fail_start_exits_1(start: Callable[..., Engine]) -> None:
    engine = start("--start-delay", "2", "--fail-start")  # time for the probe below, even on a busy host
    assert httpx.get(engine.url("/health")).status_code == 503
    assert engine.proc.wait(10) == 1
    assert "simulated start failure: " in engine.stderr()


def test_never_healthy(start: Callable[..., Engine]) -> None:
    engine = start("--never-healthy")
    time.sleep(0.3)  # (cannot race: on a slow machine a 503 before the lifecycle ran is a 503 too)
    assert httpx.get(engine.url("/health")).status_code == 503
    assert engine.proc.poll() is None


@pytest.mark.bounded
def test_crash_after_exits_3(start: Callable[..., Engine]) -> None:
    engine = start("--crash-after", "0.3")
    wait_for(lambda: httpx.get(engine.url("/health")).status_code == 200)
    assert engine.proc.wait(5) == 3
    assert "simulated crash" in engine.stderr()


@pytest.mark.bounded
async def test_sigterm_exits_0_fast_even_mid_stream(start: Callable[..., Engine]) -> None:
    # The first chunk comes at once, the next after 10 s: exiting well before that shows SIGTERM
    # did not wait for the stream (with a margin for a loaded machine; the cleanup is capped at 0.7 s).
    engine = start("--chunk-delay", "10")
    async with httpx.AsyncClient() as client:
        async with client.stream("POST", engine.url("/v1/chat/completions"), json=chat(True)) as resp:
            await resp.aiter_bytes().__anext__()
            began = time.monotonic()
            engine.proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(engine.proc.wait, 8) == 0
            assert time.monotonic() - began < 8


# --- OpenAI shapes (shared engine) ------------------------------------------


def test_models(shared: Engine) -> None:
    body = httpx.get(shared.url("/v1/models")).json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card | {"created": 0} == card | {
        "id": "test-model",
        "object": "model",
        "created": 0,
        "owned_by": "testengine",
        "root": "test-model",
        "max_model_len": 2048,
    }
    assert httpx.get(shared.url("/v1/models/test-model")).json() == card
    missing = httpx.get(shared.url("/v1/models/other"))
    assert missing.status_code == 404
    assert set(missing.json()["error"]) >= {"message", "type", "code"}


def test_chat_completion_shape_and_max_tokens(shared: Engine) -> None:
    body = httpx.post(shared.url("/v1/chat/completions"), json=chat()).json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "test-model" and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == REPLY
    assert body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 5
    short = httpx.post(shared.url("/v1/chat/completions"), json=chat(max_tokens=2)).json()
    assert short["choices"][0]["message"]["content"] == "Hello from"
    assert short["choices"][0]["finish_reason"] == "length"


def test_completion_shape(shared: Engine) -> None:
    body = httpx.post(shared.url("/v1/completions"), json={"model": "test-model", "prompt": "a b"}).json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    (choice,) = body["choices"]
    assert (choice["index"], choice["text"], choice["finish_reason"]) == (0, REPLY, "stop")
    assert body["usage"]["prompt_tokens"] == 2


def test_chat_stream_with_usage(shared: Engine) -> None:
    resp = httpx.post(shared.url("/v1/chat/completions"), json=chat(True, stream_options={"include_usage": True}))
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_data(resp.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    words = [c["choices"][0]["delta"]["content"] for c in chunks[1:6]]
    assert words == ["Hello", " from", " the", " test", " engine"]
    assert chunks[6]["choices"][0]["finish_reason"] == "stop"
    assert chunks[7]["choices"] == [] and chunks[7]["usage"]["completion_tokens"] == 5
    assert len(chunks) == 8


def test_completion_stream_without_usage(shared: Engine) -> None:
    resp = httpx.post(shared.url("/v1/completions"), json={"prompt": "x", "stream": True, "max_tokens": 3})
    events = sse_data(resp.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "text_completion" and "usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Hello from the"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_embeddings(shared: Engine) -> None:
    one = httpx.post(shared.url("/v1/embeddings"), json={"input": "hi"}).json()
    many = httpx.post(shared.url("/v1/embeddings"), json={"input": ["hi", "there"]}).json()
    assert one["object"] == "list" and one["model"] == "test-model"
    assert [d["index"] for d in many["data"]] == [0, 1]
    assert all(d["object"] == "embedding" and len(d["embedding"]) == 8 for d in many["data"])
    assert many["data"][0]["embedding"] == one["data"][0]["embedding"]
    assert many["data"][0]["embedding"] != many["data"][1]["embedding"]
    assert "prompt_tokens" in one["usage"]


def test_responses_non_streaming(shared: Engine) -> None:
    body = httpx.post(shared.url("/v1/responses"), json={"model": "test-model", "input": "hi"}).json()
    assert (body["object"], body["status"]) == ("response", "completed")
    (item,) = body["output"]
    assert (item["type"], item["role"]) == ("message", "assistant")
    assert item["content"] == [{"type": "output_text", "text": REPLY, "annotations": [], "logprobs": None}]
    assert body["usage"]["output_tokens"] == 5


def test_responses_streaming_events(shared: Engine) -> None:
    resp = httpx.post(shared.url("/v1/responses"), json={"input": "hi", "stream": True})
    blocks = [b for b in resp.text.split("\n\n") if b]
    kinds = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 5,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    datas = [json.loads(b.split("\n")[1].removeprefix("data: ")) for b in blocks]
    assert [d["type"] for d in datas] == kinds
    assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
    assert "".join(d["delta"] for d in datas[4:9]) == REPLY
    assert datas[-1]["response"]["status"] == "completed"


def test_other_v1_routes_echo(shared: Engine) -> None:
    rerank = httpx.post(shared.url("/v1/rerank?x=1"), json={"query": "q"}).json()
    assert rerank == {
        "echo": True,
        "method": "POST",
        "path": "/v1/rerank",
        "query": "x=1",
        "body_bytes": len(b'{"query":"q"}'),
        "content_type": "application/json",
    }
    audio = httpx.post(
        shared.url("/v1/audio/transcriptions"), files={"file": ("a.wav", b"\x00\x01RIFF")}, data={"model": "test-model"}
    ).json()
    assert audio["content_type"].startswith("multipart/form-data; boundary=")
    assert audio["body_bytes"] > 6
    for path in ("/v1/chat/completions/batch", "/v1/messages", "/v1/score"):
        assert httpx.post(shared.url(path), content=b"{}").json()["path"] == path
    assert httpx.get(shared.url("/v1/anything")).json()["method"] == "GET"


# --- load, sleep, failure injection, control ------------------------------


async def raw_request(port: int, path: str, payload: dict[str, Any]) -> tuple[Any, Any]:
    """Send a POST on a bare socket, so the test decides when to hang up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(payload).encode()
    writer.write(
        b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body)
    )
    await writer.drain()
    return reader, writer


def port_of(engine: Engine) -> int:
    return int(engine.base.rsplit(":", 1)[1])


async def test_metrics_running_waiting_fifo(start: Callable[..., Engine]) -> None:
    engine = start("--max-num-seqs", "1", "--chunk-delay", "0.1")
    done: list[int] = []
    async with httpx.AsyncClient(timeout=10) as client:

        async def one(i: int, limit: int) -> None:
            body = {"prompt": str(i), "stream": True, "max_tokens": limit}
            await client.post(engine.url("/v1/completions"), json=body)
            done.append(i)

        async def metric() -> dict[str, float]:
            return gauges((await client.get(engine.url("/metrics"))).text)

        tasks = [asyncio.create_task(one(0, 5))]
        await settle(metric, {"running": 1, "waiting": 0})
        for i in (1, 2):  # arrive one after the other, so FIFO order is known
            tasks.append(asyncio.create_task(one(i, 1)))
            await settle(metric, {"running": 1, "waiting": i})
        text = (await client.get(engine.url("/metrics"))).text
        assert "# TYPE vllm:num_requests_running gauge" in text
        assert "# HELP vllm:num_requests_waiting" in text
        await asyncio.gather(*tasks)
        assert done == [0, 1, 2]
        assert await metric() == {"running": 0, "waiting": 0}


async def test_hang_up_frees_seat_queue_place_and_connection(start: Callable[..., Engine]) -> None:
    engine = start("--chunk-delay", "0.2", "--max-num-seqs", "1")
    async with httpx.AsyncClient() as control:

        async def state() -> tuple[dict[str, float], int]:
            metric = gauges((await control.get(engine.url("/metrics"))).text)
            return metric, (await control.get(engine.url("/_test/connections"))).json()["open"]

        assert (await state())[1] == 0
        reader, streaming = await raw_request(port_of(engine), "/v1/chat/completions", chat(True))
        await reader.readuntil(b"data: ")
        assert await state() == ({"running": 1, "waiting": 0}, 1)
        _, queued = await raw_request(port_of(engine), "/v1/chat/completions", chat())
        await settle(state, ({"running": 1, "waiting": 1}, 2))
        queued.close()
        await settle(state, ({"running": 1, "waiting": 0}, 1))
        streaming.close()
        await settle(state, ({"running": 0, "waiting": 0}, 0))


@pytest.mark.bounded
async def test_sleep_mode(start: Callable[..., Engine]) -> None:
    engine = start("--sleep-mode")
    async with httpx.AsyncClient() as client:
        assert (await client.post(engine.url("/sleep?level=1"))).status_code == 200
        assert (await client.get(engine.url("/is_sleeping"))).json() == {"is_sleeping": True}
        pending = asyncio.create_task(client.post(engine.url("/v1/chat/completions"), json=chat()))

        async def waiting() -> float:
            return gauges((await client.get(engine.url("/metrics"))).text)["waiting"]

        await settle(waiting, 1)  # the request arrived, and waits while asleep
        assert not pending.done()
        assert (await client.post(engine.url("/wake_up"))).status_code == 200
        assert (await pending).json()["choices"][0]["message"]["content"] == REPLY
        assert (await client.get(engine.url("/is_sleeping"))).json() == {"is_sleeping": False}


async def test_wake_delay_answers_once_awake_and_logs_the_wake(start: Callable[..., Engine]) -> None:
    engine = start("--sleep-mode", "--wake-delay", "0.4")
    async with httpx.AsyncClient() as client:
        await client.post(engine.url("/sleep?level=1"))
        began = time.time()
        assert (await client.post(engine.url("/wake_up"))).status_code == 200
        assert time.time() - began >= 0.4
        assert (await client.get(engine.url("/is_sleeping"))).json() == {"is_sleeping": False}
    woke = [line for line in engine.stdout().splitlines() if " woke at " in line]
    assert len(woke) == 1 and float(woke[0].split(" after ")[1].split()[0]) >= 0.4


async def test_a_level_2_wake_logs_once_all_its_steps_are_done(start: Callable[..., Engine]) -> None:
    """bench/coldstart.py takes the engine's wake time from the line: a level 2 wake is three
    steps (weights, reload, kv cache), and the line counts from the first."""
    engine = start("--sleep-mode", "--wake-delay", "0.3")
    async with httpx.AsyncClient() as client:
        await client.post(engine.url("/sleep?level=2"))
        assert (await client.post(engine.url("/wake_up?tags=weights"))).status_code == 200
        assert (await client.post(engine.url("/collective_rpc"), json={"method": "reload_weights"})).status_code == 200
        assert not [line for line in engine.stdout().splitlines() if " woke at " in line]
        assert (await client.post(engine.url("/wake_up?tags=kv_cache"))).status_code == 200
    woke = [line for line in engine.stdout().splitlines() if " woke at " in line]
    assert len(woke) == 1 and float(woke[0].split(" after ")[1].split()[0]) >= 0.6


def test_sleep_routes_absent_without_flag(shared: Engine) -> None:
    assert httpx.post(shared.url("/sleep?level=1")).status_code == 404
    assert httpx.get(shared.url("/is_sleeping")).status_code == 404
    assert httpx.post(shared.url("/wake_up")).status_code == 404


def test_status_flag(start: Callable[..., Engine]) -> None:
    engine = start("--status", "429")
    wait_for(lambda: httpx.get(engine.url("/health")).status_code == 200)
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"):
        resp = httpx.post(engine.url(path), json=chat())
        assert resp.status_code == 429
        assert set(resp.json()["error"]) >= {"message", "type", "code"}
        assert resp.json()["error"]["code"] == 429


def test_live_config(start: Callable[..., Engine]) -> None:
    engine = start()
    cfg = httpx.post(engine.url("/_test/config"), json={"status": 500, "reply": "one two three"}).json()
    assert cfg["status"] == 500 and cfg["reply"] == "one two three"
    assert httpx.post(engine.url("/v1/chat/completions"), json=chat()).status_code == 500
    httpx.post(engine.url("/_test/config"), json={"status": None, "chunk_delay": 0.1, "max_num_seqs": 4})
    began = time.monotonic()
    resp = httpx.post(engine.url("/v1/chat/completions"), json=chat())
    assert resp.json()["choices"][0]["message"]["content"] == "one two three"
    assert time.monotonic() - began >= 0.3
    assert httpx.post(engine.url("/_test/config"), json={"nope": 1}).status_code == 400


@pytest.mark.bounded
def test_streaming_is_unbuffered(start: Callable[..., Engine]) -> None:
    """The first chunk arrives while the engine is still generating: the next one is an hour
    away (a buffered stream would send nothing before its end; the read timeout bounds a hang)."""
    engine = start("--chunk-delay", "3600")
    with httpx.stream("POST", engine.url("/v1/chat/completions"), json=chat(True), timeout=30) as resp:
        first = next(line for line in resp.iter_lines() if line)
        assert json.loads(first.removeprefix("data: "))["choices"][0]["delta"]["role"] == "assistant"


def test_crash_endpoint(start: Callable[..., Engine]) -> None:
    engine = start()
    assert httpx.post(engine.url("/_test/crash")).status_code == 200
    assert engine.proc.wait(5) == 3


def test_request_recording(start: Callable[..., Engine]) -> None:
    engine = start()
    wait_for(lambda: httpx.get(engine.url("/health")).status_code == 200)
    httpx.get(engine.url("/metrics"))
    httpx.post(
        engine.url("/v1/chat/completions?a=b"),
        content=b'{"x": 1}',
        headers=[("X-Rep", "one"), ("X-Rep", "two"), ("Content-Type", "application/json")],
    )
    httpx.post(engine.url("/v1/rerank"), content=b"\xff\xfe\x00")
    got = httpx.get(engine.url("/_test/requests")).json()
    assert [(r["method"], r["path"]) for r in got] == [("POST", "/v1/chat/completions"), ("POST", "/v1/rerank")]
    first, second = got
    assert first["query"] == "a=b" and first["body"] == '{"x": 1}'
    assert first["headers"]["x-rep"] == "one, two" and isinstance(first["time"], float)
    assert base64.b64decode(second["body_b64"]) == b"\xff\xfe\x00"
    assert httpx.delete(engine.url("/_test/requests")).status_code == 200
    assert httpx.get(engine.url("/_test/requests")).json() == []
