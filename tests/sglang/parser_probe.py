"""Run with SGLang's Python: build the argument parser ``sglang.launch_server`` builds, check
command lines against it, and print the result as one JSON line; nothing is served.

``python parser_probe.py < checks.json``, where checks.json is a list of argument lists (what
follows ``python -m sglang.launch_server``). The parser is made as ``prepare_server_args`` makes it
(``ServerArgs.add_cli_args`` on a plain ``argparse`` parser); the checks stop before
``ServerArgs.from_cli_args``, which looks for a device and the model. A flag the parser does not
know ends that parse with argparse's error, which is reported.

Output: ``PROBE {"allow_abbrev": bool, "options": [...], "results": [{"ok": bool, "error": [str],
"values": {...}}, ...]}``. Kept free of project imports.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return str(value)


def main() -> None:
    from sglang.srt.server_args import ServerArgs

    checks: list[list[str]] = json.load(sys.stdin)
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    results = []
    for argv in checks:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                parsed = parser.parse_args(argv)
        except SystemExit:
            results.append({"ok": False, "error": err.getvalue().strip().splitlines()[-1:]})
            continue
        results.append({"ok": True, "values": {k: _plain(v) for k, v in vars(parsed).items()}})
    options = sorted({opt for action in parser._actions for opt in action.option_strings})
    print("PROBE " + json.dumps({"allow_abbrev": parser.allow_abbrev, "options": options, "results": results}))


if __name__ == "__main__":
    main()
