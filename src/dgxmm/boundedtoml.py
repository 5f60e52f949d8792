"""TOML read within bounds: the config file and the declared deployments' files.

Python's ``tomllib`` is not bounded by a file's size. One dotted key of 100,000 parts (a 200 KB
file) takes it minutes and gigabytes, because each part walks the key's path again (quadratic);
arrays or inline tables nested a thousand deep end in a ``RecursionError``; a table or a key
per line costs it most of a kilobyte each in bookkeeping. So a text is scanned first, in one
linear pass that reads TOML's strings and comments as the parser does, and refused before the
parser sees it when a key or a table header has more than ``MAX_KEY_PARTS`` parts, arrays and
inline tables nest more than ``MAX_DEPTH`` deep, or it holds more than ``MAX_KEYS`` keys and
table headers. Within them (and ``MAX_BYTES``) the parser's time and memory follow the size.

The scan checks nothing else: it needs to read a text as the parser does only as far as the
parser's first error, since the parser stops there. Whatever follows a point where they could
differ (an unterminated string, a character no TOML has there) is never parsed.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

MAX_BYTES = 1024 * 1024  # a file larger than this is refused unread
MAX_KEY_PARTS = 8  # parts of one key (``a.b.c``) or table header (``[a.b.c]``)
MAX_DEPTH = 32  # arrays and inline tables, one inside the other
MAX_KEYS = 50_000  # keys (inline tables' too) and table headers in one file

_TOML_LINE = re.compile(r"at line (\d+)")
# One token of TOML: the strings first (a multi-line one ends at its first unescaped closing
# quotes, which may be followed by one or two more that are its own), then what else matters.
# Possessive repeats: an unterminated string costs one pass, never backtracking.
_STRING = r"""
    \"\"\"(?:[^"\\]++|\\[\s\S]|"(?!""))*+\"\"\"(?:"{0,2})
  | '''(?:[^']++|'(?!''))*+'''(?:'{0,2})
  | "(?:[^"\\\n]++|\\[^\n])*+"?
  | '[^'\n]*+'?
"""
_TOKEN = re.compile(
    rf"""
    (?P<skip>[ \t]++|\#[^\n]*+)
  | (?P<newline>\n)
  | (?P<string>{_STRING})
  | (?P<mark>[\[\]{{}}=,.])
  | (?P<bare>[^ \t\n\#"'\[\]{{}}=,.]++)
""",
    re.X,
)
# Inside an array, all but another array or inline table and its end: values, commas, newlines
# and comments, skipped in one match (a single-line string only when it is not a multi-line one).
_IN_ARRAY = re.compile(r"""(?:[^\[\]{}"'\#]++|"(?!"")(?:[^"\\\n]++|\\[^\n])*+"|'(?!'')[^'\n]*+'|\#[^\n]*+)++""")

_START, _KEY, _HEADER, _VALUE, _DONE = range(5)  # where the scan is in a statement


class TomlError(Exception):
    """A text that is not TOML, or that is past the bounds; ``line`` where, when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        self.message, self.line = message, line
        super().__init__(message)


def read_text(path: Path) -> str:
    """The file's text, at most ``MAX_BYTES``, UTF-8 (blocking; ``OSError`` as it comes)."""
    with path.open("rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise TomlError(f"larger than {MAX_BYTES} bytes")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise TomlError("not UTF-8 text") from None


def loads(text: str) -> dict[str, Any]:
    """``tomllib.loads`` of a text that ``scan`` passed; every refusal a ``TomlError``."""
    scan(text)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = _TOML_LINE.search(str(exc))
        raise TomlError(f"not TOML: {exc}", int(found[1]) if found else None) from None
    except (RecursionError, ValueError) as exc:  # (an integer of more than 4,300 digits: ValueError)
        raise TomlError(f"not TOML: {exc}") from None


def scan(text: str) -> None:
    """Raise ``TomlError`` at the first key, header, nesting or count past the bounds (linear)."""
    nested: list[str] = []  # the open arrays and inline tables, innermost last
    state, parts, keys = _START, 0, 0
    pos, end = 0, len(text)
    while pos < end:
        if nested and nested[-1] == "[" and state == _VALUE:
            skipped = _IN_ARRAY.match(text, pos)
            if skipped is not None:
                pos = skipped.end()
                continue
        token = _TOKEN.match(text, pos)
        assert token is not None  # (every character starts a token: the last kind takes the rest)
        pos, kind, mark, at = token.end(), token.lastgroup, token.group(), token.start()
        if kind == "skip":
            continue
        if kind == "newline":
            if not nested:  # (a newline inside an array is a space; inside an inline table, not TOML)
                state, parts = _START, 0
            continue
        if state in (_START, _KEY) and kind in ("string", "bare"):  # a key's part
            state, parts = _KEY, parts + 1
        elif state == _START and mark == "[":  # a table header, ``[[`` an array of tables'
            state = _HEADER
        elif state == _HEADER and kind in ("string", "bare"):
            parts += 1
        elif state in (_KEY, _HEADER) and mark == "." or state == _HEADER and mark == "[" and not parts:
            continue
        elif state == _KEY and mark == "=" or state == _HEADER and mark == "]":  # the key or header ends
            keys += 1
            if keys > MAX_KEYS:
                raise TomlError(f"more than {MAX_KEYS} keys and tables", _line(text, at))
            state, parts = (_VALUE if mark == "=" else _DONE), 0
        elif state == _VALUE and mark in ("[", "{"):
            nested.append(mark)
            if len(nested) > MAX_DEPTH:
                raise TomlError(f"arrays and inline tables nested more than {MAX_DEPTH} deep", _line(text, at))
            state = _VALUE if mark == "[" else _KEY
        elif nested and (state == _VALUE and mark in ("]", "}") or state == _KEY and mark == "}" and not parts):
            nested.pop()
            state = _VALUE if nested else _DONE
        elif state == _VALUE and mark == "," and nested[-1:] == ["{"]:  # an inline table's next key
            state, parts = _KEY, 0
        elif state != _VALUE:  # (a value's own tokens: nothing to count)
            state = _DONE  # not TOML: the parser stops at or before this point
        if parts > MAX_KEY_PARTS:
            raise TomlError(f"a key or table header of more than {MAX_KEY_PARTS} parts", _line(text, at))


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1
