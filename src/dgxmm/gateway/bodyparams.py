"""A deployment's request parameters (``request_defaults``, ``request_overrides``,
``strip_params``): what llama-swap's ``filters`` and Ollama's parameters layer do, applied to the
JSON body of a chat, completion or responses request before it is forwarded.

The body is rewritten as the alias rename rewrites ``model`` (``modelname.renamed``): the
top-level scan (``toplevel.scan`` with ``every``) says where each member of the names concerned
lies, with the separators around it, and only those members change; every other byte (numbers,
escapes, invalid UTF-8, white space) reaches the engine as it came, in one copy. A stripped name
loses every member of that name (a parser keeps the last of a repeated key: removing one would
bring an earlier one back); an override replaces the last member's value and removes the
others, or is added after the object's ``{``; a default is added only when no member has the
name. A body past ``jsonbody.FAST_BYTES`` is scanned and rewritten in a worker thread
(``Scans.reading``), so a 16 MiB body never stalls the loop. A body that is no JSON object is
forwarded as it is: the engine answers what it makes of it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dgxmm.front.body import Body
from dgxmm.gateway import toplevel
from dgxmm.gateway.refused import Refused
from dgxmm.gateway.scans import Scans
from dgxmm.gateway.toplevel import MAX_REPEATS, Member, Shape
from dgxmm.records.deployment import Deployment

ENDPOINTS = frozenset({"chat/completions", "completions", "responses"})
_OPEN = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\n\r]*\{")  # up to a JSON object's ``{``
_EMPTY = re.compile(rb"[ \t\n\r]*\}")  # from just past it, when the object has no member


@dataclass(frozen=True)
class Params:
    """A deployment's parameters with their values as JSON text (encoded once per request)."""

    defaults: dict[str, bytes]
    overrides: dict[str, bytes]
    strip: frozenset[str]

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self.defaults) | frozenset(self.overrides) | self.strip


def encoded(value: Any) -> bytes:
    """A value as compact JSON text (ASCII: valid in any body)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def params_of(dep: Deployment) -> Params | None:
    """``dep``'s parameters, or None when it sets none (the usual deployment: nothing to do)."""
    if not (dep.request_defaults or dep.request_overrides or dep.strip_params):
        return None
    return Params(
        {name: encoded(value) for name, value in dep.request_defaults.items()},
        {name: encoded(value) for name, value in dep.request_overrides.items()},
        frozenset(dep.strip_params),
    )


async def applied(scans: Scans, dep: Deployment, endpoint: str, body: Body) -> Body | None:
    """The body ``dep``'s engine gets for ``endpoint``, or None when it is the same (nothing
    set, another endpoint, no JSON object, nothing to change). A body that repeats one of the
    names more than ``MAX_REPEATS`` times is refused (400)."""
    if endpoint not in ENDPOINTS:
        return None
    params = params_of(dep)
    if params is None:
        return None
    return await scans.reading(body, lambda: rewritten(body, params))


def rewritten(body: Body, params: Params) -> Body | None:
    """``body`` with ``params`` applied, in one copy; None when nothing changes."""
    top = toplevel.scan(body, params.names, every=True)
    if top.shape is not Shape.OBJECT:
        return None
    if top.repeated:
        raise Refused(400, "invalid_request", f"the body repeats a parameter more than {MAX_REPEATS} times")
    found = top.members
    removed: list[Member] = [m for name in params.strip for m in found.get(name, ())]
    edits: list[tuple[int, int, bytes]] = []
    added: list[bytes] = []
    for name, value in params.overrides.items():
        members = found.get(name)
        if not members:
            added.append(_member(name, value))
            continue
        removed += members[:-1]
        edits.append((*members[-1].value, value))
    added += [_member(name, value) for name, value in params.defaults.items() if name not in found]
    emptied = False
    for start, end, empty in deletions(body, removed):
        edits.append((start, end, b""))
        emptied = emptied or empty
    if added:
        brace = _OPEN.match(body)
        assert brace is not None  # (an object: the scan found it)
        at = brace.end()
        empty = emptied or _EMPTY.match(body, at) is not None
        edits.append((at, at, b",".join(added) + (b"" if empty else b",")))
    return edited(body, edits) if edits else None


def edited(body: Body, edits: list[tuple[int, int, bytes]]) -> bytes:
    """``body`` with each ``(start, end, text)`` of ``edits`` (spans that do not overlap) in
    place of its bytes, in one copy."""
    edits.sort(key=lambda edit: (edit[0], edit[1]))
    view, cursor = memoryview(body), 0
    pieces: list[memoryview | bytes] = []
    for start, end, text in edits:
        pieces += (view[cursor:start], text)
        cursor = end
    pieces.append(view[cursor:])
    return b"".join(pieces)


def _member(name: str, value: bytes) -> bytes:
    return json.dumps(name).encode() + b":" + value


def deletions(body: Body, removed: Iterable[Member]) -> list[tuple[int, int, bool]]:
    """The spans that remove ``removed`` with the separators they need no more: each run of
    adjacent members from the separator before it (``P``) to the one after (``F``). Followed by
    a comma, the run goes with that comma; the object's last, with the comma before it; alone in
    the object, it leaves ``{}`` (True: the object is empty after)."""
    runs: list[tuple[int, int]] = []
    for member in sorted(set(removed), key=lambda m: m.before):
        if runs and runs[-1][1] == member.before:
            runs[-1] = (runs[-1][0], member.after)
        else:
            runs.append((member.before, member.after))
    spans = []
    for before, after in runs:
        if body[after] == ord(","):
            spans.append((before + 1, after + 1, False))
        elif body[before] == ord(","):
            spans.append((before, after, False))
        else:
            spans.append((before + 1, after, True))
    return spans
