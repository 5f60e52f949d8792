"""``{port}``, ``{model}`` and ``{served_name}`` in engine commands and arguments.

Not ``str.format``: a format string can index (``{port[0]}``), reach attributes (``{port.x}``),
and pad to any width (``{port:>100000000}`` builds a 100 MB string). Here a placeholder is one of
the three names in braces, ``{{`` and ``}}`` are literal braces, and anything else in braces is
refused when the deployment is created, so launching it cannot fail.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

NAMES = ("port", "model", "served_name")
_TOKEN = re.compile(r"\{\{|\}\}|\{(port|model|served_name)\}|[{}]")


class BadPlaceholder(ValueError):
    pass


def check(part: str) -> None:
    """Raise BadPlaceholder unless every brace in ``part`` is a placeholder or doubled."""
    for match in _TOKEN.finditer(part):
        if match.group() in ("{", "}"):
            raise BadPlaceholder(
                f"{part[:80]!r}: only {{port}}, {{model}} and {{served_name}} may be used "
                "(write {{ and }} for literal braces)"
            )


def fill(part: str, values: Mapping[str, str]) -> str:
    """``part`` with its placeholders replaced (``check`` it first)."""

    def one(match: re.Match[str]) -> str:
        token = match.group()
        if token in ("{{", "}}"):
            return token[0]
        if match.group(1):
            return values[match.group(1)]
        raise BadPlaceholder(f"{part[:80]!r}: unmatched {token!r}")

    return _TOKEN.sub(one, part)
