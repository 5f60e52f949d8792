"""Run with vLLM's Python: read the argument parser of the entry point dgxmm starts, check
command lines against it, and print the result as one JSON line; nothing is served.

``python parser_probe.py < checks.json``, where checks.json is a list of argument lists (what
follows ``python -m vllm.entrypoints.openai.api_server``). The probe runs that module as
``__main__``, as dgxmm does, and stops it at its first ``parse_args`` call: so the parser is the
one the server really builds, wherever a vLLM release keeps it. Each argument list is parsed; a
flag the parser does not know ends that parse with argparse's error, which is reported.

Output: ``PROBE {"allow_abbrev": bool, "options": [...], "results": [{"ok": bool,
"error": str, "values": {...}}, ...]}``. Kept free of project imports.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
from typing import Any


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return str(value)


def main() -> None:
    checks: list[list[str]] = json.load(sys.stdin)
    from vllm.utils import argparse_utils

    original = argparse_utils.FlexibleArgumentParser.parse_args

    def probe(parser: Any, args: Any = None, namespace: Any = None) -> Any:
        if parser._subparsers is not None:  # a command's parent parser: not the server's own
            return original(parser, args, namespace)
        results = []
        for argv in checks:
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err):
                    parsed = original(parser, argv)
            except SystemExit:
                results.append({"ok": False, "error": err.getvalue().strip().splitlines()[-1:]})
                continue
            results.append({"ok": True, "values": {k: _plain(v) for k, v in vars(parsed).items()}})
        options = sorted({opt for action in parser._actions for opt in action.option_strings})
        report = {"allow_abbrev": parser.allow_abbrev, "options": options, "results": results}
        print("PROBE " + json.dumps(report), flush=True)
        raise SystemExit(0)

    argparse_utils.FlexibleArgumentParser.parse_args = probe  # type: ignore[method-assign]
    sys.argv = ["api_server"]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__")
    raise SystemExit("the entry point never parsed its arguments")


if __name__ == "__main__":
    main()
