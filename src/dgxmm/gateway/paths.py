"""Path checks of the gateway: the raw request path must be plain segments, nothing to smuggle.

A ``.``, ``..`` or empty segment, ``\\``, ``?``, ``#``, a control or invisible formatting
character (C0 and C1 controls, bidi overrides and isolates, zero-width characters, line and
paragraph separators: Unicode categories Cc, Cf, Zl, Zp), or an encoded ``/``, ``\\``, ``#``,
``?`` or NUL makes the path invalid (400 invalid_path). What remains is rebuilt from its segments
for the upstream URL, so the engine sees exactly what was checked. (A raw ``#`` never gets here:
the server refuses it, see dgxmm/front/protocol.py.)
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from urllib.parse import quote, unquote

_ENCODED_FORBIDDEN = re.compile(r"%(2f|5c|23|3f|00)", re.IGNORECASE)
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp"})


class InvalidPath(Exception):
    pass


def under(path: str, prefix: str) -> bool:
    """Whether ``path`` (percent-decoded) is ``prefix`` or below it: ``/v1`` and ``/v1/models``
    are under ``/v1``, ``/v1x`` is not. The one test of "is this the gateway's or the router's
    path", for the outermost app (``asgi``) and the router alike."""
    return path.startswith(prefix) and (len(path) == len(prefix) or path[len(prefix)] == "/")


def segments(raw_path: bytes, prefix: str) -> list[str]:
    """The decoded segments of ``raw_path`` after ``prefix``; raises InvalidPath."""
    try:
        text = raw_path.decode("ascii")
    except UnicodeDecodeError:
        raise InvalidPath("the path must be ASCII (percent-encode the rest)") from None
    if not text.startswith(prefix + "/"):
        raise InvalidPath("the path is not under the gateway")
    parts = text[len(prefix) + 1 :].split("/")
    out = []
    for part in parts:
        if _ENCODED_FORBIDDEN.search(part):
            raise InvalidPath("encoded '/', '\\', '#', '?' or NUL in the path")
        try:
            decoded = unquote(part, errors="strict")
        except UnicodeDecodeError:
            raise InvalidPath("percent-encoding that is not UTF-8 in the path") from None
        if decoded in ("", ".", ".."):
            raise InvalidPath("empty, '.' or '..' segment in the path")
        if any(ch in decoded for ch in "\\?#") or any(unicodedata.category(ch) in _HIDDEN for ch in decoded):
            raise InvalidPath("'\\', '?', '#' or a control or invisible character in the path")
        out.append(decoded)
    return out


def upstream_path(parts: Sequence[str]) -> str:
    """The checked segments, encoded again, as the path sent to the engine."""
    return "/" + "/".join(quote(part, safe="-._~:@!$&'()*+,;=") for part in parts)
