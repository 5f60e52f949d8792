"""Bodies that grew in dgxmm (issue 34 item 4), replayed against a served dgxmm through the model
router: a 16 MiB body by alias reaches the engine byte for byte but its name, and one to a
deployment with request parameters byte for byte but those (issue 51 item 4); four 16 MiB bodies
held through a cold start cost their bytes, not a parsed tree; another caller waits no longer
than a moment behind the scan of one; a lone surrogate by alias is answered as by served name."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from conftest import KEY, engine_command
from served import until

from dgxmm.gateway import jsonbody
from hostile.harness import RSS_BOUND_MIB, Front, Peak, bounded

pytestmark = pytest.mark.hostile

LIMIT = 16 * 1024 * 1024  # max_body_bytes
STALL_BOUND_S = 0.1  # the least bound on another caller's wait: what a loaded 2-core machine adds


def router(front: Front, timeout: float = 120) -> httpx.Client:
    return httpx.Client(
        base_url=f"http://127.0.0.1:{front.served.port}/v1",
        timeout=timeout,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        transport=httpx.HTTPTransport(local_address="127.0.0.2"),
    )


def sized(head: bytes, unit: bytes, tail: bytes, size: int = LIMIT - 4096) -> bytes:
    """``head``, ``unit`` repeated, ``tail``: ``size`` bytes at most."""
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


def alias(front: Front, dep_id: str, name: str) -> None:
    with front.served.admin() as admin:
        assert admin.patch(f"/deployments/{dep_id}", json={"aliases": [name]}).status_code == 200


def last_body(front: Front) -> str:
    return str(front.engine_requests()[-1]["body"])


def test_a_16_mib_body_by_alias_reaches_the_engine_byte_for_byte_but_its_name(front: Front) -> None:
    alias(front, front.deployment["id"], "m-alias")
    # Numbers json.dumps would write otherwise (1e15 as 1000000000000000.0, 1e999 as Infinity),
    # escapes, a repeated model (the last one counts) and one in a nested object (not the body's).
    body = sized(
        b'{"model": "m", "messages": [{"role": "user", "content": "hi \\u00e9 \\ud83d\\ude00"}], '
        b'"nested": {"model": "m-alias"}, "n": [',
        b"1e15, 1E+15, 12345678901234567890123, ",
        b'1e999], "model" : "m-alias"}',
    )
    front.clear_engine()
    with Peak(front.served) as peak, router(front) as r:
        resp = r.post("/chat/completions", content=body)
    assert resp.status_code == 200, resp.text
    assert last_body(front).encode() == body[: body.rindex(b'"m-alias"')] + b'"m"}'
    bounded(front, "a 16 MiB body by alias", peak)
    front.clear_engine()


def test_a_16_mib_body_with_request_parameters_reaches_the_engine_byte_for_byte_but_them(front: Front) -> None:
    """Issue 51 item 4 under the rename's bounds: the override replaces the last temperature
    (the earlier one goes), the stripped seed goes, the default is added after the ``{``; the
    rest of 16 MiB arrives as sent, and the process holds its bytes, not a parsed tree."""
    dep_id = front.deployment["id"]
    params = {"request_overrides": {"temperature": 0.2}, "request_defaults": {"top_k": 40}, "strip_params": ["seed"]}
    with front.served.admin() as admin:
        assert admin.patch(f"/deployments/{dep_id}", json=params).status_code == 200
    middle = b"1e15, 1E+15, 12345678901234567890123, "
    body = sized(b'{"temperature": 1, "seed": 7, "model": "m", "n": [', middle, b'1e999], "temperature" : 2}')
    front.clear_engine()
    try:
        with Peak(front.served) as peak, router(front) as r:
            resp = r.post("/chat/completions", content=body)
        assert resp.status_code == 200, resp.text
        sent = last_body(front).encode()
        assert sent == b'{"top_k":40,' + body[len(b'{"temperature": 1, "seed": 7,') : -2] + b"0.2}"
        bounded(front, "a 16 MiB body with request parameters", peak)
    finally:
        with front.served.admin() as admin:
            empty = {"request_overrides": {}, "request_defaults": {}, "strip_params": []}
            admin.patch(f"/deployments/{dep_id}", json=empty)
        front.clear_engine()


def test_a_lone_surrogate_by_alias_is_answered_as_by_served_name(front: Front) -> None:
    alias(front, front.deployment["id"], "m-alias")
    answers = {}
    for name in ("m", "m-alias"):
        body = b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud83d"}]}' % name.encode()
        with router(front) as r:
            resp = r.post("/chat/completions", content=body)
        answers[name] = (resp.status_code, resp.headers["content-type"], sorted(resp.json()))
        assert last_body(front) == body.decode().replace('"m-alias"', '"m"')
    assert answers["m"] == answers["m-alias"] and answers["m"][0] == 200
    assert "Traceback" not in front.served.log()
    front.clear_engine()


def test_four_16_mib_bodies_held_through_a_cold_start_cost_their_bytes(front: Front) -> None:
    with front.served.admin() as admin:
        slow = admin.post(
            "/deployments",
            json={
                "name": "slow",
                "aliases": ["slow-alias"],
                "engine": "command",
                "memory_gib": 1,
                "mode": "on_demand",
                "idle_timeout_s": 3600,
                "command": engine_command("--start-delay", "6"),
            },
        ).json()
    # The shape that cost 428 MiB parsed: objects, as small as they come.
    bodies = [
        sized(b'{"model": "%s", "messages": [' % name, b"{}, ", b'{"role": "user", "content": "hi"}]}')
        for name in (b"slow", b"slow-alias", b"slow", b"slow-alias")
    ]
    statuses: list[int] = []

    def send(body: bytes) -> None:  # (to an endpoint the test engine echoes: it would parse for seconds)
        with router(front) as r:
            statuses.append(r.post("/rerank", content=body).status_code)

    threads = [threading.Thread(target=send, args=(body,)) for body in bodies]
    with Peak(front.served) as peak:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert statuses == [200] * 4, statuses
    try:
        bounded(front, "four 16 MiB bodies held through a cold start", peak)
    finally:
        with front.served.admin() as admin:
            admin.post(f"/deployments/{slow['id']}/stop")
            until(lambda: admin.get(f"/deployments/{slow['id']}").json()["state"] == "stopped")
            admin.delete(f"/deployments/{slow['id']}")
        front.clear_engine()
    assert peak.peak - front.idle_rss_mib < RSS_BOUND_MIB


@pytest.mark.parametrize(
    ("shape", "body"),
    [
        ("objects", sized(b'{"messages": [', b"{},", b'{}], "model": "m"}')),
        ("strings", sized(b'{"messages": [', b'"",', b'""], "model": "m"}')),
        ("members", sized(b"{", b'"a":0,', b'"model": "m"}')),
        ("escaped keys", sized(b"{", b'"\\u0061":0,', b'"model": "m"}')),
        ("escaped quotes", sized(b'{"x": "', b'\\"', b'", "model": "m"}')),
    ],
)
def test_no_other_caller_waits_behind_one_bodys_scan(front: Front, shape: str, body: bytes) -> None:
    """While a 16 MiB body is scanned, small requests keep being answered: none waits half as long
    as the scan takes (timed here, on this machine under its load now: 0.2 to 1.5 s alone), which
    is what each would wait if the scan held the event loop. A fixed bound of 100 ms alone failed
    on a loaded machine (122 ms once in a CI run) though the scan never ran on the loop, and so did
    one try of half the scan with two other suites running: up to three tries are made. A scan on
    the loop fails every try, as each holds some small request for the rest of the scan."""
    tries: list[tuple[float, list[float]]] = []
    for _ in range(3):
        began = time.perf_counter()
        jsonbody.read(body)
        bound = max(STALL_BOUND_S, (time.perf_counter() - began) / 2)
        waits, elapsed = small_waits_during(front, body)
        tries.append((bound, sorted(waits)[-3:]))
        if max(waits) < bound:
            break
    front.figures.append(
        (
            f"small requests during a 16 MiB body of {shape}: longest wait {max(waits) * 1000:.0f} ms "
            f"of {len(waits)} in {elapsed:.2f} s ({len(tries)} tries)",
            0,
            0,
            0,
        )
    )
    assert max(waits) < bound, (shape, tries)


def small_waits_during(front: Front, body: bytes) -> tuple[list[float], float]:
    """How long each small request sent one after another waited while ``body`` was posted on
    another connection (echoed by the test engine, which would parse it for seconds, holding up the
    rest), and how long that took."""
    done = threading.Event()
    answer: list[Any] = []
    waits: list[float] = []

    def big() -> None:
        with router(front) as r:
            answer.append(r.post("/rerank", content=body).status_code)
        done.set()

    small = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    with router(front, timeout=30) as r:
        r.post("/chat/completions", content=small)  # a kept-alive connection, warm
        thread = threading.Thread(target=big)
        began = time.monotonic()
        thread.start()
        while not done.is_set():
            sent = time.monotonic()
            assert r.post("/chat/completions", content=small).status_code == 200
            waits.append(time.monotonic() - sent)
        thread.join()
    assert answer == [200]
    front.clear_engine()
    return waits, time.monotonic() - began
