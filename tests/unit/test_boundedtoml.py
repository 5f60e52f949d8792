"""TOML read within bounds (dgxmm.boundedtoml): the scan refuses a key, a header, a nesting or a
count past its bound before ``tomllib`` sees the text, at once and with the line; it reads
strings and comments as ``tomllib`` does, so it never refuses a file within the bounds, whatever
its strings hold, and never misses structure after one."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgxmm import boundedtoml
from dgxmm.boundedtoml import MAX_BYTES, MAX_DEPTH, MAX_KEY_PARTS, MAX_KEYS, TomlError, loads
from dgxmm.settings import ConfigError, load_settings
from hostile.tomls import DEEP, KEYS, PARTS, SHAPES, dotted, nested

ROOT = Path(__file__).resolve().parents[2]


def refusal(text: str) -> TomlError:
    with pytest.raises(TomlError) as caught:
        loads(text)
    return caught.value


@pytest.mark.parametrize("name", list(SHAPES))
def test_every_hostile_shape_is_refused_at_once(name: str) -> None:
    text, words = SHAPES[name]
    began = time.thread_time()  # the work done, not the wall clock: the suite runs on busy machines too
    err = refusal(text)
    assert words in err.message, err.message
    assert time.thread_time() - began < 1.0  # (the dotted key took tomllib minutes and gigabytes of CPU)


@pytest.mark.parametrize(
    ("within", "past", "words"),
    [
        (dotted(MAX_KEY_PARTS) + " = 1", dotted(MAX_KEY_PARTS + 1) + " = 1", PARTS),
        ("[" + dotted(MAX_KEY_PARTS) + "]", "[" + dotted(MAX_KEY_PARTS + 1) + "]", PARTS),
        ("[[" + dotted(MAX_KEY_PARTS) + "]]", "[[" + dotted(MAX_KEY_PARTS + 1) + "]]", PARTS),
        ("x = {" + dotted(MAX_KEY_PARTS) + " = 1}", "x = {" + dotted(MAX_KEY_PARTS + 1) + " = 1}", PARTS),
        ("x = " + nested(MAX_DEPTH, "[", "]"), "x = " + nested(MAX_DEPTH + 1, "[", "]"), DEEP),
        ("x = " + nested(MAX_DEPTH, "{a=", "}"), "x = " + nested(MAX_DEPTH + 1, "{a=", "}"), DEEP),
        ("x = " + nested(MAX_DEPTH // 2, "[{a=", "}]"), "x = " + nested(MAX_DEPTH // 2, "[{a=", "}]", "[1]"), DEEP),
    ],
)
def test_the_bounds_are_exact_and_the_line_is_the_refused_ones(within: str, past: str, words: str) -> None:
    assert loads(f"b = 1\n{within}\n") is not None
    err = refusal(f"b = 1\n\n{past}\n")
    assert words in err.message and err.line == 3, err


def test_keys_and_tables_are_counted_inline_ones_too() -> None:
    keys = "".join(f"k{n} = 1\n" for n in range(MAX_KEYS - 3))  # and [t], x and y: MAX_KEYS
    assert len(loads(keys + "[t]\nx = {y = 1}\n")) == MAX_KEYS - 2
    err = refusal(keys + "[t]\nx = {y = 1, z = 2}\n")
    assert KEYS in err.message and err.line == MAX_KEYS - 1, err


def test_what_is_not_toml_is_refused_as_tomllib_says() -> None:
    err = refusal("a = 1\n[[deployments]\n")
    assert err.message.startswith("not TOML") and err.line == 2
    assert "4300 digits" in refusal("x = " + "9" * 5000).message  # tomllib's ValueError, not a crash


# Strings and comments holding what would be structure outside them: none of it counts.
LOOKALIKES = [
    'a = "' + "[" * 100 + '"',
    "a = '" + "{a=" * 100 + "'",
    'a = "' + dotted(100) + '"',
    '"' + dotted(100) + '" = 1',
    "'" + dotted(100) + "' = 1",
    "a . 'b.c.d' . \"e.f\" = 1",
    "# " + "[" * 100 + '\na = 1 # "unclosed ' + "{" * 50,
    'a = """\n' + "[" * 100 + '\n"""',
    'a = """x""""',  # a closing with two more quotes: its own (x")
    'a = """x"""""',
    'a = """ "" ""\\"""" ',
    'a = """\\\n   [[[[ """',  # a line-ending backslash
    "a = '''\n" + "]" * 100 + "\n'''",
    "a = '''x'' '''",
    "a = ''''x'''''",
    'a = "\\"' + "[" * 40 + '"',
    'a = "\\\\"\nb = "[[["',
    'a = ["]", "[", \'[\', """[""", \'\'\']\'\'\', # [\n "{" ]',
    'a = [ { b = "]" }, { c = "}" } ]',
    'a = {b = "{", "c.d.e.f.g.h.i.j.k" = "}"}',
    '["' + dotted(20) + '"]\nx = 1',
    "[[ 'a.b.c.d.e.f.g.h.i.j' ]]\nx = 1",
    "a = 1979-05-27T07:32:00Z\nb = 1979-05-27 07:32:00\nc = 1.5e10\nd = -inf\ne = 0x_ff",
    "a = 1\r\nb = [\r\n  1,\r\n]\r\n",
]


@pytest.mark.parametrize("text", LOOKALIKES)
def test_strings_and_comments_are_read_as_tomllib_reads_them(text: str) -> None:
    import tomllib

    try:
        expected: Any = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        expected = None
    if expected is None:
        assert refusal(text).message.startswith("not TOML")
    else:
        assert loads(text) == expected
        deeper = text + "\nzz = " + nested(MAX_DEPTH + 1, "[", "]")
        assert DEEP in refusal(deeper).message  # and what follows them is still seen


def repository_tomls() -> list[Path]:
    """The repository's own TOML files (not a virtual environment's, a build's or a cache's)."""
    found = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "build", "test-output")]
        found += [Path(folder) / name for name in names if name.endswith(".toml")]
    return found


def test_every_toml_file_of_the_repository_passes() -> None:
    files = repository_tomls()
    docs = [
        block for md in (ROOT / "docs").glob("*.md") for block in re.findall(r"```toml\n(.*?)```", md.read_text(), re.S)
    ]
    assert len(files) >= 3 and len(docs) >= 3
    for text in [p.read_text() for p in files] + docs:
        boundedtoml.scan(text)


def test_the_config_file_is_read_within_the_same_bounds(tmp_path: Path) -> None:
    config = tmp_path / "dgxmm.toml"
    for text, words in [SHAPES["a dotted key of 100,000 parts (issue 47)"], SHAPES["arrays 200,000 deep (issue 47)"]]:
        config.write_text("[server]\nport = 8090\n" + text)
        with pytest.raises(ConfigError) as caught:
            load_settings(config)
        assert str(caught.value).startswith(f"config error: {config}:3: ") and words in str(caught.value)
    config.write_text("#" * (MAX_BYTES + 1))
    with pytest.raises(ConfigError, match=f"larger than {MAX_BYTES} bytes"):
        load_settings(config)


# Generated documents: keys of up to MAX_KEY_PARTS parts and values nested up to MAX_DEPTH, whose
# strings hold anything, above all TOML's own marks, in each of TOML's four kinds of string.
TEXT = st.text(
    st.sampled_from(list("[]{}.=,\"'#\\\n\r\t a\u00e9\u2603\x7f")) | st.characters(exclude_categories=("Cs",))
)


def basic(text: str, multiline: bool = False) -> str:
    kept = "\n" if multiline else ""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif (ord(char) < 0x20 or char == "\x7f") and char not in kept:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    body = "".join(out)
    if multiline:
        return '"""' + ("\\n" + body[1:] if body.startswith("\n") else body) + '"""'
    return '"' + body + '"'


def string(text: str, kind: int) -> str:
    plain = not any(ord(c) < 0x20 and c != "\t" or c == "\x7f" for c in text.replace("\n", ""))
    if kind == 1 and plain and "'" not in text and "\n" not in text:
        return "'" + text + "'"
    if kind == 2:
        return basic(text, multiline=True)
    if kind == 3 and plain and "'''" not in text and not text.startswith("\n") and "\r" not in text:
        return "'''" + text + "'''"
    return basic(text)


def key(text: str, kind: int) -> str:
    return text if re.fullmatch(r"[A-Za-z0-9_-]+", text) else string(text, kind % 2)


@st.composite
def values(draw: st.DrawFn, depth: int) -> tuple[str, Any]:
    """A value as TOML writes it and as it reads, nested at most ``depth`` more."""
    roll = draw(st.integers(0, 9)) if depth > 0 else 0
    if roll < 5:
        text = draw(TEXT)
        return string(text, draw(st.integers(0, 3))), text
    if roll < 7:
        items = draw(st.lists(values(depth - 1), max_size=3))
        sep = draw(st.sampled_from([", ", ",\n  # ]]] '\n", " ,"]))
        return "[" + sep.join(t for t, _ in items) + "]", [v for _, v in items]
    names = draw(st.lists(TEXT, max_size=3, unique=True))
    members = [(name, draw(values(depth - 1)), draw(st.integers(0, 1))) for name in names]
    body = ", ".join(f"{key(name, kind)} = {t}" for name, (t, _), kind in members)
    return "{" + body + "}", {name: v for name, (_, v), _ in members}


@st.composite
def documents(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    header = draw(st.lists(TEXT, max_size=MAX_KEY_PARTS))
    lines, data = [], {}
    table = data
    if header:
        lines.append("[" + ".".join(key(p, 0) for p in header) + "]")
        for part in header:
            table = table.setdefault(part, {})
    for index in range(draw(st.integers(1, 4))):
        parts = [f"k{index}", *draw(st.lists(TEXT, max_size=MAX_KEY_PARTS - 1))]
        wrap = draw(st.integers(0, MAX_DEPTH - 2))
        text, value = draw(values(2))
        text, value = "[" * wrap + text + "]" * wrap, _wrapped(value, wrap)
        lines.append(" . ".join(key(p, n) for n, p in enumerate(parts)) + " = " + text)
        place = table
        for part in parts[:-1]:
            place = place.setdefault(part, {})
        place[parts[-1]] = value
    return "\n".join(lines) + "\n", data


def _wrapped(value: Any, times: int) -> Any:
    for _ in range(times):
        value = [value]
    return value


@settings(max_examples=300, deadline=None)
@given(document=documents(), past=st.sampled_from(["key", "depth"]))
def test_a_generated_document_within_the_bounds_is_read_and_one_past_them_refused(
    document: tuple[str, dict[str, Any]], past: str
) -> None:
    text, data = document
    assert loads(text) == data
    line = text.count("\n") + 1
    if past == "key":
        err = refusal(text + dotted(MAX_KEY_PARTS + 1, "zz") + " = 1\n")
    else:
        err = refusal(text + "zz = " + nested(MAX_DEPTH + 1, "[", "]") + "\n")
    assert err.line == line and (PARTS if past == "key" else DEEP) in err.message
