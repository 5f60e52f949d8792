"""The words of a wait's progress lines (gateway/progress.py), from honest statuses as the live
status gives them: what is said, and the key that says whether what a request waits for changed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dgxmm.gateway import progress
from dgxmm.gateway.progress import Chunks, Looks, line
from dgxmm.records.deployment import Deployment, State


def status(code: str, **fields: Any) -> dict[str, Any]:
    return {"code": code, "label": code.capitalize(), "last_cold_start_s": None, **fields}


def deps(*names: str) -> list[dict[str, str]]:
    return [{"id": f"d-{n}", "name": n} for n in names]


@pytest.mark.parametrize(
    "given,said",
    [
        (status("cold", last_cold_start_s=2.84), "Starting chat on demand; its last start took 2.8 s."),
        (status("cold"), "Starting chat on demand; no start of it was timed yet."),
        (status("asleep", last_cold_start_s=1.0), "Waking chat; its last start took 1.0 s."),
        (status("loading"), "Loading chat; no start of it was timed yet."),
        (
            status("loading", waiting_for_gate=True),
            "Loading chat once another engine has finished loading; no start of it was timed yet.",
        ),
        (status("serving", count=2), "Waiting for a turn: chat is answering 2 requests."),
        (status("stopping"), "Waiting for chat to stop; it starts again for this request."),
        (status("too_big"), "Waiting for chat (Too_big)."),
        (
            status("queued", waits_for={"kind": "victim", "at": 1016.4, "deployments": deps("coder-7b")}),
            "Waiting for memory: coder-7b stops when idle, in 16 s.",
        ),
        (
            status("queued", waits_for={"kind": "victim", "at": 990.0, "deployments": deps("a", "b")}),
            "Waiting for memory: a, b stop when idle, in 0 s.",
        ),
        (
            status(
                "queued",
                waits_for={
                    "kind": "stop",
                    "at": None,
                    "deployments": deps("a"),
                    "then": {"kind": "busy", "at": None, "deployments": deps("b", "c")},
                },
            ),
            "Waiting for memory: a is stopping; then b, c are answering requests; room is made once idle.",
        ),
        (
            status("queued", waits_for={"kind": "drain", "at": None, "deployments": deps("a")}),
            "Waiting for memory: a finishes what it serves, then stops.",
        ),
        (status("queued", waits_for=None), "Waiting for memory: room is being made."),
    ],
)
def test_what_a_line_says(given: dict[str, Any], said: str) -> None:
    assert line("chat", given, 1000.0)[1] == said


def test_the_key_changes_with_what_is_waited_for_not_with_time() -> None:
    victim = {"kind": "victim", "at": 1016.0, "deployments": deps("a")}
    assert (
        line("m", status("queued", waits_for=victim), 1000.0)[0]
        == line("m", status("queued", waits_for=victim), 1010.0)[0]
    )
    other = {**victim, "deployments": deps("b")}
    assert (
        line("m", status("queued", waits_for=victim), 1000.0)[0]
        != line("m", status("queued", waits_for=other), 1000.0)[0]
    )
    assert line("m", status("cold"), 0)[0] != line("m", status("loading"), 0)[0]
    assert line("m", status("loading"), 0)[0] != line("m", status("loading", waiting_for_gate=True), 0)[0]


def test_a_chunk_is_an_engine_shaped_event_with_reasoning_alone() -> None:
    chunks = Chunks("qwen:latest")
    first, second = chunks.chunk("one"), chunks.chunk("two")
    assert first.startswith(b"data: ") and first.endswith(b"\n\n")
    a, b = json.loads(first[6:]), json.loads(second[6:])
    assert a["id"] == b["id"] and a["id"].startswith("chatcmpl-") and a["created"] == b["created"]
    assert a["object"] == "chat.completion.chunk" and a["model"] == "qwen:latest"
    assert a["choices"] == [
        {"index": 0, "delta": {"reasoning_content": "one\n"}, "logprobs": None, "finish_reason": None}
    ]


class Statuses:
    """The live status as ``Looks`` reads it: each read counted, the record it was given kept."""

    def __init__(self) -> None:
        self.read: list[Deployment] = []

    def status(self, dep: Deployment) -> dict[str, Any]:
        self.read.append(dep)
        return status("loading" if dep.state is State.STARTING else "cold")


class Records:
    def __init__(self, *deps: Deployment) -> None:
        self.by_id = {d.id: d for d in deps}

    def peek(self, deployment_id: str) -> Deployment | None:
        return self.by_id.get(deployment_id)


def test_one_look_per_deployment_serves_every_request_waiting_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    old = Deployment(id="d", name="d", served_name="d", engine="command", memory_gib=1)
    new = old.model_copy(update={"state": State.STARTING})
    statuses, records = Statuses(), Records(new)
    looks = Looks(statuses, records)
    monkeypatch.setattr(progress, "LOOK_EVERY_S", 3600.0)
    assert looks.look(old) is looks.look(old) and len(statuses.read) == 1
    assert statuses.read[0] is new, "the record as it is now"
    monkeypatch.setattr(progress, "LOOK_EVERY_S", 0.0)
    assert looks.look(old)["code"] == "loading" and len(statuses.read) == 2
