"""Hostile declared files (issue 47, findings 3 and 4): each TOML shape a user who may write to
``deployments_dir`` can leave there, with the words dgxmm's refusal must contain. The unit tests
read them with the bounded reader, the hostile suite has a served dgxmm's watcher and
``GET /api/config/plan`` meet them, and ``make fuzz`` (corpus.py) replays them with ``toml_corpus``'s
seeded variations.

Every shape is at most ``dgxmm.boundedtoml.MAX_BYTES``: the file bound alone did not bound them.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from dgxmm.boundedtoml import MAX_BYTES, MAX_DEPTH, MAX_KEY_PARTS, MAX_KEYS
from hostile.corpus import Replayed

if TYPE_CHECKING:
    from served import Served

VALID = (
    '[[deployments]]\nname = "declared-ok"\nengine = "command"\ncommand = ["x"]\nmemory_gib = 1\nmode = "on_demand"\n'
)
PARTS = f"more than {MAX_KEY_PARTS} parts"
DEEP = f"nested more than {MAX_DEPTH} deep"
KEYS = f"more than {MAX_KEYS} keys"
NOT_TOML = "not TOML"


def dotted(parts: int, part: str = "a", sep: str = ".") -> str:
    return sep.join([part] * parts)


def nested(depth: int, opening: str, closing: str, inner: str = "1") -> str:
    return opening * depth + inner + closing * depth


def _numbered(line: str, count: int) -> str:
    return "".join(line.format(n) for n in range(count))


# name: (text, the words of its refusal)
SHAPES: dict[str, tuple[str, str]] = {
    "a dotted key of 100,000 parts (issue 47)": (dotted(100_000) + " = 1\n", PARTS),
    "arrays 200,000 deep (issue 47)": ("x = " + nested(200_000, "[", "]") + "\n", DEEP),
    "inline tables 200,000 deep (issue 47)": ("x = " + nested(200_000, "{a=", "}") + "\n", DEEP),
    "arrays and inline tables 100,000 deep": ("x = " + nested(100_000, "[{a=", "}]") + "\n", DEEP),
    "a table header of 100,000 parts": ("[" + dotted(100_000) + "]\n", PARTS),
    "an array of tables header of 100,000 parts": ("[[" + dotted(100_000) + "]]\n", PARTS),
    "quoted parts": (dotted(50_000, '"a.b"', " . ") + " = 1\n", PARTS),
    "a dotted key inside an inline table": ("x = { " + dotted(100_000) + " = 1 }\n", PARTS),
    "a dotted key in a deployments table": (VALID + "env." + dotted(MAX_KEY_PARTS) + ' = "x"\n', PARTS),
    "nesting after a valid table": (VALID + "args = " + nested(MAX_DEPTH + 1, "[", "]", '"a"') + "\n", DEEP),
    "nesting behind strings that look like it": (
        "a = \"[[[[{{{{\"\nb = '''\n]]]]\n'''\n# [[[[[\nx = " + nested(10_000, "[", "]") + "\n",
        DEEP,
    ),
    "60,000 tables": (_numbered("[t{}]\n", 60_000), KEYS),
    "60,000 keys with arrays": (_numbered("k{} = []\n", 60_000), KEYS),
    "60,000 keys of an inline table": ("x = {" + _numbered("k{} = 1, ", 60_000) + "z = 1}\n", KEYS),
    "an integer of 5,000 digits": ("x = " + "1" * 5000 + "\n", NOT_TOML),
    "an unterminated string before deep nesting": ('x = "abc\ny = ' + nested(100_000, "[", "]") + "\n", DEEP),
}
assert all(len(text.encode()) <= MAX_BYTES for text, _ in SHAPES.values())


def toml_corpus(seed: int, count: int) -> Iterator[tuple[str, str, str]]:
    """The shapes, then ``count`` seeded variations: a key, a header or a nesting of a random
    size past the bounds, after a random valid prefix, with its parts or brackets spelt in the
    ways TOML allows; each as (name, text, the words of its refusal)."""
    yield from ((name, text, words) for name, (text, words) in SHAPES.items())
    rng = random.Random(seed)
    prefixes = ["", VALID, "# a comment [[[\n", 'a = "x.y.z"\n', "[server]\nport = 1\n", "\r\n"]
    for index in range(count):
        prefix = rng.choice(prefixes)
        size = rng.choice([MAX_KEY_PARTS + 1, 100, 10_000, 100_000])
        depth = rng.choice([MAX_DEPTH + 1, 1000, 100_000])
        part = rng.choice(["a", '"q"', "'l'", "1", "-_"])
        sep = rng.choice([".", " . ", "\t.\t"])
        kind = rng.randrange(5)
        if kind == 0:
            text, words = prefix + dotted(size, part, sep) + " = 1\n", PARTS
        elif kind == 1:
            text, words = prefix + rng.choice(["[", "[["]) + dotted(size, part, sep) + "]]\n", PARTS
        elif kind == 2:
            opening, closing = rng.choice([("[", "]"), ("{a=", "}"), ("[ {b = ", "} ]"), ("[\n", "\n]")])
            text, words = prefix + "x = " + nested(depth, opening, closing) + "\n", DEEP
        elif kind == 3:
            text, words = prefix + "x = [ { " + dotted(size, part, sep) + " = 1 } ]\n", PARTS
        else:
            text, words = prefix + _numbered("k{} = {{}}\n", MAX_KEYS + rng.randrange(1, 1000)), KEYS
        yield f"variation {index} of seed {seed} (kind {kind})", text[:MAX_BYTES], words


TOML_SECONDS = 2.0


def replay_tomls(served: Served, folder: Path, files: Iterator[tuple[str, str, str]]) -> Replayed:
    """Write each declared file into the watched ``folder`` (under a name of its own, so no
    reading of a previous one can stand for it) and ask ``GET /api/config/plan``: anything but a
    refusal naming the file, with the shape's words, within ``TOML_SECONDS`` is a fault. The
    watcher meets each too. The folder is left empty."""
    result, began = Replayed(), time.monotonic()
    previous: Path | None = None
    with served.admin() as admin:
        for index, (name, text, words) in enumerate(files):
            path = folder / f"fuzz-{index:06d}.toml"
            path.with_suffix(".part").write_text(text)
            os.replace(path.with_suffix(".part"), path)
            if previous is not None:
                previous.unlink()
            previous = path
            sent = time.monotonic()
            resp = admin.get("/config/plan")
            took = time.monotonic() - sent
            result.statuses[resp.status_code] += 1
            error = resp.json().get("error") if resp.status_code == 200 else None
            refused = error is not None and error["file"] == str(path) and words in error["message"]
            if not refused or took > TOML_SECONDS:
                result.server_errors.append(f"{name}: {resp.status_code} in {took:.2f} s: {resp.text[:200]}")
    if previous is not None:
        previous.unlink()
    result.seconds = time.monotonic() - began
    return result
