"""A caller's ``keep_alive`` (Ollama's) or ``ttl`` (LM Studio's): how long its model stays once
idle, asked in the request. Ollama's API reads it from its own bodies (``ollama.translate``);
an OpenAI body (``/v1``) carries it as a top-level member that the engine must never see (vLLM
refuses unknown fields in strict mode, and the value means nothing to it), so the gateway reads
the members and takes them out (``taken``) before anything else rewrites the body.

One parser of Ollama's forms (``seconds``) for both APIs: a number of seconds, or a Go
duration ("5m", "1h30m", "-1s"); negative means never for idleness (``math.inf``); ``0`` right
after. ``ttl`` is seconds only (LM Studio's). The seconds kept are within ``[ondemand]
idle_timeout_min_s`` and ``idle_timeout_max_s`` (``held``), and a value held to a bound says so
in the answer's ``x-dgxmm-keep-alive`` header (``exchange.KEPT_HEADER``) (docs/gateway.md).
"""

from __future__ import annotations

import math
import re
from typing import Any

import orjson

from dgxmm.front.body import Body
from dgxmm.gateway import bodyparams, jsonbody, toplevel
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.toplevel import MAX_REPEATS, Member, Shape

NAMES = frozenset(jsonbody.KEEPS)
NEVER = "never"  # the header's value for a negative keep_alive
_DURATION = re.compile(r"(-?\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class BadKeepAlive(ValueError):
    """A ``keep_alive`` or ``ttl`` that is no duration: the request is refused (400)."""


def seconds(value: Any) -> float | None:
    """Ollama's ``keep_alive`` in seconds (``math.inf`` for a negative one: never); None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadKeepAlive('keep_alive must be a duration ("5m") or a number of seconds')
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"-?\d+(\.\d+)?", text):
            found = float(text)
        else:
            parts = _DURATION.findall(text)
            if not parts or "".join(n + u for n, u in parts) != text:
                raise BadKeepAlive(f'keep_alive {value[:40]!r} is not a duration ("5m", "1h", "30s")')
            found = sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        found = float(value)
    return math.inf if found < 0 else found


def ttl_seconds(value: Any) -> float:
    """LM Studio's ``ttl``: a number of seconds (negative: never, as a negative keep_alive)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadKeepAlive("ttl must be a number of seconds")
    return math.inf if value < 0 else float(value)


def held(asked: float, low: float, high: float) -> tuple[float, bytes]:
    """``asked`` within ``[low, high]`` (a never stays never), and the header's value that says
    what was kept: the seconds, and whether they were held to a bound."""
    if asked == math.inf:
        return asked, NEVER.encode()
    kept = min(max(asked, low), high)
    text = b"%d" % kept if kept == int(kept) else repr(kept).encode()  # (never an exponent: 1000000, not 1e+06)
    if kept == asked:
        return kept, text
    return kept, text + (b"; held to the minimum" if kept == low else b"; held to the maximum")


def taken(body: Body) -> tuple[Body, float | None]:
    """The seconds a JSON object's top-level ``keep_alive`` and ``ttl`` ask (both given: the
    longer; None when only a null was given), and the body without every member of either name, in one copy (the bounds of the
    alias rename: a name repeated past ``MAX_REPEATS`` is refused). The body is an object that
    has one of them (``jsonbody.Facts.keeps``)."""
    top = toplevel.scan(body, NAMES, every=True)
    if top.repeated:
        raise Refused(400, "invalid_request", f"the body repeats keep_alive or ttl more than {MAX_REPEATS} times")
    assert top.shape is Shape.OBJECT and top.members  # (the facts found one)
    asked: list[float] = []
    try:
        for name, read in (("keep_alive", seconds), ("ttl", ttl_seconds)):
            members = top.members.get(name)
            if members:
                value = read(_value(body, members[-1]))
                if value is not None:
                    asked.append(value)
    except BadKeepAlive as exc:
        raise Refused(400, "invalid_request", str(exc)) from None
    removed = [m for members in top.members.values() for m in members]
    return without(body, removed), max(asked, default=None)


def _value(body: Body, member: Member) -> Any:
    start, end = member.value
    try:
        return orjson.loads(body[start:end])
    except orjson.JSONDecodeError:
        raise BadKeepAlive("keep_alive and ttl must be valid JSON values") from None


def without(body: Body, removed: list[Member]) -> bytes:
    """``body`` less the ``removed`` members, with the separators they need no more."""
    return bodyparams.edited(body, [(start, end, b"") for start, end, _ in bodyparams.deletions(body, removed)])
