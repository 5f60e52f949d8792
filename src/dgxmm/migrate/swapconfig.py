"""llama-swap's config file read as llama-swap reads it (its config.example.yaml at release v250),
within bounds: the file's size, the data it makes once YAML's aliases are followed, and the
length of every value macros expand to.

PyYAML's ``safe_load`` builds an alias as a second reference to one object, so a "billion laughs"
file of a few hundred bytes loads quickly into a structure that is billions of nodes once walked.
``load`` counts the nodes as a walk would see them (each object's count computed once) and
refuses past ``MAX_NODES`` before anything walks it. Expanding macros costs their count times the
values expanded, so both are bounded (``MAX_MACROS``, ``MAX_MODELS``), as is what they expand to,
one value and all of them together (``Budget``).

Macros follow llama-swap: ``${env.NAME}`` from the environment first, then ``${MODEL_ID}``, the
global ``macros`` with the model's own over them (a macro may use one declared before it), and
``${PORT}``, left for dgxmm to fill (``PORT`` below). A ``cmd`` loses its ``#`` comment lines
and its trailing backslashes, and is split as a POSIX shell would split it.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1024 * 1024  # a config larger than this is refused unread
MAX_NODES = 200_000  # values of the loaded config, aliases followed (real configs: a few thousand)
MAX_VALUE_CHARS = 65_536  # one value once macros are expanded
# All values of all models once expanded, together: twice the largest file dgxmm writes, and
# what Python's shlex splits in a few seconds.
MAX_EXPANDED_CHARS = 2 * 1024 * 1024
MAX_MACROS = 1024  # global and a model's own together (real configs: tens)
MAX_MODELS = 1000  # as many as dgxmm's declared files may hold together
# Collections inside collections (real configs: 5 or 6). Checked on the parser's events, before
# anything is built: how deep the loader's recursion may go depends on the process's stack.
MAX_DEPTH = 64
PORT = "${PORT}"  # left in place: dgxmm gives each engine its port
_MACRO = re.compile(r"\$\{([A-Za-z0-9_.-]+)\}")
_MACRO_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")


class ConfigProblem(Exception):
    """The file cannot be imported at all (the message says why)."""


class _TooDeep(Exception):
    pass


def _check_depth(data: bytes) -> None:
    """Refuse a document nesting collections past ``MAX_DEPTH``, read as the parser's events
    (nothing is built; the event parser keeps its own stack, not Python's)."""
    depth = 0
    for event in yaml.parse(data, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _TooDeep
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def load(path: Path) -> dict[str, Any]:
    """The config's top-level mapping, within the bounds above (blocking)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigProblem(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise ConfigProblem(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        _check_depth(data)
        loaded = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise ConfigProblem(f"{path}: not YAML: {exc}") from None
    except _TooDeep:
        raise ConfigProblem(f"{path}: nested too deep (more than {MAX_DEPTH} levels)") from None
    if not isinstance(loaded, dict):
        raise ConfigProblem(f"{path}: not a llama-swap config (a mapping with models)")
    if _nodes(loaded, {}) > MAX_NODES:
        raise ConfigProblem(f"{path}: more than {MAX_NODES} values once its aliases are followed (an alias bomb?)")
    return loaded


def _nodes(value: Any, seen: dict[int, int]) -> int:
    """How many values a walk of ``value`` meets; each shared object counted once, then reused."""
    if not isinstance(value, (dict, list)):
        return 1
    known = seen.get(id(value))
    if known is not None:
        return known
    seen[id(value)] = MAX_NODES + 1  # (a cycle, which YAML may hold, is past any bound)
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    total = 1
    for item in items:
        total += _nodes(item, seen)
        if total > MAX_NODES:
            break
    seen[id(value)] = total
    return total


def macros_of(raw: Any, where: str) -> dict[str, str]:
    """A ``macros`` mapping as name -> text, in order; ``ConfigProblem`` for a bad name."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigProblem(f"{where}: macros must be a mapping")
    if len(raw) > MAX_MACROS:
        raise ConfigProblem(f"{where}: more than {MAX_MACROS} macros")
    found: dict[str, str] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not _MACRO_NAME.fullmatch(name) or name in ("PID", "PORT", "MODEL_ID"):
            raise ConfigProblem(f"{where}: {name!r} is not a macro name llama-swap accepts")
        if isinstance(value, (dict, list)) or value is None:
            raise ConfigProblem(f"{where}: macro {name!r} must be a string, a number or a bool")
        found[name] = _scalar(value)
    return found


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Budget:
    """What the expansions of one import may produce together."""

    def __init__(self, chars: int = MAX_EXPANDED_CHARS) -> None:
        self.left = chars

    def spend(self, text: str) -> str:
        self.left -= len(text)
        if self.left < 0:
            raise ConfigProblem(f"the values are longer than {MAX_EXPANDED_CHARS} characters together once expanded")
        return text


class Expander:
    """One model's macros: ``expand`` turns a value of that model into what llama-swap runs."""

    def __init__(
        self,
        model_id: str,
        macros: Mapping[str, str],
        env: Mapping[str, str] | None = None,
        budget: Budget | None = None,
    ) -> None:
        if len(macros) > MAX_MACROS:
            raise ConfigProblem(f"more than {MAX_MACROS} macros, global and the model's own together")
        self.model_id = model_id
        self.env = os.environ if env is None else env
        self.env_used: list[str] = []  # the variables whose values it wrote in, in order
        self.budget = budget or Budget()
        self.macros = {name: _MACRO.sub(self._env, value) for name, value in macros.items()}

    def expand(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {key: self.expand(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self.expand(item) for item in value]
        if isinstance(value, str):
            return self.text(value)
        return value

    def text(self, text: str) -> str:
        text = _MACRO.sub(self._env, text)
        values = {"MODEL_ID": self.model_id, **self.macros}
        # Later macros first, as llama-swap does: one using an earlier one is expanded by it after.
        for name in reversed(list(values)):
            text = text.replace("${" + name + "}", values[name])
            if len(text) > MAX_VALUE_CHARS:
                raise ConfigProblem(f"a value longer than {MAX_VALUE_CHARS} characters once macros are expanded")
        left = next((m[0] for m in _MACRO.finditer(text) if m[0] not in (PORT, "${PID}")), None)
        if left is not None:
            raise ConfigProblem(f"{left} is not a macro defined before it is used")
        return self.budget.spend(text)

    def _env(self, match: re.Match[str]) -> str:
        name = match[1]
        if not name.startswith("env."):
            return match[0]
        value = self.env.get(name[4:])
        if value is None:
            raise ConfigProblem(f"${{{name}}}: the environment variable {name[4:]} is not set")
        if name[4:] not in self.env_used:
            self.env_used.append(name[4:])
        return value


def strip_comments(cmd: str) -> str:
    """``cmd`` without its ``#`` comment lines: done before macros, which may span lines."""
    return "\n".join(line for line in cmd.split("\n") if not line.strip().startswith("#"))


def split_command(cmd: str) -> list[str]:
    """``cmd`` as llama-swap runs it: comment lines out, trailing backslashes joined, POSIX words."""
    lines = []
    for line in strip_comments(cmd).split("\n"):
        stripped = line.strip()
        lines.append(stripped[:-1] + " " if stripped.endswith("\\") else line)
    try:
        words = shlex.split("\n".join(lines))
    except ValueError as exc:
        raise ConfigProblem(f"cmd: {exc}") from None
    if not words:
        raise ConfigProblem("cmd: empty command")
    return words
