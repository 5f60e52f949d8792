#!/usr/bin/env python3
"""A generated corpus of hostile gateway requests, replayed against a served dgxmm over raw
sockets: whatever the path, headers and body, dgxmm never answers 5xx, and its RSS stays within
the hostile suite's bound.

    python tests/hostile/corpus.py [--requests 100000] [--seed 1] [--concurrency 32]

(``make fuzz``) serves dgxmm with one test-engine deployment, replays the corpus in a few minutes
and prints the answers by status; then it posts hostile GGUFs to ``/api/estimate`` (issue 34):
every shape of tests/hostile/ggufs.py, a FIFO, a sparse 4 GiB file, a directory and a device,
and ``--ggufs`` seeded mutations of a valid one. Each must be an estimate or a 422, within a
second. Last, hostile declared files (issue 47): every shape of tests/hostile/tomls.py and
``--tomls`` seeded variations, each written to the watched ``deployments_dir`` and met by
``GET /api/config/plan``: each must be refused, naming the file and why, within two seconds.
``tests/hostile/test_fuzz_corpus.py`` replays 5,000 of the same requests in CI (and fewer GGUFs
and declared files). The corpus is a seeded random generator, not a file: the same seed gives the
same requests, so a failure found here can be replayed alone (``--seed``, ``--skip``).

What it mixes: routes the gateway serves and every other method and path, percent-encodings
that must be refused, forwarding headers in every spelling, credentials missing, wrong or sent
twice, bodies that are JSON, nested JSON, not JSON, not UTF-8, empty, or chunked in random pieces,
and query strings. What it avoids: a body shorter than its Content-Length (that waits for the
rest; the body deadline is issue 26's) and wrong credentials more than rarely (twenty failed key
checks a minute lock the peer out with 429, a refusal the corpus would then mostly meet).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import struct
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from served import Served

ENDPOINTS = [
    "chat/completions",
    "completions",
    "embeddings",
    "responses",
    "messages",
    "chat/completions/batch",
    "audio/transcriptions",
    "audio/translations",
    "rerank",
    "score",
    "models",
    "models/m",
    "tokenize",
    "health",
    "metrics",
    "responses/r1",
    "messages/count_tokens",
    "load_lora_adapter",
]
SEGMENTS = [
    "v1",
    "m",
    ".",
    "..",
    "",
    "%2e",
    "%2E%2e",
    "%2f",
    "%5C",
    "%23",
    "%3F",
    "%00",
    "%",
    "%zz",
    "%C0%AF",
    "%C2%85",
    "%E2%80%AE",
    "%E2%80%8B",
    "%EF%BB%BF",
    ";",
    "m;x",
    "@",
    "~",
    "*",
    "a b",
    "\u00e9",
    "%F0%9F%98%80",
]
NAMES = [
    "X-Forwarded-For",
    "X_Forwarded_For",
    "x-forwarded_for",
    "Forwarded",
    "X-Real-IP",
    "X_Real_Ip",
    "X-Forwarded-Host",
    "Cookie",
    "Proxy-Authorization",
    "Proxy_Authorization",
    "x-dgxmm-health-check",
    "Keep-Alive",
    "TE",
    "Trailer",
    "Upgrade",
    "Expect",
    "Accept-Encoding",
    "X-Custom",
    "x-request-id",
    "Content-Type",
    "User-Agent",
    "Accept",
    "OpenAI-Organization",
    "api-key",
    "x-api-key",
]
VALUES = [
    "",
    "1",
    "0",
    "127.0.0.1",
    "for=1.2.3.4",
    "close",
    "keep-alive, X-Custom",
    "chunked",
    "gzip, br",
    "100-continue",
    "h2c",
    "trailers",
    "a" * 300,
    "\u00ff\u00fe",
    "application/json",
    "text/plain",
    "multipart/form-data; boundary=x",
    "req-" + "x" * 120,
    "req id with spaces",
]


def _body(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.35:
        body: object = {
            "model": "m",
            "messages": [{"role": "user", "content": rng.choice(["hi", "", "\u2603" * 5])}],
            "stream": rng.random() < 0.4,
            "max_tokens": rng.choice([1, 4, None, -1, "x"]),
        }
        if rng.random() < 0.2:
            body[rng.choice(["response_format", "tools", "stream_options", "guided_json"])] = rng.choice(  # type: ignore[index]
                [None, {}, [], {"type": "json_object"}, {"include_usage": True}]
            )
        return json.dumps(body).encode()
    if kind < 0.45:
        return json.dumps({"model": "m", "input": rng.choice(["x", ["a", "b"], 3, None])}).encode()
    if kind < 0.55:
        depth = rng.choice([10, 500, 2000])
        return b"[" * depth + b"]" * depth
    if kind < 0.65:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if kind < 0.75:
        return rng.choice([b"", b"null", b"1e999", b'{"stream": true}', b'{"stream": "yes"}', b"NaN", b'"\xff"'])
    if kind < 0.85:
        return json.dumps(rng.choice([[], {}, "x", {"model": None}, {"messages": "x"}])).encode()
    return _grown(rng)


def _grown(rng: random.Random) -> bytes:
    """Body shapes that grew in dgxmm (issue 34): many tiny values, escapes, repeated and nested
    models, numbers and strings the standard library would write otherwise, surrogates, invalid
    UTF-8, whitespace everywhere, truncations; by served name or alias (sent to the router too)."""
    n = rng.choice([1, 100, 1000])  # (a larger body sent to a refused path meets the linger limit: a reset)
    model = rng.choice([b'"m"', b'"m-alias"', b'"\\u006d"', b'"\\ud83d"', b"null", b"1", b'"nope"'])
    value = rng.choice(
        [
            b"{}",
            b'""',
            b"1e15",
            b"1e999",
            b"NaN",
            b'"\\ud83d"',
            b'"\\\\\\""',
            b'"\xff"',
            b"[[]]",
            b'{"model": "x"}',
            b"-0.0",
            b"12345678901234567890123",
        ]
    )
    ws = rng.choice([b"", b" ", b"\n\t "])
    members = [
        b'"messages"' + ws + b":" + ws + b"[" + (b"," + ws).join([value] * n) + b"]",
        b'"model"' + ws + b":" + ws + model,
    ]
    if rng.random() < 0.3:
        members.insert(0, b'"model": "other"')  # a repeated key: the last one counts
    if rng.random() < 0.3:
        members.append(
            rng.choice(
                [
                    b'"stream": true',
                    b'"tools": null',
                    b'"guided_json": {}',
                    b'"\\u0074ext": {"format": {"type": "json_schema"}}',
                ]
            )
        )
    body = ws + b"{" + ws + (b"," + ws).join(members) + ws + b"}" + ws
    if rng.random() < 0.1:
        body = body[: rng.randrange(len(body))]
    return body


def _path(rng: random.Random, dep_id: str) -> str:
    roll = rng.random()
    if roll < 0.1:
        return "/v1/" + rng.choice(["chat/completions", "completions", "embeddings", "rerank"])  # the router
    if roll < 0.6:
        parts = [dep_id, "v1", *rng.choice(ENDPOINTS).split("/")]
    elif roll < 0.85:
        parts = [rng.choice([dep_id, dep_id, "nope", ""]), *(rng.choice(SEGMENTS) for _ in range(rng.randrange(1, 5)))]
    else:
        return rng.choice(
            [
                "/dgxmm/ondemand",
                "/dgxmm/ondemand/",
                "/dgxmm/ondemand//v1",
                "/dgxmm/ondemand/%2e%2e/api",
                f"/dgxmm/ondemand/{dep_id}",
                f"/dgxmm//ondemand/{dep_id}/v1/models",
            ]
        )
    path = "/dgxmm/ondemand/" + "/".join(quote(p, safe="%;@~*") for p in parts)
    if rng.random() < 0.15:
        path += "?" + rng.choice(["a=1", "stream=true", "x=%00", "%zz", "a=" + "b" * 200, "&&=="])
    return path


def _chunked(body: bytes, rng: random.Random) -> bytes:
    out, rest = [], body
    while rest:
        size = rng.randint(1, max(1, len(rest)))
        out.append(b"%x\r\n%b\r\n" % (size, rest[:size]))
        rest = rest[size:]
    return b"".join(out) + b"0\r\n\r\n"


def corpus(seed: int, count: int, dep_id: str, key: str, skip: int = 0) -> Iterator[bytes]:
    """``count`` raw requests (each with ``Connection: close``), the first ``skip`` left out."""
    rng = random.Random(seed)
    for index in range(skip + count):
        method = rng.choices(["POST", "GET", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"], [60, 20, 5, 4, 4, 4, 3])[0]
        lines = [f"{method} {_path(rng, dep_id)} HTTP/1.1", "Host: dgxmm"]
        auth = rng.random()
        if auth < 0.9998:
            lines.append(rng.choice([f"Authorization: Bearer {key}", f"authorization: bearer  {key} "]))
        elif auth < 0.9999:  # (twenty failed key checks a minute lock the peer out: rare)
            lines.append(rng.choice([f"Authorization: Basic {key}", "Authorization:", "Authorization: Bearer wrong"]))
        for _ in range(rng.choice([0, 0, 1, 2, 4])):
            lines.append(f"{rng.choice(NAMES)}: {rng.choice(VALUES)}")
        body = _body(rng) if method in ("POST", "PUT", "PATCH") or rng.random() < 0.05 else b""
        if body and rng.random() < 0.1:
            lines.append("Transfer-Encoding: chunked")
            payload = _chunked(body, rng)
        else:
            lines.append(f"Content-Length: {len(body)}")
            payload = body
        lines.append("Connection: close")
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + payload
        if index >= skip:
            yield raw


@dataclass
class Replayed:
    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[str] = field(default_factory=list)  # 5xx (and unreadable answers), with their requests
    seconds: float = 0.0


async def _one(port: int, raw: bytes, source: str, result: Replayed) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    except OSError as exc:
        result.server_errors.append(f"cannot connect: {exc}")
        return
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(-1), 60)
    except (OSError, TimeoutError) as exc:
        result.server_errors.append(f"{type(exc).__name__}: {exc} for {raw[:200]!r}")
        return
    finally:
        writer.close()
    try:
        status = int(data.split(b" ", 2)[1])
        while 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            data = data.split(b"\r\n\r\n", 1)[1]
            status = int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        result.server_errors.append(f"no status line: {data[:200]!r} for {raw[:200]!r}")
        return
    result.statuses[status] += 1
    if status >= 500 and not documented(status, data.split(b"\r\n\r\n", 1)[-1]):
        answer = data.split(b"\r\n\r\n", 1)[-1][:200]
        result.server_errors.append(f"{status} {answer!r} for {raw[:300]!r}")


# The 503s the spec gives on purpose, about the deployment's state, not a fault of dgxmm's: a
# health-check request for an endpoint with no health answer, and a model lookup or health check
# while the deployment is not ready (docs/gateway.md).
DOCUMENTED_503 = frozenset({"ondemand_health_unsupported", "ondemand_not_ready"})


def documented(status: int, body: bytes) -> bool:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return False
    return status == 503 and code in DOCUMENTED_503


async def replay(port: int, requests: Iterator[bytes], concurrency: int = 32, source: str = "127.0.0.2") -> Replayed:
    result = Replayed()
    began = time.monotonic()

    async def worker() -> None:
        for raw in requests:  # one shared iterator: each request is sent once
            await _one(port, raw, source, result)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.seconds = time.monotonic() - began
    return result


# The numbers a mutation writes over a count, a length, a type or a value of the valid GGUF.
EXTREMES = [0, 1, 2**31 - 1, 2**32 - 1, 2**62, 2**63, 2**64 - 1, 2**27, 4096, 2**21 + 1]
ESTIMATE_SECONDS = 1.0


def gguf_corpus(seed: int, count: int) -> Iterator[tuple[str, bytes]]:
    """The hostile GGUFs (ggufs.SHAPES), then ``count`` mutations of the valid one, each of one to
    three changes: a byte changed, an extreme number written over eight bytes, or the file cut."""
    from hostile.ggufs import SHAPES, valid

    yield from ((name, raw) for name, (raw, _) in SHAPES.items())
    rng = random.Random(seed)
    base = valid()
    for index in range(count):
        raw = bytearray(base)
        for _ in range(rng.randint(1, 3)):
            if len(raw) <= 8:
                break
            roll, at = rng.random(), rng.randrange(len(raw) - 8)
            if roll < 0.4:
                raw[at] = rng.randrange(256)
            elif roll < 0.9:
                struct.pack_into("<Q", raw, at, rng.choice(EXTREMES))
            else:
                del raw[at:]
        yield f"mutation {index} of seed {seed}", bytes(raw)


def replay_ggufs(served: Served, folder: Path, files: Iterator[tuple[str, bytes]]) -> Replayed:
    """Post each file (and the special ones: a FIFO, a sparse file, a directory, a device) to
    ``/api/estimate``, as the wizard does; anything but an estimate or a 422 within a second is a
    fault."""
    from hostile.ggufs import write_specials

    result, began = Replayed(), time.monotonic()
    path = folder / "fuzz.gguf"
    specials = [(name, special, None) for name, (special, _) in write_specials(folder / "specials").items()]
    with served.admin() as admin:
        for name, target, raw in itertools.chain(specials, ((name, path, raw) for name, raw in files)):
            if raw is not None:
                target.write_bytes(raw)
            sent = time.monotonic()
            resp = admin.post("/estimate", json={"model": str(target)})
            took = time.monotonic() - sent
            result.statuses[resp.status_code] += 1
            if resp.status_code not in (200, 422) or took > ESTIMATE_SECONDS:
                result.server_errors.append(f"{name}: {resp.status_code} in {took:.2f} s: {resp.text[:200]}")
    result.seconds = time.monotonic() - began
    return result


def main() -> None:
    sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
    from conftest import KEY, engine_command
    from served import Served

    parser = argparse.ArgumentParser(description="replay a generated corpus of hostile gateway requests")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N requests of the corpus")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--ggufs", type=int, default=2000, help="mutations of a valid GGUF posted to /api/estimate")
    parser.add_argument("--tomls", type=int, default=200, help="variations of hostile declared files")
    args = parser.parse_args()
    import tempfile

    from hostile.tomls import TOML_SECONDS, replay_tomls, toml_corpus

    tmp = Path(tempfile.mkdtemp(prefix="dgxmm-fuzz-"))
    declared = tmp / "deployments.d"
    declared.mkdir()
    env = {"DGXMM_SERVER__DEPLOYMENTS_DIR": str(declared), "DGXMM_SERVER__DEPLOYMENTS_POLL_S": "0.1"}
    served = Served(tmp, {"DGXMM_SERVER__LOG_LEVEL": "warning", **env}, open_files=1024).start()
    try:
        with served.admin() as admin:
            view = admin.post(
                "/deployments",
                json={
                    "name": "m",
                    "aliases": ["m-alias"],
                    "engine": "command",
                    "memory_gib": 1,
                    "mode": "on_demand",
                    "idle_timeout_s": 3600,
                    "command": engine_command(),
                },
            ).json()
        idle = served.rss_mib()
        result = asyncio.run(
            replay(served.port, corpus(args.seed, args.requests, view["id"], KEY, args.skip), args.concurrency)
        )
        after = served.rss_mib()
        estimates = replay_ggufs(served, served.data_dir.parent, gguf_corpus(args.seed, args.ggufs))
        last = served.rss_mib()
        tomls = replay_tomls(served, declared, toml_corpus(args.seed, args.tomls))
        final = served.rss_mib()
    finally:
        served.stop()
    print(
        f"{sum(result.statuses.values())} requests in {result.seconds:.0f} s "
        f"({sum(result.statuses.values()) / result.seconds:.0f}/s); RSS {idle:.0f} -> {after:.0f} MiB"
    )
    for status, n in sorted(result.statuses.items()):
        print(f"  {status}: {n}")
    for line in result.server_errors[:20]:
        print("  5xx or no answer:", line)
    print(
        f"{sum(estimates.statuses.values())} hostile GGUFs posted to /api/estimate in {estimates.seconds:.0f} s; "
        f"RSS {after:.0f} -> {last:.0f} MiB"
    )
    for status, n in sorted(estimates.statuses.items()):
        print(f"  {status}: {n}")
    for line in estimates.server_errors[:20]:
        print("  not an estimate or a 422 within a second:", line)
    print(
        f"{sum(tomls.statuses.values())} hostile declared files met by /api/config/plan in {tomls.seconds:.0f} s; "
        f"RSS {last:.0f} -> {final:.0f} MiB"
    )
    for line in tomls.server_errors[:20]:
        print(f"  not refused within {TOML_SECONDS:g} s:", line)
    sys.exit(1 if result.server_errors or estimates.server_errors or tomls.server_errors else 0)


if __name__ == "__main__":
    main()
